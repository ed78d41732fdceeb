"""A journal that looks a call up and records it started in one write
(``durable.journal.StartingJournal``, ``SQLiteJournal.lookup_or_start``): the same entries as
``lookup`` then ``record_started``, and the same answers from ACT when either part fails."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from agent_fsm import Agent
from agent_fsm.durable import SQLiteStore
from agent_fsm.durable.journal import (
    CallStatus,
    JournalEntry,
    NotStarted,
    StartingJournal,
    ToolJournal,
    settle,
)
from agent_fsm.errors import RunLeased
from agent_fsm.messages import ToolCall, ToolMessage
from agent_fsm.state import RunState
from agent_fsm.testing import ScriptedModel, call, reply
from tests.conftest import TRANSFERS, one_transfer, transfer

CALL = ToolCall(id="c1", name="transfer", arguments='{"amount": 5}')
DONE = ToolMessage(tool_call_id="c1", name="transfer", content="moved 5")


def test_a_call_never_seen_is_recorded_started_for_every_reader(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    with SQLiteStore(path) as store, SQLiteStore(path) as other:
        journal = store.journal("r")
        assert isinstance(journal, StartingJournal)
        assert journal.lookup_or_start("1:0:c1", CALL) is None  # it runs now
        # committed before it returned: another connection (a new process) finds it
        assert other.journal("r").lookup("1:0:c1") == JournalEntry(
            "1:0:c1", CALL, CallStatus.STARTED
        )


def test_a_call_the_journal_holds_is_given_back_and_left_as_it_was(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        journal = store.journal("r")
        journal.record_started("1:0:c1", CALL)
        journal.record_finished("1:0:c1", DONE)
        again = ToolCall(id="c1", name="transfer", arguments='{"amount": 9}')
        found = journal.lookup_or_start("1:0:c1", again)
        assert found == JournalEntry("1:0:c1", CALL, CallStatus.FINISHED, DONE)
        assert journal.lookup("1:0:c1") == found  # not replaced by the new call
        journal.record_started("2:0:c1", CALL)  # started, never finished (a crash)
        assert journal.lookup_or_start("2:0:c1", again) == JournalEntry(
            "2:0:c1", CALL, CallStatus.STARTED
        )


def test_a_start_the_lease_refuses_is_not_started_and_writes_nothing(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        lease = store.claim("r", "worker-a", 60.0)
        journal = store.journal("r")  # no lease: another worker holds the run
        with pytest.raises(NotStarted) as raised:
            journal.lookup_or_start("1:0:c1", CALL)
        assert isinstance(raised.value.__cause__, RunLeased)
        assert journal.lookup("1:0:c1") is None
        # reading what is there needs no lease: nothing is written
        store.journal("r", lease=lease).record_started("2:0:c1", CALL)
        assert journal.lookup_or_start("2:0:c1", CALL) == JournalEntry(
            "2:0:c1", CALL, CallStatus.STARTED
        )


def test_a_call_never_seen_is_recorded_started_in_one_statement(tmp_path: Path) -> None:
    """The usual first start writes at once, not after a look-up: what refused a record is
    read only when it was refused."""
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        journal = store.journal("r")
        statements: list[str] = []
        conn = store._file._conn
        assert conn is not None
        conn.set_trace_callback(statements.append)
        assert journal.lookup_or_start("1:0:c1", CALL) is None
        conn.set_trace_callback(None)
    assert [statement.split()[0] for statement in statements] == ["BEGIN", "INSERT", "COMMIT"]


def test_a_leased_start_is_refused_once_another_worker_took_the_run(tmp_path: Path) -> None:
    now = [1000.0]
    with SQLiteStore(tmp_path / "runs.sqlite3", clock=lambda: now[0]) as store:
        mine = store.claim("r", "worker-a", 10.0)
        journal = store.journal("r", lease=mine)
        assert journal.lookup_or_start("1:0:c1", CALL) is None  # its own lease is no refusal
        now[0] += 60.0  # worker-a's lease expired: worker-b takes the run over
        store.claim("r", "worker-b", 10.0)
        with pytest.raises(NotStarted) as raised:
            journal.lookup_or_start("2:0:c1", CALL)
        assert isinstance(raised.value.__cause__, RunLeased)
        assert "worker-b" in str(raised.value)
        assert journal.lookup("2:0:c1") is None  # nothing written
        assert journal.lookup_or_start("1:0:c1", CALL) == JournalEntry(  # read, not refused
            "1:0:c1", CALL, CallStatus.STARTED
        )


class Failing:
    """A starting journal whose ``lookup_or_start`` fails as ``failure`` says."""

    def __init__(self, inner: ToolJournal, failure: BaseException) -> None:
        self.inner, self.failure = inner, failure

    def lookup(self, key: str) -> JournalEntry | None:
        return self.inner.lookup(key)

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        raise self.failure

    def record_started(self, key: str, call: ToolCall) -> None:
        self.inner.record_started(key, call)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        self.inner.record_finished(key, result)


class FailingStore(SQLiteStore):
    failure: BaseException

    def journal(self, run_id: str, *, lease: Any = None) -> ToolJournal:
        return Failing(super().journal(run_id, lease=lease), self.failure)


def _answer(tmp_path: Path, failure: BaseException) -> ToolMessage:
    store = FailingStore(tmp_path / "runs.sqlite3")
    store.failure = failure
    with store:
        answer = one_transfer(store)
    assert TRANSFERS == []  # never run while the journal cannot see it
    return answer


def test_a_call_that_could_not_be_recorded_is_answered_not_run(tmp_path: Path) -> None:
    failure = NotStarted("the disk is full")
    failure.__cause__ = OSError("the disk is full")
    answer = _answer(tmp_path, failure)
    assert answer.is_error
    assert answer.content == (
        "Tool 'transfer' was not run: its call could not be recorded (OSError: the disk is full)."
    )


def test_a_call_whose_entry_could_not_be_read_is_outcome_unknown(tmp_path: Path) -> None:
    answer = _answer(tmp_path, ConnectionError("the connection dropped"))
    assert "The outcome of this call to 'transfer' is unknown" in answer.content
    assert "could not be read (ConnectionError: the connection dropped)" in answer.content
    assert answer.details == {"runtime": {"outcome_unknown": True}}
    assert "was not run" not in answer.content


# -- the finished record of a run's last call in flight waits for the run's next write ------


class HeldBack(NamedTuple):
    """Run ``r`` saved in ``store``, its call ``1:0:c1`` recorded started and finished in
    ``journal``: the run's last call in flight, its finished record held back; ``other``
    opens the same file, as another process (or one after a crash) would."""

    store: SQLiteStore
    other: SQLiteStore
    journal: ToolJournal


@pytest.fixture
def held_back(tmp_path: Path) -> Iterator[HeldBack]:
    path = tmp_path / "runs.sqlite3"
    with SQLiteStore(path) as store, SQLiteStore(path) as other:
        store.save(RunState(run_id="r"))
        journal = store.journal("r")
        journal.record_started("1:0:c1", CALL)
        journal.record_finished("1:0:c1", DONE)
        yield HeldBack(store, other, journal)


def test_the_last_call_in_flight_is_recorded_finished_with_the_next_write(
    held_back: HeldBack,
) -> None:
    store, other, journal = held_back
    finished = JournalEntry("1:0:c1", CALL, CallStatus.FINISHED, DONE)
    assert store.journal("r").lookup("1:0:c1") == finished  # this process knows
    # another process (a crash now) finds it started: its outcome unknown, never run twice
    assert other.journal("r").lookup("1:0:c1") == JournalEntry("1:0:c1", CALL, CallStatus.STARTED)
    store.save(RunState(run_id="r", turns=1))  # the checkpoint after ACT writes it
    assert other.journal("r").lookup("1:0:c1") == finished
    # the next call's start writes it too, and a call finishing beside another in
    # flight is written at once
    journal.record_started("2:0:c1", CALL)
    journal.record_finished("2:0:c1", DONE)
    journal.lookup_or_start("3:0:c1", CALL)
    journal.record_started("3:1:c2", CALL)
    assert other.journal("r").lookup("2:0:c1") is not None
    assert other.journal("r").lookup("2:0:c1").status is CallStatus.FINISHED  # type: ignore[union-attr]
    journal.record_finished("3:0:c1", DONE)
    assert other.journal("r").lookup("3:0:c1").status is CallStatus.FINISHED  # type: ignore[union-attr]
    journal.record_finished("3:1:c2", DONE)  # the last: held back
    assert other.journal("r").lookup("3:1:c2").status is CallStatus.STARTED  # type: ignore[union-attr]
    settle(journal)  # its driver lets go
    assert other.journal("r").lookup("3:1:c2").status is CallStatus.FINISHED  # type: ignore[union-attr]


def test_a_record_held_back_survives_a_save_that_fails(held_back: HeldBack) -> None:
    store, other, journal = held_back
    other.claim("r", "worker-b", 60.0)  # another worker leased the run meanwhile
    with pytest.raises(RunLeased):
        store.save(RunState(run_id="r", turns=1))  # rolled back, the record held again
    assert other.journal("r").lookup("1:0:c1").status is CallStatus.STARTED  # type: ignore[union-attr]
    settle(journal)
    assert other.journal("r").lookup("1:0:c1") == JournalEntry(
        "1:0:c1", CALL, CallStatus.FINISHED, DONE
    )


def test_a_durable_run_leaves_every_call_recorded_finished(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    TRANSFERS.clear()
    with SQLiteStore(path) as store:
        model = ScriptedModel(
            [
                reply("", call("transfer", amount=1)),
                reply("", call("transfer", amount=2), call("transfer", amount=3)),
                "Done.",
            ]
        )
        result = Agent(model=model, tools=[transfer], store=store).run_sync("Pay.")
    with SQLiteStore(path) as fresh:  # as a new process finds it
        journal = fresh.journal(result.run_id)
        keys = ["1:0:call_1_0", "2:0:call_2_0", "2:1:call_2_1"]
        assert [journal.lookup(key).status for key in keys] == [CallStatus.FINISHED] * 3  # type: ignore[union-attr]
    assert TRANSFERS == ["transfer 1", "transfer 2", "transfer 3"]


def test_a_forks_journal_is_durable_once_fork_returns(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    TRANSFERS.clear()
    with SQLiteStore(path) as store:
        model = ScriptedModel([reply("", call("transfer", amount=1)), "Done."])
        agent = Agent(model=model, tools=[transfer], store=store)
        first = agent.run_sync("Pay.")
        fork = agent.fork(first.run_id, at=len(first.trace) - 1)
        with SQLiteStore(path) as other:  # another process, before the fork takes a step
            entry = other.journal(fork.run_id).lookup("1:0:call_1_0")
        assert entry is not None
        assert entry.status is CallStatus.FINISHED
    assert TRANSFERS == ["transfer 1"]


def test_a_record_held_back_is_not_written_onto_the_run_made_again_elsewhere(
    held_back: HeldBack,
) -> None:
    """Another process deletes the run and makes it again, and a call of the same key starts
    in it: the held record's end is not that call's (lost instead, as in a crash)."""
    _, other, journal = held_back
    other.delete("r")
    other.save(RunState(run_id="r"))
    theirs = ToolCall(id="c1", name="transfer", arguments='{"amount": 7}')
    assert other.journal("r").lookup_or_start("1:0:c1", theirs) is None
    settle(journal)  # this process's next write of the run
    assert other.journal("r").lookup("1:0:c1") == JournalEntry("1:0:c1", theirs, CallStatus.STARTED)
