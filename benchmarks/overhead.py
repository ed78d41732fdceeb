"""Per-turn overhead of agent_fsm against a bare hand-written async loop doing the same work.

Each turn: one instant model call that returns one tool call with distinct arguments (so
loop detection stays quiet), argument parsing, the tool call, and the transcript append.
agent_fsm additionally runs JSON Schema validation, the guards and four transitions per turn,
and delivers every event to a subscriber. structlog is configured at INFO, as a production
application would (the per-transition debug lines are filtered out).

Targets: <= 60 µs per turn at 100 turns; per-turn cost at 1,000 turns within 1.2x of 10.

    python benchmarks/overhead.py [--repeat N]

Each size is run ``--repeat`` times and the median is shown. The default is 21 because a
100-turn run lasts about 5 ms: a handful of samples can all fall inside one burst of noise
from the machine (on a shared VM the bare loop slows by the same bursts), and more samples
make the median describe the code rather than the burst.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import statistics
import time
from typing import Any

import structlog

from agent_fsm import Agent, Limits, StopReason, tool
from agent_fsm.events import Event
from agent_fsm.messages import ModelResponse, ToolCall
from agent_fsm.testing import ScriptedModel, reply

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))


@tool
async def step(n: int) -> int:
    """Return n + 1."""
    return n + 1


def _script(turns: int) -> list[ModelResponse | str]:
    calls = [ToolCall(id=f"call_{i}", name="step", arguments=f'{{"n": {i}}}') for i in range(turns)]
    return [reply("", c, usage=(10, 2)) for c in calls] + ["done"]


async def _agent_fsm(turns: int) -> float:
    events = 0

    def count(event: Event) -> None:
        nonlocal events
        events += 1

    agent = Agent(
        model=ScriptedModel(_script(turns)),
        tools=[step],
        limits=Limits(max_turns=turns + 1, token_budget=10**9),
    )
    agent = agent.subscribe(count)
    started = time.perf_counter()
    result = await agent.run("go")
    elapsed = time.perf_counter() - started
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert events > 8 * turns
    return elapsed / (turns + 1)


async def _bare(turns: int) -> float:
    """The same work with none of the machinery: what a hand-written while-loop costs."""
    script = _script(turns)
    tools: dict[str, Any] = {"step": step.fn}
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]

    async def model(index: int) -> ModelResponse:
        item = script[index]
        return item if isinstance(item, ModelResponse) else reply(item)

    started = time.perf_counter()
    index = 0
    while True:
        response = await model(index)
        index += 1
        message = response.message
        messages.append({"role": "assistant", "content": message.content})
        if not message.tool_calls:
            break
        for tool_call in message.tool_calls:
            output = await tools[tool_call.name](**json.loads(tool_call.arguments))
            messages.append({"role": "tool", "id": tool_call.id, "content": str(output)})
    return (time.perf_counter() - started) / (turns + 1)


def _measure(fn: Any, turns: int, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        gc.collect()
        samples.append(asyncio.run(fn(turns)))
    return statistics.median(samples) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=21, help="runs per size (median is shown)")
    args = parser.parse_args()
    asyncio.run(_agent_fsm(20))  # warm-up: imports, machine construction, caches
    rows = []
    for turns in (10, 100, 1000):
        ours = _measure(_agent_fsm, turns, args.repeat)
        bare = _measure(_bare, turns, args.repeat)
        rows.append((turns, ours, bare))
    print(f"{'turns':>6} {'agent_fsm µs/turn':>18} {'bare loop µs/turn':>18} {'ratio':>7}")
    for turns, ours, bare in rows:
        print(f"{turns:>6} {ours:>18.1f} {bare:>18.1f} {ours / bare:>7.1f}")
    at_100 = rows[1][1]
    growth = rows[2][1] / rows[0][1]
    print(
        f"\nat 100 turns: {at_100:.1f} µs/turn (target <= 60) -> {'OK' if at_100 <= 60 else 'MISS'}"
    )
    print(
        f"1,000 vs 10 turns: {growth:.2f}x per turn (target <= 1.2) -> "
        f"{'OK' if growth <= 1.2 else 'MISS'}"
    )


if __name__ == "__main__":
    main()
