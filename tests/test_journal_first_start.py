"""A call's first start is an insert that refuses an existing entry (``journal.start_fresh``,
``StartingJournal.lookup_or_start``), on every journal; only an idempotent call run again
replaces its entry (``record_started``). Two executions that both read "no entry" a moment
before must not both start the call: the second answers the first's entry.

The journal of a store of its own (``MemoryJournal``), one of someone else's (no
``lookup_or_start``: ``start_fresh`` reads, then records), and a DBOS tool step whose
journal cannot start a call in the read it makes first (a ``MemoryStore``'s), raced there by
another execution's start. The stores' own journals race in the store contract
(``testing.journal_contract``) and tests/test_postgres.py.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from agent_fsm import Agent, Limits, MemoryStore, tool
from agent_fsm.durable.journal import (
    CallStatus,
    JournalEntry,
    MemoryJournal,
    NotStarted,
    StartingJournal,
    ToolJournal,
    start_fresh,
)
from agent_fsm.durable.leases import Lease
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants

THEIRS = ToolCall(id="c", name="send", arguments='{"by": "them"}')
OURS = ToolCall(id="c", name="send", arguments='{"by": "us"}')


def test_a_memory_journals_first_start_answers_the_entry_it_finds() -> None:
    journal = MemoryJournal()
    assert isinstance(journal, StartingJournal)
    assert journal.lookup_or_start("k", THEIRS) is None
    started = JournalEntry("k", THEIRS, CallStatus.STARTED)
    assert journal.lookup_or_start("k", OURS) == started
    assert journal.lookup("k") == started
    journal.record_started("k", OURS)  # an idempotent call run again: replaced
    assert journal.lookup("k") == JournalEntry("k", OURS, CallStatus.STARTED)


def test_of_many_threads_starting_one_call_of_a_memory_journal_one_starts_it() -> None:
    journal = MemoryJournal()
    barrier = threading.Barrier(8)
    answers: list[JournalEntry | None] = []
    lock = threading.Lock()

    def start(n: int) -> None:
        barrier.wait(30)
        found = journal.lookup_or_start("k", ToolCall(id="c", name="send", arguments=str(n)))
        with lock:
            answers.append(found)

    threads = [threading.Thread(target=start, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers.count(None) == 1
    recorded = journal.lookup("k")
    assert all(found == recorded for found in answers if found is not None)


class PlainJournal:
    """A journal of someone else's: the three methods of ``ToolJournal`` only."""

    def __init__(self, fail_starts: bool = False) -> None:
        self._entries = MemoryJournal()
        self.fail_starts = fail_starts

    def lookup(self, key: str) -> JournalEntry | None:
        return self._entries.lookup(key)

    def record_started(self, key: str, call: ToolCall) -> None:
        if self.fail_starts:
            raise OSError("disk full")
        self._entries.record_started(key, call)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        self._entries.record_finished(key, result)


def test_start_fresh_on_a_journal_without_lookup_or_start_reads_then_records() -> None:
    journal = PlainJournal()
    assert not isinstance(journal, StartingJournal)
    assert start_fresh(journal, "k", THEIRS) is None
    assert start_fresh(journal, "k", OURS) == JournalEntry("k", THEIRS, CallStatus.STARTED)
    journal.fail_starts = True
    with pytest.raises(NotStarted, match="disk full"):
        start_fresh(journal, "other", OURS)
    assert journal.lookup("other") is None


# A DBOS tool step on a MemoryStore journal (no StartingLookup): its read finds no entry,
# then another execution of the step starts the call, then the step makes its first start.

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

from agent_fsm.dbos import DBOSAgent, RunQueue  # noqa: E402
from tests.dbos_worker import launched  # noqa: E402


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, "agent_fsm_first_start") as schema:
        yield schema


class RacedJournal:
    """``journal``, whose read of a tool call's entry finds none, after which another
    execution records the call started (as if between the read and the step's start)."""

    def __init__(self, journal: ToolJournal) -> None:
        self._journal = journal
        self.raced: list[str] = []

    def lookup(self, key: str) -> JournalEntry | None:
        found = self._journal.lookup(key)
        if found is None and "call:" in key and key not in self.raced:
            self.raced.append(key)
            start_fresh(self._journal, key, THEIRS)  # the other execution's start
        return found

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        return start_fresh(self._journal, key, call)

    def record_started(self, key: str, call: ToolCall) -> None:
        self._journal.record_started(key, call)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        self._journal.record_finished(key, result)


class FinishingRacedJournal(RacedJournal):
    """``RacedJournal`` that keeps a first end (``journal.FirstFinish``): a DBOS tool call
    is then made without a step, its start raced the same way."""

    def finish_first(self, key: str, result: ToolMessage) -> JournalEntry | None:
        entry = self._journal.lookup(key)  # one writer here: no race to keep out
        if entry is None or entry.status is CallStatus.FINISHED:
            return entry
        self._journal.record_finished(key, result)
        return self._journal.lookup(key)


class RacedStore(MemoryStore):
    def __init__(self, raced: type[RacedJournal] = RacedJournal) -> None:
        super().__init__()
        self.journals: dict[str, RacedJournal] = {}
        self._raced = raced

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal:
        raced = self._raced(super().journal(run_id, lease=lease))
        self.journals[run_id] = raced
        return raced


@pytest.mark.slow  # a real server: make check leaves it out
@pytest.mark.parametrize("raced", [RacedJournal, FinishingRacedJournal])
async def test_a_dbos_tool_step_raced_between_its_read_and_its_start_does_not_run_the_call(
    dbos_schema: str, raced: type[RacedJournal]
) -> None:
    """The step's first start meets the other execution's entry: the call (not idempotent)
    is answered "outcome unknown" and not made here; the entry stays the other's. Made
    without a step (a journal that keeps a first end), the start meets it the same way, and
    the call is then made as a step, which answers so."""
    sent: list[int] = []

    @tool
    async def send(n: int) -> str:
        """Send message n."""
        sent.append(n)
        return f"sent {n}"

    def model(request: ModelRequest) -> ModelResponse:
        if any(isinstance(m, ToolMessage) for m in request.messages):
            return reply("done")
        return reply("", call("send", n=1))

    store = RacedStore(raced)
    agent = Agent(model=FunctionModel(model), tools=[send], limits=Limits(loop_detection=False))
    durable = DBOSAgent(
        agent,
        journal=store,
        name=uuid.uuid4().hex,
        queue=RunQueue(name="first_start_runs", polling_interval_s=0.05),
    )
    run_id = f"raced-{uuid.uuid4().hex[:8]}"
    result = await durable.run("Send it.", run_id=run_id)
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    answer = next(m for m in result.messages if isinstance(m, ToolMessage))
    assert "The outcome of this call to 'send' is unknown" in answer.content
    assert sent == []  # the other execution's to make
    journal = store.journals[run_id]
    assert len(journal.raced) == 1
    entry: Any = journal.lookup(journal.raced[0])
    assert entry is not None
    assert entry.call == THEIRS
