"""The hooks durable and steerable runs need, driven through ``act`` directly: the tool
journal (replay, unknown outcome, idempotent re-run), interruption (steering) and stop."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from agent_fsm import Limits, tool
from agent_fsm.cancellation import StopEvent
from agent_fsm.durable.journal import (
    CallStatus,
    JournalEntry,
    MemoryJournal,
    NotStarted,
    journal_key,
)
from agent_fsm.events import Event, ToolFinished
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus
from agent_fsm.tools.tool import ASK_USER
from tests.test_tool_acting import act_on, c, fresh_state

runs: list[str] = []


@tool
def charge(amount: int) -> str:
    """Charge a card (not idempotent)."""
    runs.append(f"charge {amount}")
    return f"charged {amount}"


@tool(idempotent=True)
def lookup(key: str) -> str:
    """Read a value (idempotent)."""
    runs.append(f"lookup {key}")
    return f"value of {key}"


def setup_function() -> None:
    runs.clear()


# -- journal --------------------------------------------------------------------------------


def test_executed_calls_are_journalled_before_and_after() -> None:
    journal = MemoryJournal()
    calls = [c(0, "charge", amount=5), c(1, "nope"), c(2, "lookup", key="k")]
    results = asyncio.run(act_on([charge, lookup], calls, journal=journal))
    assert len(journal) == 2  # the invalid call never executes, so it is not journalled
    first = journal.lookup(journal_key(1, 0, "c0"))
    assert first is not None
    assert (first.status, first.result) == (CallStatus.FINISHED, results[0])
    assert journal.lookup(journal_key(1, 1, "c1")) is None


def test_a_finished_call_is_replayed_from_the_journal_not_run() -> None:
    journal = MemoryJournal()
    calls = [c(0, "charge", amount=5)]
    asyncio.run(act_on([charge], calls, journal=journal))
    assert runs == ["charge 5"]
    events: list[Event] = []
    (replayed,) = asyncio.run(act_on([charge], calls, journal=journal, events=events))
    assert runs == ["charge 5"]
    assert (replayed.content, replayed.status) == ("charged 5", ToolStatus.OK)
    assert replayed.details == {"runtime": {"replayed": True}}
    finished = [e for e in events if isinstance(e, ToolFinished)]
    assert [(f.output, f.attempts, f.details) for f in finished] == [
        ("charged 5", 0, {"runtime": {"replayed": True}})
    ]


def test_a_started_call_of_a_tool_that_is_not_idempotent_has_an_unknown_outcome() -> None:
    journal = MemoryJournal()
    key = journal_key(1, 0, "c0")
    journal.record_started(key, c(0, "charge", amount=5))
    (result,) = asyncio.run(act_on([charge], [c(0, "charge", amount=5)], journal=journal))
    assert runs == []
    assert result.status is ToolStatus.ERROR
    assert "outcome of this call to 'charge' is unknown" in result.content
    assert "not re-run because the tool is not idempotent" in result.content
    entry = journal.lookup(key)
    assert entry is not None
    assert (entry.status, entry.result) == (CallStatus.FINISHED, result)


def test_a_started_call_of_an_idempotent_tool_is_run_again() -> None:
    journal = MemoryJournal()
    key = journal_key(1, 0, "c0")
    journal.record_started(key, c(0, "lookup", key="k"))
    (result,) = asyncio.run(act_on([lookup], [c(0, "lookup", key="k")], journal=journal))
    assert runs == ["lookup k"]
    assert result.content == "value of k"
    entry = journal.lookup(key)
    assert entry is not None
    assert entry.status is CallStatus.FINISHED


class _UnwritableJournal:
    """A journal of someone else's (no ``lookup_or_start``) whose writes fail."""

    def lookup(self, key: str) -> JournalEntry | None:
        return None

    def record_started(self, key: str, call: ToolCall) -> None:
        raise OSError("disk full")

    def record_finished(self, key: str, result: ToolMessage) -> None:
        raise OSError("disk full")


class _UnwritableStartingJournal(MemoryJournal):
    """A journal that starts a call in one write (``StartingJournal``), which fails."""

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        raise NotStarted("the write failed") from OSError("disk full")  # as journals do


@pytest.mark.parametrize("journal", [_UnwritableJournal, _UnwritableStartingJournal])
def test_a_journal_that_cannot_record_means_the_call_is_not_run(journal: type[Any]) -> None:
    (result,) = asyncio.run(act_on([charge], [c(0, "charge", amount=5)], journal=journal()))
    assert runs == []
    assert result.is_error
    assert "was not run: its call could not be recorded (OSError: disk full)" in result.content


# -- steering ---------------------------------------------------------------------------------


STEERED = "Skipped: a new user message arrived, so this call was not run"


def test_steering_skips_the_calls_not_yet_started() -> None:
    state = fresh_state()

    @tool
    def lookup_and_steer(key: str) -> str:
        """Read a value; the user steers the run meanwhile."""
        runs.append(f"lookup {key}")
        state.pending_input.append("Actually, stop.")
        return key

    calls = [c(i, "lookup_and_steer", key=str(i)) for i in range(4)]
    results = asyncio.run(act_on([lookup_and_steer], calls, parallel=False, state=state))
    assert runs == ["lookup 0"]
    assert [r.status for r in results] == [ToolStatus.OK] + [ToolStatus.SKIPPED] * 3
    assert results[1].content == STEERED


def test_steering_lets_running_parallel_calls_finish() -> None:
    finished: list[int] = []
    state = fresh_state()

    @tool
    async def work(n: int) -> str:
        """Work a little; the first to finish steers the run."""
        await asyncio.sleep(0.002 * (n + 1))
        finished.append(n)
        state.pending_input.append("steered")
        return str(n)

    calls = [c(i, "work", n=i) for i in range(5)]
    results = asyncio.run(act_on([work], calls, lim=Limits(max_parallel_tools=2), state=state))
    # 0 and 1 started together; 0 finished first and steered; 1 was running, so it finished.
    assert [r.status for r in results] == [ToolStatus.OK] * 2 + [ToolStatus.SKIPPED] * 3
    assert sorted(finished) == [0, 1]


# -- stop -------------------------------------------------------------------------------------


async def _stop_after(stop: StopEvent, delay: float) -> None:
    await asyncio.sleep(delay)
    stop.set()


def test_stop_cancels_a_running_async_tool_promptly_and_skips_the_rest() -> None:
    seen: list[str] = []

    @tool
    async def long_job() -> str:
        """Takes ages."""
        try:
            await asyncio.sleep(30)
        finally:
            seen.append("unwound")
        return "never"

    async def scenario() -> tuple[list[ToolMessage], float, MemoryJournal]:
        stop = StopEvent()
        journal = MemoryJournal()
        stopper = asyncio.create_task(_stop_after(stop, 0.02))
        started = time.monotonic()
        results = await act_on(
            [long_job, lookup],
            [c(0, "long_job"), c(1, "lookup", key="k")],
            parallel=False,
            stop=stop,
            journal=journal,
        )
        await stopper
        return results, time.monotonic() - started, journal

    results, elapsed, journal = asyncio.run(scenario())
    assert elapsed < 1.0
    assert seen == ["unwound"]
    assert runs == []
    cancelled, skipped = results
    assert cancelled.status is ToolStatus.ERROR
    assert cancelled.content == "Tool 'long_job' was cancelled because the run was stopped."
    assert cancelled.details == {"runtime": {"cancelled": True}}
    assert skipped.content == "Skipped: the run was stopped before this call started"
    entry = journal.lookup(journal_key(1, 0, "c0"))
    assert entry is not None
    assert (entry.status, entry.result) == (CallStatus.FINISHED, cancelled)


def test_stop_abandons_a_running_sync_tool() -> None:
    release = threading.Event()

    @tool
    def blocking() -> str:
        """Blocks its thread."""
        release.wait(10)
        return "late"

    async def scenario() -> list[ToolMessage]:
        stop = StopEvent()
        stopper = asyncio.create_task(_stop_after(stop, 0.02))
        results = await act_on([blocking], [c(0, "blocking")], stop=stop)
        await stopper
        return results

    try:
        (result,) = asyncio.run(scenario())
    finally:
        release.set()
    assert result.is_error
    assert "cancelled because the run was stopped" in result.content
    assert "abandoned" in result.content
    assert result.details == {"runtime": {"cancelled": True, "abandoned": True}}


def test_a_stop_already_set_runs_nothing() -> None:
    async def scenario() -> list[ToolMessage]:
        stop = StopEvent()
        stop.set()
        return await act_on([lookup], [c(0, "lookup", key="a"), c(1, "nope")], stop=stop)

    skipped, invalid = asyncio.run(scenario())
    assert runs == []
    assert skipped.status is ToolStatus.SKIPPED
    assert invalid.status is ToolStatus.ERROR


def test_a_stop_never_set_changes_nothing() -> None:
    async def scenario() -> list[ToolMessage]:
        return await act_on([lookup], [c(0, "lookup", key="a")], stop=StopEvent())

    (result,) = asyncio.run(scenario())
    assert result.content == "value of a"


def test_hooks_do_not_touch_control_flow() -> None:
    journal = MemoryJournal()
    state = fresh_state()
    results = asyncio.run(
        act_on(
            [ASK_USER, charge],
            [c(0, "charge", amount=1), c(1, "ask_user", question="?")],
            journal=journal,
            state=state,
        )
    )
    assert [r.status for r in results] == [ToolStatus.SKIPPED, ToolStatus.OK]
    assert len(journal) == 0
    assert runs == []
