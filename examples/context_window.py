"""A long-running agent whose tool returns large outputs stays inside a small context window.

Twenty turns of a log reader whose every result is about 2,000 tokens: with no window, the
prompt grows to ~40,000 tokens, which a server with a 4,096-token context would refuse with a
400. Given that window and no policy, the run stops with ``context_window`` before the call
that would not fit. With two policies (clear old tool results, keep the last four turns) every
prompt stays inside the window and the run finishes.

python examples/context_window.py
"""

from __future__ import annotations

import argparse

from agent_fsm import (
    Agent,
    ClearToolResults,
    ContextPolicy,
    KeepLastTurns,
    Limits,
    StopReason,
    tool,
)
from agent_fsm.events import ContextCompacted, Event, ModelRequested
from agent_fsm.testing import ScriptedModel, call, reply

TURNS = 20
WINDOW = 4_096


@tool
def read_log(part: int) -> str:
    """Read one part of the server log (about 8,000 characters)."""
    lines = (f"{part:03d}-{n:04d} GET /api/items/{n} 200 {n % 97} ms" for n in range(250))
    return "\n".join(lines)


def log_reader() -> ScriptedModel:
    """A model that reads TURNS parts of the log, then answers."""
    turns = [reply(f"Reading part {p}.", call("read_log", part=p)) for p in range(TURNS)]
    return ScriptedModel([*turns, "No request took longer than 96 ms."])


def run(window: int | None, policies: list[ContextPolicy]) -> tuple[StopReason, list[int], int]:
    """One run; its stop reason, the estimated prompt tokens of each call, and compactions."""
    sent: list[int] = []
    compactions = 0

    def watch(event: Event) -> None:
        nonlocal compactions
        if isinstance(event, ModelRequested):
            sent.append(event.estimated_prompt_tokens)
        elif isinstance(event, ContextCompacted):
            compactions += 1

    agent = Agent(
        model=log_reader(),
        tools=[read_log],
        limits=Limits(
            max_turns=TURNS + 1, token_budget=1_000_000, context_window=window, reply_tokens=512
        ),
        context_policy=policies,
    ).subscribe(watch)
    result = agent.run_sync("Find the slowest request in the log.")
    return result.stop_reason, sent, compactions


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    stop, sent, _ = run(None, [])
    print(f"no window: {stop.value} after {len(sent)} calls")
    print(
        f"  prompt tokens per call: max {max(sent)}, mean {sum(sent) // len(sent)}, all {sum(sent)}"
    )
    assert max(sent) > WINDOW  # the prompts a real server with this window would refuse

    stop, sent, _ = run(WINDOW, [])
    print(f"window {WINDOW}, no policy: {stop.value} after {len(sent)} calls")
    assert stop is StopReason.CONTEXT_WINDOW  # before the call that would not fit

    stop, sent, compactions = run(WINDOW, [ClearToolResults(keep_last_turns=1), KeepLastTurns(4)])
    print(
        f"window {WINDOW}, policies: {stop.value} after {len(sent)} calls,"
        f" {compactions} compactions"
    )
    print(
        f"  prompt tokens per call: max {max(sent)}, mean {sum(sent) // len(sent)}, all {sum(sent)}"
    )
    assert stop is StopReason.FINAL_ANSWER
    assert max(sent) + 512 <= WINDOW


if __name__ == "__main__":
    main()
