"""The process that tests/test_sub_agents_crash.py kills: a parent run whose sub-agent is
killed mid-call.

``python -m tests.nested_crash_child LOG DB`` starts run ``parent`` of ``build(DB, LOG,
hang=True)`` on a SQLite store. Its sub-agent's one tool, ``append_line`` (not idempotent),
appends a line to LOG (the side effect that must never happen twice), prints ``effect``,
and then hangs, so the test kills the process while the child's call is in flight. The
models are functions of the transcript, so a new process (or the test itself) goes on with
the same conversation.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from agent_fsm import Agent, Limits, SQLiteStore, tool
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage
from agent_fsm.testing import FunctionModel, call, reply


def build(db: Path, log: Path, *, hang: bool) -> Agent:
    @tool
    async def append_line(text: str) -> str:
        """Append a line to the log file."""
        with log.open("a") as handle:
            handle.write(text + "\n")
        print("effect", flush=True)
        if hang:
            await asyncio.sleep(3600)
        return f"appended {text!r}"

    def worker(request: ModelRequest) -> ModelResponse | str:
        answers = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not answers:
            return reply("", call("append_line", text="child effect"))
        return f"child done: {answers[-1].content}"

    def boss(request: ModelRequest) -> ModelResponse | str:
        answers = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not answers:
            return reply("", call("work", task="append the line"))
        return f"parent done: {answers[-1].content}"

    child = Agent(model=FunctionModel(worker, name="worker"), tools=[append_line])
    return Agent(
        model=FunctionModel(boss, name="boss"),
        tools=[child.as_tool(name="work", description="Does the work.")],
        limits=Limits(max_turns=8, loop_detection=False),
        store=SQLiteStore(db),
    )


async def main(log: str, db: str) -> int:
    await build(Path(db), Path(log), hang=True).run("Do it.", run_id="parent")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(*sys.argv[1:])))
