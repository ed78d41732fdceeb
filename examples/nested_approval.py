"""A sub-agent that needs a person's approval pauses the whole tree, durably.

python examples/nested_approval.py

The travel agent delegates booking to a booking agent (``as_tool``), whose ``book`` tool
needs approval. When the booking agent calls it, the booking agent pauses, and so does the
travel agent: its ``RunResult.pending`` shows the call waiting. Both runs are checkpointed in
one SQLite file (the child under an id derived from its parent's call). A new agent, as a new
process would build it, approves the call on the parent run; the booking agent goes on from
its checkpoint, the call runs once, and its result comes back to the travel agent. Offline:
the models are scripted.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import structlog

from agent_fsm import Agent, Limits, RunStatus, SQLiteStore, StopReason, tool
from agent_fsm.messages import ModelResponse
from agent_fsm.testing import ScriptedModel, call, reply

booked: list[str] = []


@tool(requires_approval=True)
def book(flight: str) -> str:
    """Book a flight (a person approves it first)."""
    booked.append(flight)
    return f"booked {flight}"


def build(path: Path, *, resumed: bool = False) -> Agent:
    """The travel agent and its booking agent, on the store at ``path`` (``resumed``: the
    models of a new process, whose first replies were given already)."""
    skip = 1 if resumed else 0
    booking_script: list[ModelResponse | str] = [
        reply("", call("book", flight="LH 1234")),
        "Booked LH 1234.",
    ]
    travel_script: list[ModelResponse | str] = [
        reply("", call("booking", task="book LH 1234")),
        "Your flight LH 1234 is booked.",
    ]
    booking = Agent(
        model=ScriptedModel(booking_script[skip:], name="booking"),
        tools=[book],
        limits=Limits(max_turns=4),
    )
    return Agent(
        model=ScriptedModel(travel_script[skip:], name="travel"),
        tools=[booking.as_tool(name="booking", description="Books flights.")],
        limits=Limits(max_turns=8),
        store=SQLiteStore(path),
    )


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "runs.sqlite3"
        paused = build(path).run_sync("Book me LH 1234.")
        pending = paused.pending
        assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
        assert pending is not None
        assert pending.sub_agent is not None
        (waiting,) = pending.pending_calls
        child_id = pending.sub_agent.run_id
        print(f"paused: {pending.text} (in {pending.sub_agent.tool}, run {child_id})")
        assert booked == []
        later = build(path, resumed=True)  # a new process
        done = later.resume_sync(paused.run_id, approvals={waiting.id: True})
        print(f"{done.stop_reason.value} after {done.turns} turns: {done.output}")
        assert done.status is RunStatus.COMPLETED
        assert done.output == "Your flight LH 1234 is booked."
        assert booked == ["LH 1234"]
        child = later.checkpoints.load(child_id)
        assert child.parent is not None
        assert child.parent.run_id == paused.run_id


if __name__ == "__main__":
    main()
