"""SQLiteStore's quick save (``_quick_write``: one UPDATE, no read first) writes only when
what it assumes still holds: the run's row at the revision this store knows, no live lease,
no revision taken by another store since; otherwise the save takes the long way (issue 39).
Each test has another store on the same file break one assumption between two saves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agent_fsm.durable import SQLiteStore
from agent_fsm.errors import RunLeased
from agent_fsm.messages import AssistantMessage, UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import AgentState
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
