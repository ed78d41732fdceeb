"""SQLiteStore's quick save (``_quick_write``: one UPDATE, no read first) writes only when
what it assumes still holds: the run's row at the revision this store knows, no live lease,
no revision taken by another store since; otherwise the save takes the long way (issue 39).
Each test has another store on the same file break one assumption between two saves. A run
deleted and made again by another store is never at a revision the file held before, so
neither the quick save nor the long way's shortcut takes its history for the one it knows,
in a new file or in one laid out before the ``revisions`` table."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from pathlib import Path

import pytest

from agent_fsm.durable import SQLiteStore, sqlite_file
from agent_fsm.durable.sqlite_leases import LEASES_TABLE
from agent_fsm.errors import RunLeased
from agent_fsm.messages import AssistantMessage, UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import AgentState, StopReason
from agent_fsm.testing.store_kit import sample_state


def _next_step(state: RunState, text: str) -> None:
    """The run goes on: a message and a transition more, as a step adds them."""
    state.messages.append(AssistantMessage(content=text))
    state.trace.append((1, state.turns))
    state.turns += 1


def _saved_twice(path: Path) -> tuple[SQLiteStore, RunState]:
    """A store that saved a run twice: its next save of the run can be a quick one."""
    store = SQLiteStore(path)
    state = sample_state()
    store.save(state)
    _next_step(state, "first")
    store.save(state)
    return store, state


def test_saves_of_one_store_load_back_and_list_latest_first(tmp_path: Path) -> None:
    store, state = _saved_twice(tmp_path / "runs.sqlite3")
    other = sample_state("run-2")
    store.save(other)
    for n in range(3):
        _next_step(state, f"step {n}")
        store.save(state)
        assert store.load(state.run_id) == state
    assert [line.run_id for line in store.list_runs()] == ["run-1", "run-2"]
    assert store.list_runs()[0].messages == len(state.messages)


def test_a_save_after_another_stores_save_of_the_run_writes_the_whole_history(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    theirs = dataclasses.replace(state, messages=[UserMessage(content="another history")])
    theirs.trace = [(0, 0)]
    SQLiteStore(path).save(theirs)
    _next_step(state, "mine")
    store.save(state)
    assert SQLiteStore(path).load(state.run_id) == state


def test_a_revision_taken_by_another_store_keeps_the_latest_save_first(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    SQLiteStore(path).save(sample_state("run-2"))  # the highest revision now
    _next_step(state, "mine")
    store.save(state)
    assert [line.run_id for line in SQLiteStore(path).list_runs()] == ["run-1", "run-2"]
    assert SQLiteStore(path).load(state.run_id) == state


def test_a_run_another_store_leased_is_not_written(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    stored = SQLiteStore(path).load(state.run_id)
    SQLiteStore(path).claim(state.run_id, "worker-b", 60.0)
    _next_step(state, "not to be written")
    with pytest.raises(RunLeased, match="worker-b"):
        store.save(state)
    assert SQLiteStore(path).load(state.run_id) == stored


def test_a_cancel_request_is_kept_by_saves_and_cleared_by_the_stop(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    state.state = AgentState.THINK
    store.save(state)
    assert SQLiteStore(path).cancel(state.run_id, "closed") is True
    _next_step(state, "goes on")
    store.save(state)
    assert SQLiteStore(path).list_runs()[0].cancel_requested == "closed"
    state.state = AgentState.ERROR
    _next_step(state, "stopped")
    store.save(state)
    assert SQLiteStore(path).list_runs()[0].cancel_requested is None


def test_a_run_another_store_deleted_is_saved_again_whole(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    SQLiteStore(path).delete(state.run_id)
    _next_step(state, "after the delete")
    store.save(state)
    assert SQLiteStore(path).load(state.run_id) == state


def _made_again(path: Path, state: RunState, saves: int = 2) -> None:
    """Another store deletes the run and makes it again, another history as long as
    ``state``'s, saved ``saves`` times: with revisions taken from the file's highest one
    alone, it would be at the very revision and counts the first store remembers."""
    other = SQLiteStore(path)
    other.delete(state.run_id)
    theirs = sample_state(state.run_id)
    theirs.messages = [UserMessage(content=f"theirs {n}") for n in range(len(state.messages))]
    theirs.trace = [(0, n) for n in range(len(state.trace))]
    for _ in range(saves):
        other.save(theirs)


def test_a_run_deleted_and_made_again_elsewhere_is_not_continued(tmp_path: Path) -> None:
    """The quick save's guard matches the row's revision and counts: the run made again must
    never be at a revision the first store saw, or its save would append onto the other
    history."""
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    _made_again(path, state)
    _next_step(state, "mine")
    store.save(state)
    assert SQLiteStore(path).load(state.run_id) == state


def test_a_run_deleted_and_made_again_elsewhere_is_not_continued_the_long_way(
    tmp_path: Path,
) -> None:
    """The same, when another store took a revision since (the quick save does not apply):
    the long way's shortcut, of a run at the revision and counts the store knows, must not
    take the other history for its own either."""
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    _made_again(path, state)
    SQLiteStore(path).save(sample_state("run-2"))
    _next_step(state, "mine")
    store.save(state)
    assert SQLiteStore(path).load(state.run_id) == state


def _stored_revision(path: Path, run_id: str) -> int:
    with sqlite3.connect(path) as conn:
        return int(
            conn.execute("SELECT revision FROM runs WHERE run_id = ?", (run_id,)).fetchone()[0]
        )


def test_no_revision_is_taken_twice_even_after_deletes(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    mine, theirs = SQLiteStore(path), SQLiteStore(path)
    taken: list[int] = []

    def saved(store: SQLiteStore, state: RunState) -> None:
        _next_step(state, "goes on")
        store.save(state)  # the first save of a run takes the long way, the others are quick
        taken.append(_stored_revision(path, state.run_id))

    state, other = sample_state(), sample_state("run-2")
    saved(mine, state)
    saved(mine, state)
    saved(theirs, other)
    saved(theirs, other)
    theirs.delete(other.run_id)  # the highest revision, deleted
    saved(mine, state)  # the next above what this store knows would be the deleted one's
    theirs.delete(state.run_id)
    again = sample_state()
    saved(theirs, again)
    saved(theirs, again)
    assert len(set(taken)) == len(taken) == 7


def _laid_out_as_4(path: Path, runs_from: Path) -> None:
    """A file as the layout before ``revisions`` (4) lays it out, holding the rows the store
    wrote in ``runs_from`` (a run's rows are the same in both layouts)."""
    with sqlite3.connect(path) as conn:
        conn.executescript(sqlite_file._LAYOUT)
        conn.execute(LEASES_TABLE)
        for statement in (*sqlite_file._QUEUE, *sqlite_file._STOPS):
            conn.execute(statement)
        conn.execute("ATTACH DATABASE ? AS written", (str(runs_from),))
        for table in ("runs", "messages", "trace", "journal"):
            conn.execute(f"INSERT INTO {table} SELECT * FROM written.{table}")
        conn.commit()
        conn.execute("DETACH DATABASE written")
        conn.execute("PRAGMA user_version = 4")


def test_a_file_of_the_layout_before_the_revisions_table_is_upgraded(tmp_path: Path) -> None:
    written = tmp_path / "written.sqlite3"
    with SQLiteStore(written) as writer:
        state = sample_state()
        for n in range(3):
            _next_step(state, f"before the upgrade {n}")
            writer.save(state)
    path = tmp_path / "old.sqlite3"
    _laid_out_as_4(path, written)
    store = SQLiteStore(path)
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_file.LAYOUT_VERSION
        assert conn.execute("SELECT * FROM revisions").fetchall() == [(0,)]
    loaded = store.load(state.run_id)  # the store knows it at revision 3
    assert loaded == state  # nothing lost
    state = loaded
    _made_again(path, state, saves=3)
    _next_step(state, "mine")
    store.save(state)
    assert SQLiteStore(path).load(state.run_id) == state
    with SQLiteStore(path) as again:  # upgraded once
        assert len(again.list_runs()) == 1
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM revisions").fetchone()[0] == 1


# -- the queue's index is left alone by the save of a run going on (layout 6) ----------------


def _wal_pages(path: Path) -> int:
    """The pages written to the file's write-ahead log so far."""
    with sqlite3.connect(path) as conn:
        page = int(conn.execute("PRAGMA page_size").fetchone()[0])
    return os.path.getsize(f"{path}-wal") // (page + 24)  # each frame: a header and a page


def test_a_save_of_a_run_going_on_writes_its_row_revision_and_entries_alone(
    tmp_path: Path,
) -> None:
    """No page of the queue's index: it reads ``stop_reason``, which such a save does not
    name (it named ``state``, which the index read, one page more per save)."""
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    state.trace.append((1, state.turns))  # a transition and no message, as after OBSERVE
    before = _wal_pages(path)
    store.save(state)
    assert _wal_pages(path) - before == 3  # the row, its revision's index entry, the trace's
    assert SQLiteStore(path).load(state.run_id) == state


def test_a_run_saved_going_on_after_its_stop_is_queued_again(tmp_path: Path) -> None:
    """The save after a stop (a run reopened) takes the long way, which writes the stop
    reason back to NULL: the queue's index, which reads it, holds the run again."""
    path = tmp_path / "runs.sqlite3"
    store, state = _saved_twice(path)
    state.state, state.stop_reason = AgentState.DONE, StopReason.FINAL_ANSWER
    _next_step(state, "stopped")
    store.save(state)
    assert store.claim_next("worker", 60.0) is None
    state.state, state.stop_reason = AgentState.OBSERVE, None
    _next_step(state, "reopened")
    store.save(state)  # by the store that saved the stop: it knows the run at that revision
    lease = store.claim_next("worker", 60.0)
    assert lease is not None
    assert lease.run_id == state.run_id
    assert store.list_runs()[0].stop_reason is None


def test_a_file_of_layout_5_takes_its_queue_by_stop_reason(tmp_path: Path) -> None:
    written = tmp_path / "written.sqlite3"
    with SQLiteStore(written) as writer:
        going_on, stopped = sample_state("going-on"), sample_state("stopped")
        writer.save(going_on)
        stopped.state = AgentState.ERROR
        writer.save(stopped)
    path = tmp_path / "old.sqlite3"
    _laid_out_as_4(path, written)
    with sqlite3.connect(path) as conn:
        for statement in sqlite_file._REVISIONS:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 5")
    with SQLiteStore(path) as store:
        lease = store.claim_next("worker", 60.0)
        assert lease is not None
        assert lease.run_id == "going-on"
        assert store.claim_next("worker", 60.0) is None  # the stopped run is not taken
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_file.LAYOUT_VERSION
        (index,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'runs_to_take'"
        ).fetchone()
    assert index.endswith("WHERE stop_reason IS NULL")
