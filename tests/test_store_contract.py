"""Our three stores run the checkpoint-store contract users run on theirs
(``agent_fsm.testing.CheckpointStoreContract``), and the contract catches the stores it must.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import ClassVar, Generic, Protocol
from xml.etree import ElementTree

import pytest

from agent_fsm import CheckpointStore, MemoryStore, SQLiteStore
from agent_fsm.durable.checkpoint import RunLister, RunOpener, RunSaver
from agent_fsm.durable.leases import LeasedWrites, LeaseStore, RunLeases
from agent_fsm.state import RunState
from agent_fsm.testing import CheckpointStoreContract, sample_state

ROOT = Path(__file__).resolve().parent.parent


class TestMemoryStore(CheckpointStoreContract):
    def make_store(self, clock: Callable[[], float]) -> CheckpointStore:
        return MemoryStore(clock=clock)


class TestSQLiteStore(CheckpointStoreContract):
    shares_storage = True

    def make_store(self, clock: Callable[[], float]) -> CheckpointStore:
        return SQLiteStore(self.tmp_path / "runs.sqlite3", clock=clock)


class TestPostgresStore(CheckpointStoreContract):
    shares_storage = True
    leases_from_clock = False  # lease times are the server's

    location: ClassVar[tuple[str, str]]

    @pytest.fixture(autouse=True)
    def _database(self, postgres_url: str, postgres_schema: str) -> None:
        self.location = (postgres_url, postgres_schema)

    def make_store(self, clock: Callable[[], float]) -> CheckpointStore:
        from agent_fsm.durable.postgres import PostgresStore

        url, schema = self.location
        return PostgresStore(url, schema=schema, clock=clock)


def test_the_sample_state_sets_every_field_of_a_run_state() -> None:
    """So the round trip covers every field: a field added to RunState goes into
    ``sample_state`` (agent_fsm/testing/store_kit.py) with a value other than its default."""
    sample, default = sample_state(), RunState(run_id="")
    unset = [
        item.name
        for item in fields(RunState)
        if item.name != "run_id" and getattr(sample, item.name) == getattr(default, item.name)
    ]
    assert not unset, f"sample_state leaves these RunState fields at their default: {unset}"


def _methods(protocol: type) -> set[str]:
    """The public methods ``protocol`` declares, its base protocols' included."""
    skipped = (Protocol, Generic, object)
    return {
        name
        for cls in protocol.__mro__
        if cls not in skipped
        for name in vars(cls)
        if not name.startswith("_")
    }


def test_the_split_protocols_join_in_the_old_names() -> None:
    """Each part holds what one kind of caller needs; ``CheckpointStore`` and ``LeaseStore``
    are still the whole, and every store is both."""
    assert _methods(RunSaver) == {"save", "journal"}
    assert _methods(RunOpener) == {"create", "load", "exists", "delete"}
    assert _methods(RunLister) == {"list_runs"}
    assert _methods(CheckpointStore) == {
        *_methods(RunSaver),
        *_methods(RunOpener),
        *_methods(RunLister),
        "close",
    }
    assert _methods(LeasedWrites) == {"save", "create", "journal"}
    assert _methods(RunLeases) == {"claim", "renew", "release", "lease"}
    assert _methods(LeaseStore) == _methods(LeasedWrites) | _methods(RunLeases)


@pytest.mark.parametrize("make", [MemoryStore, lambda: SQLiteStore(":memory:")])
def test_every_store_is_both_a_checkpoint_store_and_a_lease_store(
    make: Callable[[], CheckpointStore],
) -> None:
    store = make()
    assert isinstance(store, CheckpointStore)
    assert isinstance(store, LeaseStore)
    store.close()


_BROKEN = """
import dataclasses

from agent_fsm import MemoryStore
from agent_fsm.durable.encoding import (
    CHECKPOINT_SCHEMA_VERSION,
    decode_header,
    summarize,
    unknown_run,
)
from agent_fsm.durable.journal import MemoryJournal
from agent_fsm.testing import CheckpointStoreContract


class RewritesEverything(MemoryStore):
    def save(self, state, *, lease=None):
        if state.run_id in self._runs:
            self._runs[state.run_id].messages.clear()
            self._runs[state.run_id].trace.clear()
        super().save(state, lease=lease)


class DropsNotes(MemoryStore):
    def save(self, state, *, lease=None):
        super().save(dataclasses.replace(state, notes={}), lease=lease)


class CreateOverwrites(MemoryStore):
    def create(self, state, *, lease=None):
        self.save(state, lease=lease)
        return True


class KeepsJournals(MemoryStore):
    def delete(self, run_id):
        journal = self._journals.get(run_id)
        super().delete(run_id)
        if journal is not None:
            self._journals[run_id] = journal


class UnfencedJournal(MemoryStore):
    def journal(self, run_id, *, lease=None):
        return self._journals.setdefault(run_id, MemoryJournal())


class IgnoresVersions(MemoryStore):
    def load(self, run_id):
        stored = self._runs[run_id]  # as if every header were of this version
        state = decode_header(run_id, CHECKPOINT_SCHEMA_VERSION, stored.header)
        state.messages, state.trace = list(stored.messages), list(stored.trace)
        return state


class ListsByClock(MemoryStore):
    def list_runs(self, limit=None):
        summaries = [run.summary for run in self._runs.values()]
        runs = sorted(summaries, key=lambda run: run.updated_at, reverse=True)
        return runs if limit is None else runs[: max(limit, 0)]


class LoadsToList(MemoryStore):
    def list_runs(self, limit=None, *, states=None):
        runs = super().list_runs(limit, states=states)
        return [
            summarize(self.load(run.run_id), created_at=run.created_at, updated_at=run.updated_at)
            for run in runs
        ]


class ForgetsStates(MemoryStore):
    def list_runs(self, limit=None, *, states=None):
        return super().list_runs(limit)


class TakesAnyId(MemoryStore):
    def load(self, run_id):
        if run_id not in self._runs:
            raise unknown_run(run_id)
        return super().load(run_id)


def _contract(store):
    class Contract(CheckpointStoreContract):
        def make_store(self, clock):
            return store(clock=clock)

    return Contract


TestRewritesEverything = _contract(RewritesEverything)
TestDropsNotes = _contract(DropsNotes)
TestCreateOverwrites = _contract(CreateOverwrites)
TestKeepsJournals = _contract(KeepsJournals)
TestUnfencedJournal = _contract(UnfencedJournal)
TestIgnoresVersions = _contract(IgnoresVersions)
TestListsByClock = _contract(ListsByClock)
TestLoadsToList = _contract(LoadsToList)
TestForgetsStates = _contract(ForgetsStates)
TestTakesAnyId = _contract(TakesAnyId)
"""

_CAUGHT = {
    "TestRewritesEverything": {"test_a_save_writes_only_what_is_new"},
    "TestDropsNotes": {
        "test_a_saved_state_loads_equal",
        "test_every_save_of_a_growing_run_loads_equal",
    },
    "TestCreateOverwrites": {"test_create_saves_a_new_run_and_refuses_a_taken_id"},
    "TestKeepsJournals": {"test_delete_removes_the_run_and_its_journal_and_nothing_else"},
    "TestUnfencedJournal": {
        "test_a_taken_over_lease_fences_every_write_of_its_old_holder",
        "test_a_write_without_a_lease_is_refused_while_one_is_live",
    },
    "TestIgnoresVersions": {
        "test_a_checkpoint_of_a_newer_schema_is_refused",
        "test_a_checkpoint_of_an_older_schema_is_migrated_step_by_step",
        "test_an_older_schema_without_a_migration_is_refused",
    },
    "TestListsByClock": {"test_list_runs_orders_by_the_saves_even_when_the_clock_stands_still"},
    "TestLoadsToList": {
        "test_list_runs_lists_a_run_it_cannot_read_among_the_others",
        "test_a_schema_version_that_is_not_an_integer_is_a_checkpoint_error",
    },
    "TestForgetsStates": {"test_list_runs_by_state"},
    "TestTakesAnyId": {"test_an_id_some_store_could_not_keep_is_refused_by_every_method"},
}
"""Each broken store, and the tests of the contract that must fail on it."""


def test_the_contract_catches_broken_stores(tmp_path: Path) -> None:
    """Stores with one rule broken each, run through the contract as a user would (pytest
    on a file of theirs): each fails the tests of its rule."""
    (tmp_path / "test_broken_stores.py").write_text(_BROKEN)
    failed: dict[str, set[str]] = {}
    for case in _pytest(tmp_path).iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            cls = case.get("classname", "").rsplit(".", 1)[-1]
            failed.setdefault(cls, set()).add(case.get("name", "").split("[")[0])
    for cls, expected in _CAUGHT.items():
        assert expected <= failed.get(cls, set()), (cls, failed.get(cls))


def _pytest(directory: Path) -> ElementTree.ElementTree:
    """Run pytest on ``directory`` as a user would, in a process of its own; its report."""
    report = directory / "report.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}"],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return ElementTree.parse(report)


def test_the_guide_to_stores_runs_the_contract_on_its_store(tmp_path: Path) -> None:
    """docs/stores.md's python blocks, in order, are a test module: its store passes."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "docs" / "stores.md").read_text(), re.S)
    assert len(blocks) == 2
    (tmp_path / "test_key_value_store.py").write_text("\n".join(blocks))
    cases = list(_pytest(tmp_path).iter("testcase"))
    outcomes = {case.get("name"): next((child.tag for child in case), "passed") for case in cases}
    assert not [name for name, outcome in outcomes.items() if outcome in ("failure", "error")]
    assert list(outcomes.values()).count("passed") >= 25
    skipped = {name for name, outcome in outcomes.items() if outcome == "skipped"}
    assert "test_a_claimed_run_is_refused_to_another_worker_naming_the_holder" in skipped
