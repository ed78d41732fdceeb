"""The process that tests/test_crash.py kills: one durable agent run on a shared store.

``python -m tests.crash_child LOG RUN_ID KIND LOCATION...`` starts the run, or resumes it when
the store (``tests.stores.open_location(KIND, *LOCATION)``: a SQLite file, or a PostgreSQL
URL and schema) already holds it. The agent makes ``STEPS`` tool turns, each calling two
tools in one reply:

- ``append_line`` (not idempotent) appends ``step N`` to LOG: the visible side effect that
  must never happen twice;
- ``lookup`` (idempotent) returns a computed value; it may run again after a crash.

The model is a function of the transcript (how many tool turns it already made), so a
resumed process continues the same conversation. Small sleeps spread the work out so that
kills land in every state. Prints ``ready`` once the run is about to start.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from agent_fsm import Agent, Limits, RunResult, tool
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.messages import AssistantMessage, ModelRequest, ModelResponse
from agent_fsm.table import TERMINAL_STATES
from agent_fsm.testing import FunctionModel, call, reply
from tests.stores import open_location

STEPS = 5
PAUSE_S = 0.004


def build_agent(store: CheckpointStore, log: Path) -> Agent:
    @tool
    def append_line(text: str) -> str:
        """Append a line to the log file."""
        time.sleep(PAUSE_S)
        with log.open("a") as handle:
            handle.write(text + "\n")
            handle.flush()
        time.sleep(PAUSE_S)
        return f"appended {text!r}"

    @tool(idempotent=True)
    def lookup(key: int) -> int:
        """Look a value up."""
        time.sleep(PAUSE_S)
        return key * key

    async def model(request: ModelRequest) -> ModelResponse:
        await asyncio.sleep(PAUSE_S)
        made = sum(1 for m in request.messages if isinstance(m, AssistantMessage) and m.tool_calls)
        if made >= STEPS:
            return reply("done")
        step = made + 1
        return reply("", call("append_line", text=f"step {step}"), call("lookup", key=step))

    return Agent(
        model=FunctionModel(model),
        tools=[append_line, lookup],
        limits=Limits(max_turns=4 * STEPS, loop_detection=False),
        store=store,
    )


async def main(log: str, run_id: str, kind: str, *location: str) -> int:
    agent = build_agent(open_location(kind, *location), Path(log))
    print("ready", flush=True)
    if agent.checkpoints.exists(run_id):
        state = agent.checkpoints.load(run_id)
        if state.state in TERMINAL_STATES:  # killed after its last checkpoint
            result = RunResult.from_state(state)
        else:
            result = await agent.resume(run_id)
    else:
        result = await agent.run("Do the steps.", run_id=run_id)
    print(result.status.value, result.stop_reason.value, flush=True)
    return 0 if result.output == "done" else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:])))
