"""The checkpoint-store contract: a pytest suite a store of your own runs, as ours do.

Everything the engine relies on when it saves, reopens, lists and leases runs, checked on
your store (``docs/stores.md`` walks through it)::

    from agent_fsm.testing import CheckpointStoreContract

    class TestMyStore(CheckpointStoreContract):
        shares_storage = True      # two make_store calls of one test open one storage

        def make_store(self, clock):
            return MyStore(self.tmp_path / "runs.db", clock=clock)

The suite checks the interfaces of ``durable.checkpoint`` (here), ``durable.journal``
(``journal_contract``) and, for a store that leases runs (a ``LeaseStore``),
``durable.leases`` (``lease_contract``): their docstrings are the contract, these tests its
letter; for a store that also queues and cancels runs (``RunQueue``, ``RunCancels``),
``durable.queue`` (``queue_contract``). Flags on your class say what the suite may expect:
``shares_storage``, ``timestamps_from_clock``, ``leases_from_clock``
(``StoreContractBase``). Tests that need what your store does not offer are skipped, saying
why.

Schema versions: the suite plays an older and a newer agent_fsm by changing
``durable.encoding``'s ``CHECKPOINT_SCHEMA_VERSION`` and ``MIGRATIONS`` for one test, so a
store must write through ``encode_header`` (storing the version it returns beside the header)
and read through ``decode_header``, as ours do.
"""

from __future__ import annotations

import concurrent.futures
import copy
import threading
from typing import Any

import pytest

from agent_fsm.durable import encoding
from agent_fsm.durable.checkpoint import (
    CheckpointStore,
    ForwardSaves,
    RunLister,
    RunOpener,
    RunSaver,
)
from agent_fsm.durable.encoding import summarize
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import LeasedWrites, LeaseStore, RunLeases
from agent_fsm.durable.queue import RunCancels, RunQueue
from agent_fsm.errors import CheckpointError, ConfigError
from agent_fsm.messages import AssistantMessage, ToolCall, UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import AgentState, StopReason
from agent_fsm.testing.journal_contract import JournalContract
from agent_fsm.testing.lease_contract import LeaseContract
from agent_fsm.testing.queue_contract import QueueContract
from agent_fsm.testing.store_kit import BAD_ID_NAMES, BAD_IDS, add_turn, refuses, sample_state

__all__ = ["CheckpointStoreContract"]


class CheckpointStoreContract(JournalContract, LeaseContract, QueueContract):
    """Subclass it as ``Test<YourStore>`` and define ``make_store(self, clock)``: pytest then
    runs the whole contract on your store. See the module's docstring."""

    # -- the interfaces ---------------------------------------------------------------------

    def test_the_store_implements_the_protocols(self) -> None:
        store = self.open_store()
        for protocol in (RunSaver, RunOpener, RunLister, CheckpointStore):
            assert isinstance(store, protocol), f"not a {protocol.__name__}"
        assert isinstance(store.journal("r"), ToolJournal)
        leasing = [name for name in ("claim", "renew", "release", "lease") if hasattr(store, name)]
        if leasing:  # a store that leases runs does all of it (the lease tests run on it)
            missing = [p.__name__ for p in (LeasedWrites, RunLeases) if not isinstance(store, p)]
            assert isinstance(store, LeaseStore), f"it has {leasing}, but is no {missing}"
        queueing = [name for name in ("enqueue", "claim_next", "cancel") if hasattr(store, name)]
        if queueing:  # a store that queues runs cancels them too, under leases
            missing = [
                p.__name__ for p in (LeaseStore, RunQueue, RunCancels) if not isinstance(store, p)
            ]
            assert not missing, f"it has {queueing}, but is no {missing}"

    # -- round trips --------------------------------------------------------------------------

    def test_a_saved_state_loads_equal(self) -> None:
        store = self.open_store()
        state = sample_state()
        store.save(state)
        loaded = store.load("run-1")
        assert loaded == state
        assert loaded is not state
        assert store.exists("run-1")

    def test_an_empty_run_loads_equal(self) -> None:
        store = self.open_store()
        store.save(RunState(run_id="empty"))
        assert store.load("empty") == RunState(run_id="empty")

    def test_every_save_of_a_growing_run_loads_equal(self) -> None:
        store = self.open_store()
        state = sample_state()
        for n in range(4):
            add_turn(state, n)
            state.notes["turn"] = n
            store.save(state)
            assert store.load("run-1") == state

    def test_a_saved_checkpoint_does_not_follow_the_live_state(self) -> None:
        store = self.open_store()
        state = sample_state()
        store.save(state)
        snapshot = copy.deepcopy(state)
        add_turn(state, 1)
        state.turns = 99
        state.notes["plan"].append("more")
        state.loop.period_matches[0] = 7
        state.pending_input.append("more")
        assert store.load("run-1") == snapshot
        loaded = store.load("run-1")
        loaded.messages.clear()
        loaded.notes.clear()
        assert store.load("run-1") == snapshot

    def test_unknown_run_ids(self) -> None:
        store = self.open_store()
        with pytest.raises(CheckpointError, match="'nope'"):
            store.load("nope")
        assert not store.exists("nope")
        store.delete("nope")  # not an error
        assert store.list_runs() == []
        assert store.journal("nope").lookup("1:0:c") is None

    # -- hostile input: one answer from every store ------------------------------------------

    @pytest.mark.parametrize("run_id", BAD_IDS, ids=BAD_ID_NAMES)
    def test_an_id_some_store_could_not_keep_is_refused_by_every_method(self, run_id: str) -> None:
        """A lone surrogate (UTF-8 cannot encode it), a NUL (PostgreSQL's text refuses it),
        an id longer than PostgreSQL indexes: ``ConfigError`` from every method, before the
        store touches its storage (``durable.leases.check_id``), never a driver's error."""
        store = self.open_store()
        calls = {
            "save": lambda: store.save(RunState(run_id=run_id)),
            "create": lambda: store.create(RunState(run_id=run_id)),
            "load": lambda: store.load(run_id),
            "exists": lambda: store.exists(run_id),
            "delete": lambda: store.delete(run_id),
            "journal": lambda: store.journal(run_id).lookup("1:0:c"),
        }
        assert [name for name, call in calls.items() if not refuses(call)] == []
        assert store.list_runs() == []

    def test_lone_surrogates_in_notes_are_saved_as_u_fffd(self) -> None:
        """The user's notes may hold text UTF-8 cannot encode (a custom state copied a file
        name): the save keeps the run going, with each lone surrogate made U+FFFD, as the
        transcript's text is cleaned; the live state is left as it is."""
        store = self.open_store()
        state = sample_state()
        state.notes = {"file": "half \ud83d", "k\udc00": ["\ud800x", {"deep": "\udfff"}], "n": 1}
        state.output = "a lone \ud83d in the answer"
        store.save(state)
        loaded = store.load("run-1")
        assert loaded.notes == {
            "file": "half \ufffd",
            "k\ufffd": ["\ufffdx", {"deep": "\ufffd"}],
            "n": 1,
        }
        assert loaded.output == "a lone \ufffd in the answer"
        assert loaded.messages == state.messages
        assert state.notes["file"] == "half \ud83d"
        add_turn(loaded, 1)
        store.save(loaded)  # the cleaned state saves as usual
        assert store.load("run-1") == loaded

    def test_a_note_that_is_not_json_is_a_checkpoint_error_naming_it(self) -> None:
        store = self.open_store()
        state = sample_state()
        store.save(state)
        broken = copy.deepcopy(state)
        broken.notes["when"] = object()
        add_turn(broken, 1)
        with pytest.raises(CheckpointError, match=r"run 'run-1' cannot be saved: notes\['when'\]"):
            store.save(broken)
        assert store.load("run-1") == state  # the last checkpoint stands
        with pytest.raises(CheckpointError, match=r"notes\['when'\]"):
            store.create(RunState(run_id="new", notes={"when": object()}))
        assert not store.exists("new")

    # -- saves write what is new --------------------------------------------------------------

    def test_a_save_writes_only_what_is_new(self) -> None:
        """The transcript and the trace are append-only, so a save compares at most the last
        stored entry and writes the rest: an entry stored earlier is not written again. (A
        run never edits one; this test does, to see that it was not rewritten.)"""
        store = self.open_store()
        state = sample_state()
        store.save(state)
        first_message, first_step = state.messages[1], state.trace[0]
        state.messages[1] = UserMessage(content="never sent")
        state.trace[0] = (99, 99)
        add_turn(state, 1)
        store.save(state)
        loaded = store.load("run-1")
        assert (loaded.messages[1], loaded.trace[0]) == (first_message, first_step)
        assert loaded.messages[2:] == state.messages[2:]
        assert loaded.trace[1:] == state.trace[1:]

    def test_a_run_restored_from_an_older_checkpoint_and_continued(self) -> None:
        store = self.open_store()
        state = sample_state()
        store.save(state)
        older = store.load("run-1")
        add_turn(state, 1)
        add_turn(state, 2)
        store.save(state)
        store.save(older)  # the run was resumed from the older checkpoint
        assert store.load("run-1") == older
        add_turn(older, 9)
        store.save(older)
        assert store.load("run-1") == older

    @pytest.mark.parametrize("length", ["shorter", "as long", "longer"])
    def test_a_different_history_under_the_same_id_replaces_the_stored_one(
        self, length: str
    ) -> None:
        store = self.open_store()
        stored = sample_state()
        add_turn(stored, 1)
        store.save(stored)
        other = sample_state()
        other.messages.append(AssistantMessage(content="a different ending"))
        other.messages.append(AssistantMessage(content="and more"))
        other.trace.extend([(7, 9), (8, 9), (9, 9), (7, 9)])
        if length == "shorter":
            del other.messages[-1], other.trace[-1]
        elif length == "longer":
            add_turn(other, 2)
        store.save(other)
        assert store.load("run-1") == other

    @pytest.mark.parametrize("differs", ["messages", "trace"])
    def test_a_history_is_told_apart_by_either_list(self, differs: str) -> None:
        """A different history whose last message is the stored one but whose last step is
        not (or the other way round) still replaces the stored history whole: the
        transcript and the trace are one history, never a mix of two."""
        store = self.open_store()
        stored = sample_state()
        add_turn(stored, 1)
        store.save(stored)
        other = copy.deepcopy(stored)
        other.messages[1] = UserMessage(content="another question")
        other.trace[0] = (9, 0)
        if differs == "messages":
            other.messages[-1] = AssistantMessage(content="another ending")
        else:
            other.trace[-1] = (9, 9)
        store.save(other)
        assert store.load("run-1") == other

    # -- create, delete -------------------------------------------------------------------------

    def test_create_saves_a_new_run_and_refuses_a_taken_id(self) -> None:
        store = self.open_store()
        first = sample_state()
        assert store.create(first) is True
        assert store.load("run-1") == first
        assert store.create(RunState(run_id="run-1", turns=99)) is False
        assert store.load("run-1") == first
        store.save(RunState(run_id="saved"))
        assert store.create(RunState(run_id="saved", turns=1)) is False

    def test_a_save_unless_behind_never_takes_a_run_back(self) -> None:
        """``ForwardSaves``: a later activation, or further along the same one, is never
        overwritten by an earlier point; the same point or a later one is saved."""
        store = self.open_store()
        if not isinstance(store, ForwardSaves):
            pytest.skip("the store offers no save_unless_behind (checkpoint.ForwardSaves)")
        stop = sample_state("forward")
        stop.resumed_at = []
        resumed = copy.deepcopy(stop)
        resumed.resumed_at = [len(resumed.trace)]
        further = copy.deepcopy(stop)
        add_turn(further, 1)
        add_turn(further, 2)  # longer than the resumed run, but an earlier activation
        assert store.save_unless_behind(stop) is True  # a new run
        assert store.save_unless_behind(stop) is True  # the same point again
        assert store.save_unless_behind(resumed) is True
        for earlier in (stop, further):
            assert store.save_unless_behind(earlier) is False
            stored = store.load("forward")
            assert (stored.resumed_at, len(stored.trace)) == (
                resumed.resumed_at,
                len(resumed.trace),
            )
        add_turn(resumed, 3)
        assert store.save_unless_behind(resumed) is True
        assert store.load("forward") == resumed

    def test_delete_removes_the_run_and_its_journal_and_nothing_else(self) -> None:
        store = self.open_store()
        store.save(sample_state("a"))
        store.save(sample_state("b"))
        call = ToolCall(id="c1", name="add")
        store.journal("a").record_started("k", call)
        store.journal("b").record_started("k", call)
        store.delete("a")
        assert not store.exists("a")
        with pytest.raises(CheckpointError, match="'a'"):
            store.load("a")
        assert store.journal("a").lookup("k") is None
        assert [run.run_id for run in store.list_runs()] == ["b"]
        assert store.load("b") == sample_state("b")
        assert store.journal("b").lookup("k") is not None
        assert store.create(RunState(run_id="a", turns=5)) is True  # the id is free again
        assert store.load("a") == RunState(run_id="a", turns=5)

    # -- list_runs ------------------------------------------------------------------------------

    def test_list_runs_most_recently_saved_first_with_their_summaries(self) -> None:
        store = self.open_store()
        start = self.clock()
        for run_id in ("a", "b", "c"):
            store.save(RunState(run_id=run_id))
            self.clock.advance(1.0)
        state = sample_state("a")
        store.save(state)
        runs = store.list_runs()
        assert [run.run_id for run in runs] == ["a", "c", "b"]
        if self.timestamps_from_clock:
            assert runs[0] == summarize(state, created_at=start, updated_at=start + 3)
            assert (runs[1].created_at, runs[1].updated_at) == (start + 2, start + 2)
        else:
            assert runs[0] == summarize(
                state, created_at=runs[0].created_at, updated_at=runs[0].updated_at
            )
            assert runs[0].created_at <= runs[0].updated_at
        assert runs[1].last_row is None

    def test_list_runs_orders_by_the_saves_even_when_the_clock_stands_still(self) -> None:
        store = self.open_store()
        for run_id in ("x", "y", "z", "y"):
            store.save(RunState(run_id=run_id))
        assert [run.run_id for run in store.list_runs()] == ["y", "z", "x"]

    def test_list_runs_limit(self) -> None:
        store = self.open_store()
        for run_id in ("a", "b", "c"):
            store.save(RunState(run_id=run_id))
        assert [run.run_id for run in store.list_runs(limit=2)] == ["c", "b"]
        assert [run.run_id for run in store.list_runs(limit=None)] == ["c", "b", "a"]
        assert [run.run_id for run in store.list_runs(limit=5)] == ["c", "b", "a"]
        assert store.list_runs(limit=0) == []
        assert store.list_runs(limit=-1) == []

    def test_list_runs_by_state(self) -> None:
        """``states=``: one state or several, a custom state by its name; the order and the
        limit are those of the runs kept."""
        store = self.open_store()
        for run_id, state in [
            ("done", AgentState.DONE),
            ("thinking", AgentState.THINK),
            ("failed", AgentState.ERROR),
            ("triage", "TRIAGE"),
            ("done-too", AgentState.DONE),
        ]:
            store.save(RunState(run_id=run_id, state=state))

        def listed(**options: Any) -> list[str]:
            return [run.run_id for run in store.list_runs(**options)]

        assert listed(states=AgentState.DONE) == ["done-too", "done"]
        assert listed(states=["ERROR", "TRIAGE", "DONE"]) == [
            "done-too",
            "triage",
            "failed",
            "done",
        ]
        assert listed(states=("TRIAGE",)) == ["triage"]
        assert listed(states=[AgentState.DONE], limit=1) == ["done-too"]
        assert listed(states=[]) == []
        assert listed(states=["OBSERVE"]) == []
        assert len(listed(states=None)) == 5

    def test_list_runs_by_stop_reason_with_the_cost(self) -> None:
        """``stop_reasons=``: one reason or several (a ``StopReason`` or its value), a None
        among them for the stopped runs that recorded none; the reason is listed only for a
        run whose last save stopped (a run resumed from a stop is going again, and kept by
        no stop), the cost as saved; combined with ``states=``, and the limit counts the
        runs kept."""
        store = self.open_store()
        for run_id, state, stop, cost in [
            ("done", AgentState.DONE, StopReason.FINAL_ANSWER, 0.5),
            ("asking", AgentState.DONE, StopReason.ASK_USER, None),
            ("failed", AgentState.ERROR, StopReason.TIMEOUT, 0.25),
            ("resumed", AgentState.THINK, StopReason.ASK_USER, 0.0),  # a stale reason
            ("unrecorded", AgentState.DONE, None, None),
            ("done-too", AgentState.DONE, StopReason.FINAL_ANSWER, 1.0),
        ]:
            store.save(RunState(run_id=run_id, state=state, stop_reason=stop, cost=cost))

        def listed(**options: Any) -> list[str]:
            return [run.run_id for run in store.list_runs(**options)]

        by_id = {run.run_id: run for run in store.list_runs()}
        assert by_id["done"].stop_reason is StopReason.FINAL_ANSWER
        assert by_id["done"].cost == 0.5
        assert by_id["asking"].cost is None
        assert by_id["resumed"].stop_reason is None
        assert by_id["resumed"].cost == 0.0
        assert by_id["unrecorded"].stop_reason is None
        assert listed(stop_reasons=StopReason.FINAL_ANSWER) == ["done-too", "done"]
        assert listed(stop_reasons="final_answer", limit=1) == ["done-too"]
        assert listed(stop_reasons=["timeout", StopReason.ASK_USER]) == ["failed", "asking"]
        assert listed(stop_reasons=[StopReason.ASK_USER, None]) == ["unrecorded", "asking"]
        assert listed(stop_reasons=[None], states=[AgentState.DONE]) == ["unrecorded"]
        assert listed(stop_reasons=["final_answer"], states="ERROR") == []
        assert listed(stop_reasons=[]) == []
        assert listed(stop_reasons=StopReason.MAX_TOKENS) == []
        assert len(listed(stop_reasons=None)) == 6
        with pytest.raises(ConfigError, match="not_a_reason"):
            store.list_runs(stop_reasons=["not_a_reason"])

    def test_list_runs_lists_a_run_it_cannot_read_among_the_others(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """One run of a newer schema (or an otherwise unreadable one) hides no other: it is
        listed with ``unreadable`` saying why, and ``load`` refuses it by name."""
        store = self.open_store()
        store.save(RunState(run_id="a"))
        newer = encoding.CHECKPOINT_SCHEMA_VERSION + 4
        with monkeypatch.context() as patched:
            patched.setattr(encoding, "CHECKPOINT_SCHEMA_VERSION", newer)
            store.save(RunState(run_id="b", state=AgentState.THINK))
        store.save(RunState(run_id="c"))
        runs = store.list_runs()
        assert [run.run_id for run in runs] == ["c", "b", "a"]
        assert [run.unreadable for run in (runs[0], runs[2])] == [None, None]
        assert runs[1].unreadable is not None
        assert f"newer agent_fsm (checkpoint schema version {newer}" in runs[1].unreadable
        assert runs[1].state is AgentState.THINK  # what could be read is listed
        assert not runs[1].stuck
        with pytest.raises(CheckpointError, match="'b' was written by a newer agent_fsm"):
            store.load("b")

    # -- schema versions --------------------------------------------------------------------

    def _save_as_version(
        self, store: CheckpointStore, version: object, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with monkeypatch.context() as patched:
            patched.setattr(encoding, "CHECKPOINT_SCHEMA_VERSION", version)
            store.save(sample_state())

    def test_a_checkpoint_of_a_newer_schema_is_refused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = self.open_store()
        newer = encoding.CHECKPOINT_SCHEMA_VERSION + 4
        self._save_as_version(store, newer, monkeypatch)
        with pytest.raises(CheckpointError, match=rf"written by a newer agent_fsm.*\b{newer}\b"):
            store.load("run-1")

    def test_a_checkpoint_of_an_older_schema_is_migrated_step_by_step(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = self.open_store()
        self._save_as_version(store, 1, monkeypatch)

        def one_to_two(header: dict[str, Any]) -> dict[str, Any]:
            header["output"] = "v2"
            return header

        def two_to_three(header: dict[str, Any]) -> dict[str, Any]:
            return {**header, "output": header["output"] + "+v3", "turns": header["turns"] * 10}

        monkeypatch.setattr(encoding, "CHECKPOINT_SCHEMA_VERSION", 3)
        monkeypatch.setattr(encoding, "MIGRATIONS", {1: one_to_two, 2: two_to_three})
        expected = sample_state()
        expected.output, expected.turns = "v2+v3", 30
        assert store.load("run-1") == expected
        store.save(store.load("run-1"))  # written as version 3 now: not migrated again
        assert store.load("run-1") == expected

    def test_an_older_schema_without_a_migration_is_refused(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = self.open_store()
        self._save_as_version(store, 1, monkeypatch)
        monkeypatch.setattr(encoding, "CHECKPOINT_SCHEMA_VERSION", 3)
        monkeypatch.setattr(encoding, "MIGRATIONS", {1: lambda header: header})
        with pytest.raises(CheckpointError, match="no migration from version 2 to 3"):
            store.load("run-1")

    def test_a_migration_that_breaks_the_header_is_an_error(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        store = self.open_store()
        self._save_as_version(store, 1, monkeypatch)
        monkeypatch.setattr(encoding, "CHECKPOINT_SCHEMA_VERSION", 2)
        monkeypatch.setattr(encoding, "MIGRATIONS", {1: lambda header: {"turns": "many"}})
        with pytest.raises(CheckpointError, match="'run-1' is unreadable"):
            store.load("run-1")

    @pytest.mark.parametrize("error", [AttributeError, TypeError, KeyError, IndexError])
    def test_a_header_that_does_not_fit_its_version_is_a_checkpoint_error(
        self, error: type[Exception], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A header whose fields have the wrong JSON type for its version makes a migration
        fail with whatever it trips over: ``load`` raises ``CheckpointError`` naming the run,
        and ``list_runs`` still lists every run."""
        store = self.open_store()
        self._save_as_version(store, 1, monkeypatch)
        store.save(RunState(run_id="other"))

        def trips(header: dict[str, Any]) -> dict[str, Any]:
            raise error("approvals")

        monkeypatch.setattr(encoding, "CHECKPOINT_SCHEMA_VERSION", 3)
        monkeypatch.setattr(encoding, "MIGRATIONS", {1: trips, 2: lambda header: header})
        with pytest.raises(
            CheckpointError,
            match=rf"'run-1' is unreadable: .*does not fit schema version 1.*{error.__name__}",
        ):
            store.load("run-1")
        assert [run.run_id for run in store.list_runs()] == ["other", "run-1"]
        assert store.load("other") == RunState(run_id="other")

    @pytest.mark.parametrize("version", ["three", None])
    def test_a_schema_version_that_is_not_an_integer_is_a_checkpoint_error(
        self, version: object, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A store may refuse to write such a version (a typed column): then ``CheckpointError``
        and nothing written. If it keeps it, ``load`` refuses it by name, and ``list_runs``
        lists the run as unreadable among the others."""
        store = self.open_store()
        store.save(RunState(run_id="other"))
        try:
            self._save_as_version(store, version, monkeypatch)
        except CheckpointError:
            assert not store.exists("run-1")
            return
        with pytest.raises(CheckpointError, match=r"'run-1' has schema version .* not an integer"):
            store.load("run-1")
        runs = store.list_runs()
        assert [run.run_id for run in runs] == ["run-1", "other"]
        assert runs[0].unreadable is not None
        assert "not an integer" in runs[0].unreadable
        assert runs[1].unreadable is None

    # -- several stores on one storage (shares_storage) ------------------------------------------

    def test_two_stores_on_one_storage_and_the_last_writer_wins(self) -> None:
        first, second = self.open_store(), self.open_shared()
        state = sample_state()
        first.save(state)
        resumed = second.load("run-1")
        assert resumed == state
        add_turn(resumed, 1)
        add_turn(resumed, 2)
        second.save(resumed)
        assert first.load("run-1") == resumed
        add_turn(state, 7)  # first goes on from its older state: one history, never a mix
        first.save(state)
        assert second.load("run-1") == state
        second.save(RunState(run_id="other"))
        assert [run.run_id for run in first.list_runs()] == ["other", "run-1"]

    def test_a_store_goes_by_what_is_stored_not_by_what_it_saw(self) -> None:
        """Another store rewrote the run with a history as long as the one this store saved
        last: this store's next save must not append to the other's history."""
        first, second = self.open_store(), self.open_shared()
        older = sample_state()
        first.save(older)
        state = copy.deepcopy(older)
        add_turn(state, 1)
        first.save(state)  # first saw 9 messages, ending with its own
        theirs = second.load("run-1")
        del theirs.messages[-2:], theirs.trace[-4:]
        add_turn(theirs, 5)  # as long, another ending
        second.save(theirs)
        add_turn(state, 2)
        first.save(state)  # the last writer: its history, whole
        assert second.load("run-1") == state

    def test_of_many_stores_creating_one_run_exactly_one_wins(self) -> None:
        stores = [self.open_store(), *(self.open_shared() for _ in range(5))]
        barrier = threading.Barrier(len(stores))

        def start(store: CheckpointStore, n: int) -> bool:
            barrier.wait()
            return store.create(RunState(run_id="job-7", turns=n))

        with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
            won = list(pool.map(start, stores, range(len(stores))))
        assert won.count(True) == 1
        assert stores[0].load("job-7").turns == won.index(True)
