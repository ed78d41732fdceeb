"""Exactly once (issue 34): what the engine tells the model when it cannot know whether a
call ran. A journal that cannot be read says "outcome unknown", never "not run": a model
told "not run" sends the call again, and the effect happens twice."""

from __future__ import annotations

from typing import Any

import pytest

from agent_fsm import Agent, MemoryStore, ResumeError, tool
from agent_fsm.durable.journal import CallStatus, JournalEntry, ToolJournal
from agent_fsm.messages import ToolCall, ToolMessage
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply
from tests.conftest import TRANSFERS, one_transfer


class Unreadable:
    """A journal whose look-up fails, as when the connection drops just before it."""

    def __init__(self, inner: ToolJournal, *, started: bool = False) -> None:
        self.inner = inner
        self.started = started

    def lookup(self, key: str) -> JournalEntry | None:
        if self.started:  # the call started before a crash, and recording its end fails
            started = ToolCall(id="call_1_0", name="transfer", arguments='{"amount": 5}')
            return JournalEntry(key=key, call=started, status=CallStatus.STARTED)
        raise ConnectionError("server closed the connection unexpectedly")

    def record_started(self, key: str, call: ToolCall) -> None:
        self.inner.record_started(key, call)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        if self.started:
            raise ConnectionError("server closed the connection unexpectedly")
        self.inner.record_finished(key, result)


class FlakyStore(MemoryStore):
    def __init__(self, *, started: bool = False) -> None:
        super().__init__()
        self.started = started

    def journal(self, run_id: str, *, lease: Any = None) -> ToolJournal:
        return Unreadable(super().journal(run_id, lease=lease), started=self.started)  # type: ignore[return-value]


def test_a_journal_that_cannot_be_read_answers_outcome_unknown() -> None:
    answer = one_transfer(FlakyStore())
    assert TRANSFERS == []  # never run while the journal cannot see it
    assert answer.is_error
    assert "The outcome of this call to 'transfer' is unknown" in answer.content
    assert "could not be read (ConnectionError" in answer.content
    assert answer.details == {"runtime": {"outcome_unknown": True}}
    assert "was not run" not in answer.content


def test_a_started_call_whose_end_cannot_be_recorded_is_still_outcome_unknown() -> None:
    answer = one_transfer(FlakyStore(started=True))
    assert TRANSFERS == []
    assert "is unknown: it started before an interruption" in answer.content
    assert answer.details == {"runtime": {"outcome_unknown": True}}


PAID: list[int] = []


@tool(requires_approval=True)
def pay(amount: int) -> str:
    """Pay an amount (a person approves it first)."""
    PAID.append(amount)
    return f"paid {amount}"


def test_a_late_approval_does_not_approve_a_pause_nobody_saw() -> None:
    """A double click: the second "approve all" arrives after the first went through and the
    run paused again for another payment. It names the pause it was clicked on, so it is
    refused; one that names none is refused too, and so is a decision by the old call's id."""
    PAID.clear()
    model = ScriptedModel(
        [reply("", call("pay", amount=5)), reply("", call("pay", amount=7)), "Done."]
    )
    agent = Agent(model=model, tools=[pay])
    first = agent.run_sync("Pay the bills.")
    assert first.pending is not None
    assert first.pending.pause.startswith("pause-")
    second = agent.resume_sync(first.run_id, approvals=True, pause=first.pending.pause)
    assert second.pending is not None
    assert second.pending.pause != first.pending.pause
    assert PAID == [5]
    with pytest.raises(ResumeError, match=f"for {first.pending.pause}, but the run waits at"):
        agent.resume_sync(first.run_id, approvals=True, pause=first.pending.pause)
    with pytest.raises(ResumeError, match="must name the pause it answers"):
        agent.resume_sync(first.run_id, approvals=True)
    old_call = first.pending.pending_calls[0].id
    with pytest.raises(ResumeError, match="are not pending"):
        agent.resume_sync(first.run_id, approvals={old_call: True})
    assert PAID == [5]  # nothing nobody saw was approved
    done = agent.resume_sync(first.run_id, approvals=True, pause=second.pending.pause)
    assert done.output == "Done."
    assert PAID == [5, 7]
    check_invariants(done, limits=agent.limits, bound=agent.bound)
