"""The tool-journal part of the checkpoint-store contract (``durable.journal`` states it):
what a resumed run finds of the calls its interrupted turn started. ``CheckpointStoreContract``
includes it; it is not meant to be used alone."""

from __future__ import annotations

import threading

import pytest

from agent_fsm.durable.journal import (
    CallStatus,
    FirstFinish,
    FirstFinishingLookup,
    JournalEntry,
    OutcomeJournal,
    journal_key,
    start_fresh,
)
from agent_fsm.messages import ToolCall, ToolMessage
from agent_fsm.testing.store_kit import StoreContractBase

__all__ = ["JournalContract"]


class JournalContract(StoreContractBase):
    """Calls started and finished, keys recorded again, journals per run and shared."""

    def test_the_journal_records_a_call_started_then_finished(self) -> None:
        store = self.open_store()
        key = journal_key(2, 0, "c1")
        call = ToolCall(id="c1", name="add", arguments='{"a": 1}')
        result = ToolMessage(tool_call_id="c1", name="add", content="3", details={"ms": 2})
        journal = store.journal("run-1")
        assert journal.lookup(key) is None  # never started: the call runs normally
        journal.record_started(key, call)
        journal.record_finished(key, result)
        finished = store.journal("run-1").lookup(key)
        assert finished is not None
        assert (finished.key, finished.call, finished.status, finished.result) == (
            key,
            call,
            CallStatus.FINISHED,
            result,
        )

    def test_a_call_started_but_never_finished_looks_started_with_no_result(self) -> None:
        """What a resumed run finds of a call that was running when the process died: it
        re-runs an idempotent tool, and tells the model the outcome is unknown otherwise."""
        store = self.open_store()
        call = ToolCall(id="c1", name="transfer", arguments='{"amount": 10}')
        store.journal("run-1").record_started("3:1:c1", call)
        entry = store.journal("run-1").lookup("3:1:c1")
        assert entry is not None
        assert (entry.key, entry.call, entry.status, entry.result) == (
            "3:1:c1",
            call,
            CallStatus.STARTED,
            None,
        )

    def test_a_key_names_one_call_and_recording_it_again_replaces_its_entry(self) -> None:
        """Keys are ``journal_key(turn, index, call_id)``: unique in a run. An idempotent
        call run again after a crash is recorded again under its key: one entry, started."""
        store = self.open_store()
        journal = store.journal("run-1")
        first, again = ToolCall(id="c", name="get"), ToolCall(id="c", name="get", arguments="{}")
        journal.record_started("1:0:c", first)
        journal.record_finished("1:0:c", ToolMessage(tool_call_id="c", name="get", content="1"))
        journal.record_started("1:0:c", again)
        entry = journal.lookup("1:0:c")
        assert entry is not None
        assert (entry.call, entry.status, entry.result) == (again, CallStatus.STARTED, None)
        done = ToolMessage(tool_call_id="c", name="get", content="2")
        journal.record_finished("1:0:c", done)
        assert journal.lookup("1:0:c") == JournalEntry("1:0:c", again, CallStatus.FINISHED, done)
        journal.record_started("2:0:c", first)  # the same call id on another turn: its own
        assert journal.lookup("1:0:c") is not None
        assert journal.lookup("1:0:c") != journal.lookup("2:0:c")

    def test_a_first_end_is_never_recorded_over(self) -> None:
        """A journal that keeps a first end (``journal.FirstFinish``: a DBOS tool call made
        without a step records its end so): the first end recorded wins, a second one reads
        it back, and a key with no entry answers None. Skipped for a journal without it."""
        store = self.open_store()
        journal = store.journal("run-1")
        if not isinstance(journal, FirstFinish):
            pytest.skip("this journal keeps no first end (journal.FirstFinish)")
        call = ToolCall(id="call:0", name="send", arguments='{"n": 1}')
        first = ToolMessage(tool_call_id="call:0", name="send", content="sent", details={"a": 1})
        second = ToolMessage(tool_call_id="call:0", name="send", content="unknown")
        assert journal.finish_first("call:0", first) is None  # never started: nothing written
        assert journal.lookup("call:0") is None
        journal.record_started("call:0", call)
        finished = JournalEntry("call:0", call, CallStatus.FINISHED, first)
        assert journal.finish_first("call:0", first) == finished
        again = store.journal("run-1")
        assert isinstance(again, FirstFinish)
        assert again.finish_first("call:0", second) == finished
        assert store.journal("run-1").lookup("call:0") == finished

    def test_a_first_end_and_another_entry_in_one_call(self) -> None:
        """A journal that keeps a first end and reads another entry with it
        (``journal.FirstFinishingLookup``: a DBOS tool call made without a step reads its
        cancel request so): ``finish_first``'s answer, and the other entry (None when it has
        none). Skipped for a journal without it."""
        store = self.open_store()
        journal = store.journal("run-1")
        if not isinstance(journal, FirstFinishingLookup):
            pytest.skip("this journal reads no other entry with a first end")
        call = ToolCall(id="call:0", name="send", arguments='{"n": 1}')
        request = ToolCall(id="cancel", name="stop", arguments='{"reason": "enough"}')
        first = ToolMessage(tool_call_id="call:0", name="send", content="sent")
        second = ToolMessage(tool_call_id="call:0", name="send", content="unknown")
        assert journal.finish_first_and_lookup("call:0", first, "cancel") == (None, None)
        assert journal.lookup("call:0") is None
        journal.record_started("call:0", call)
        finished = JournalEntry("call:0", call, CallStatus.FINISHED, first)
        assert journal.finish_first_and_lookup("call:0", first, "cancel") == (finished, None)
        journal.record_started("cancel", request)
        asked = JournalEntry("cancel", request, CallStatus.STARTED)
        again = store.journal("run-1")
        assert isinstance(again, FirstFinishingLookup)
        assert again.finish_first_and_lookup("call:0", second, "cancel") == (finished, asked)
        assert store.journal("run-1").lookup("call:0") == finished

    def test_a_first_outcome_is_kept_and_read_with_another_entry(self) -> None:
        """A journal that keeps outcomes (``journal.OutcomeJournal``: a DBOS model call made
        without a step keeps its outcome so): the first outcome kept under a key wins, a
        second one is answered it, read back with another entry (None where there is
        none), as written; and no tool call's entry is touched. Skipped for a journal
        without it."""
        store = self.open_store()
        journal = store.journal("run-1")
        if not isinstance(journal, OutcomeJournal):
            pytest.skip("this journal keeps no outcomes (journal.OutcomeJournal)")
        request = ToolCall(id="cancel", name="stop", arguments='{"reason": "enough"}')
        first, second = '{"reply": "yes", "at": 1.25}', '{"reply": "no", "at": 2.5}'
        assert journal.outcome_and_lookup("model:0", "cancel") == (None, None)
        assert journal.keep_outcome("model:0", first) == first
        again = store.journal("run-1")
        assert isinstance(again, OutcomeJournal)
        assert again.keep_outcome("model:0", second) == first
        journal.record_started("cancel", request)
        asked = JournalEntry("cancel", request, CallStatus.STARTED)
        assert again.outcome_and_lookup("model:0", "cancel") == (first, asked)
        assert again.outcome_and_lookup("model:1", "cancel") == (None, asked)
        assert journal.keep_outcome("model:1", second) == second
        other = store.journal("run-2")
        assert isinstance(other, OutcomeJournal)
        assert other.outcome_and_lookup("model:0", "cancel") == (None, None)

    def test_finishing_a_call_that_never_started_is_a_key_error(self) -> None:
        store = self.open_store()
        result = ToolMessage(tool_call_id="c", name="t", content="x")
        with pytest.raises(KeyError, match="without having started"):
            store.journal("run-1").record_finished("9:0:c", result)
        assert store.journal("run-1").lookup("9:0:c") is None

    def test_journals_are_per_run(self) -> None:
        store = self.open_store()
        store.journal("a").record_started("1:0:c", ToolCall(id="c", name="t"))
        assert store.journal("b").lookup("1:0:c") is None
        assert store.journal("a").lookup("1:0:c") is not None

    def test_any_call_id_makes_a_key_of_its_own(self) -> None:
        """Keys hold the model's call ids, which may be anything: a lone surrogate (two of
        them, told apart), a NUL, thousands of characters. Each key is recorded and found
        on its own, and its entry carries the key as given."""
        store = self.open_store()
        journal = store.journal("run-1")
        keys = ["1:0:\ud83d", "1:0:\ud800", "1:1:nul\x00", "1:2:" + "c" * 5000, "1:3:ok"]
        call = ToolCall(id="c", name="t", arguments='{"name": "caf\u00e9"}')
        for key in keys:
            journal.record_started(key, call)
        done = ToolMessage(tool_call_id="c", name="t", content="done")
        journal.record_finished(keys[0], done)
        for key in keys:
            entry = store.journal("run-1").lookup(key)
            assert entry is not None, key
            assert (entry.key, entry.call) == (key, call)
            assert entry.status is (CallStatus.FINISHED if key == keys[0] else CallStatus.STARTED)
        assert journal.lookup("1:0:\udfff") is None

    def test_the_journal_is_durable_and_shared(self) -> None:
        first, second = self.open_store(), self.open_shared()
        call = ToolCall(id="c1", name="transfer")
        # Written from a worker thread, as a sync tool's runtime may do.
        worker = threading.Thread(target=first.journal("r").record_started, args=("k", call))
        worker.start()
        worker.join()
        entry = second.journal("r").lookup("k")  # committed before record_started returned
        assert entry is not None
        assert (entry.call, entry.status) == (call, CallStatus.STARTED)
        first.close()
        second.close()
        assert self.open_shared().journal("r").lookup("k") == entry  # as a new process finds it

    def test_a_first_start_answers_the_entry_it_finds_and_leaves_it(self) -> None:
        """A call's first start (``start_fresh``, a worker that read no entry a moment
        before) never records over an entry another execution made meanwhile: it answers
        that entry, started or finished, and writes nothing (only ``record_started``, an
        idempotent call run again, replaces an entry)."""
        store = self.open_store()
        journal = store.journal("run-1")
        theirs, ours = (
            ToolCall(id="c", name="send", arguments='{"n": 1}'),
            ToolCall(id="c", name="send", arguments='{"n": 2}'),
        )
        assert start_fresh(journal, "1:0:c", theirs) is None  # recorded: it runs now
        started = JournalEntry("1:0:c", theirs, CallStatus.STARTED)
        assert start_fresh(journal, "1:0:c", ours) == started
        assert store.journal("run-1").lookup("1:0:c") == started
        done = ToolMessage(tool_call_id="c", name="send", content="sent")
        journal.record_finished("1:0:c", done)
        finished = JournalEntry("1:0:c", theirs, CallStatus.FINISHED, done)
        assert start_fresh(journal, "1:0:c", ours) == finished
        assert store.journal("run-1").lookup("1:0:c") == finished

    def test_of_first_starts_of_one_call_at_once_exactly_one_starts_it(self) -> None:
        """Two workers (two stores on one storage where it is shared, else two threads on
        one store) make the first start of the same calls at the same moment: each call is
        started by exactly one of them, and the other gets its entry."""
        stores = [self.open_store()]
        stores.append(self.open_shared() if self.shares_storage else stores[0])
        keys = [f"1:{n}:c" for n in range(12)]
        barrier = threading.Barrier(2)
        answers: list[list[JournalEntry | None]] = [[], []]

        def worker(n: int) -> None:
            journal = stores[n].journal("race")
            call = ToolCall(id="c", name="send", arguments=f'{{"by": {n}}}')
            for key in keys:
                barrier.wait(30)
                answers[n].append(start_fresh(journal, key, call))

        threads = [threading.Thread(target=worker, args=(n,)) for n in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for index, key in enumerate(keys):
            first, second = answers[0][index], answers[1][index]
            assert (first is None) != (second is None), key  # one started it
            found = stores[0].journal("race").lookup(key)
            assert found is not None
            assert found == (first or second), key  # the one answered is the one recorded
