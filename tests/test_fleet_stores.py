"""The stores' side of a fleet (issue 34): the queue's protocols, the layouts that hold it
(and the upgrade of older ones), the index ``claim_next`` walks, ``agent-fsm cancel`` and
``runs`` on SQLite and PostgreSQL, and the fleet as OpenTelemetry gauges."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from agent_fsm import CheckpointStore, MemoryStore, SQLiteStore
from agent_fsm.cli import main
from agent_fsm.durable import RunCancels, RunQueue, sqlite_file
from agent_fsm.durable.queue import STOPPED_SQL
from agent_fsm.errors import CheckpointError
from agent_fsm.otel import FleetMetrics
from agent_fsm.state import RunState
from agent_fsm.table import AgentState
from agent_fsm.testing.store_kit import ContractClock
from tests.stores import Opener


def test_the_queue_is_split_by_who_calls_it() -> None:
    """Producers and workers call ``RunQueue``, operators ``RunCancels``."""

    def declared(protocol: type) -> set[str]:
        return {name for name in vars(protocol) if not name.startswith("_")}

    assert declared(RunQueue) == {"enqueue", "claim_next"}
    assert declared(RunCancels) == {"cancel"}


@pytest.mark.parametrize("make", [MemoryStore, lambda: SQLiteStore(":memory:")])
def test_every_store_queues_and_cancels_runs(make: Any) -> None:
    store = make()
    assert isinstance(store, RunQueue)
    assert isinstance(store, RunCancels)
    store.close()


def test_the_stopped_states_in_sql() -> None:
    assert STOPPED_SQL == "('DONE', 'ERROR')"


# -- layouts -----------------------------------------------------------------------------------

_LAYOUT_2 = """
CREATE TABLE runs (run_id TEXT PRIMARY KEY, schema_version INTEGER NOT NULL,
    header TEXT NOT NULL, state TEXT NOT NULL, turns INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL, message_count INTEGER NOT NULL,
    trace_count INTEGER NOT NULL, last_row INTEGER, output TEXT, error TEXT,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, revision INTEGER NOT NULL);
CREATE INDEX runs_by_revision ON runs (revision);
CREATE TABLE messages (run_id TEXT NOT NULL, idx INTEGER NOT NULL, json TEXT NOT NULL,
    PRIMARY KEY (run_id, idx));
CREATE TABLE trace (run_id TEXT NOT NULL, idx INTEGER NOT NULL, row INTEGER NOT NULL,
    turn INTEGER NOT NULL, PRIMARY KEY (run_id, idx)) WITHOUT ROWID;
CREATE TABLE journal (run_id TEXT NOT NULL, key TEXT NOT NULL, call TEXT NOT NULL,
    status TEXT NOT NULL, result TEXT, PRIMARY KEY (run_id, key));
CREATE TABLE leases (run_id TEXT PRIMARY KEY, owner TEXT NOT NULL, token INTEGER NOT NULL,
    expires_at REAL NOT NULL);
INSERT INTO runs VALUES ('old', 3, '{"run_id": "old", "state": "THINK"}', 'THINK', 0, 0, 0,
    0, NULL, NULL, NULL, 1.0, 1.0, 1);
PRAGMA user_version = 2;
"""
"""A file of the layout before the queue (agent_fsm's layout 2), holding one run mid-way."""


def test_a_sqlite_file_of_the_layout_before_the_queue_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with sqlite3.connect(path) as conn:
        conn.executescript(_LAYOUT_2)
    with SQLiteStore(path) as store:
        assert store.load("old") == RunState(run_id="old", state=AgentState.THINK)
        assert [(run.run_id, run.priority) for run in store.list_runs()] == [("old", 0)]
        lease = store.claim_next("w", 60)
        assert lease is not None
        assert lease.run_id == "old"
        store.save(RunState(run_id="old", state=AgentState.DONE), lease=lease)
        assert store.cancel("old", "x") is False
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == sqlite_file.LAYOUT_VERSION


def test_sqlite_claims_the_next_run_along_its_partial_index(tmp_path: Path) -> None:
    from agent_fsm.durable import sqlite as sqlite_store

    path = tmp_path / "runs.sqlite3"
    SQLiteStore(path).close()
    with sqlite3.connect(path) as conn:
        plan = conn.execute("EXPLAIN QUERY PLAN " + sqlite_store._NEXT_RUN, (0.0,)).fetchall()
    assert "USING INDEX runs_to_take" in " ".join(str(step) for step in plan)


def test_a_postgres_schema_of_the_layout_before_the_queue_is_upgraded(
    admin: Any, postgres_url: str, postgres_schema: str
) -> None:
    from psycopg import sql

    from agent_fsm.durable import postgres_rows as rows
    from agent_fsm.durable.postgres import PostgresStore

    admin.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(postgres_schema)))
    for statement in rows.LAYOUT:  # layout 1: before the queue
        admin.execute(statement)
    admin.execute(
        'INSERT INTO runs VALUES (\'old\', 3, \'{"run_id": "old", "state": "THINK"}\','
        " 'THINK', 0, 0, 0, 0, NULL, NULL, NULL, 1.0, 1.0, nextval('revisions'))"
    )
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        assert store.load("old") == RunState(run_id="old", state=AgentState.THINK)
        lease = store.claim_next("w", 60)
        assert lease is not None
        assert lease.run_id == "old"
    assert admin.execute("SELECT version FROM layout").fetchall() == [(rows.LAYOUT_VERSION,)]
    with PostgresStore(postgres_url, schema=postgres_schema) as again:  # upgraded once
        assert [run.run_id for run in again.list_runs()] == ["old"]


def test_postgres_claims_the_next_run_along_its_partial_index(
    admin: Any, postgres_url: str, postgres_schema: str
) -> None:
    from agent_fsm.durable import postgres_queue
    from agent_fsm.durable.postgres import PostgresStore

    PostgresStore(postgres_url, schema=postgres_schema).close()
    admin.execute("SET enable_seqscan = off")  # a tiny table: make the planner show its hand
    plan = admin.execute(
        "EXPLAIN " + postgres_queue.NEXT_RUN, {"owner": "w", "ttl": 60.0}, prepare=False
    ).fetchall()
    assert "runs_to_take" in " ".join(line for (line,) in plan)
    assert "LockRows" in " ".join(line for (line,) in plan)


# -- the command line --------------------------------------------------------------------------


def _location(open_shared_store: Opener) -> list[str]:
    """``--store`` (and ``--schema``) naming the test's storage."""
    if open_shared_store.kind == "postgres":
        url, schema = open_shared_store.location
        return ["--store", url, "--schema", schema]
    return ["--store", open_shared_store.location[0]]


def test_agent_fsm_cancel_and_runs(
    open_shared_store: Opener, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_shared_store()
    assert isinstance(store, RunQueue)
    store.enqueue(RunState(run_id="queued", pending_input=["work"]), priority=4)
    store.save(RunState(run_id="done", state=AgentState.DONE, output="over"))
    where = _location(open_shared_store)
    assert main(["cancel", "queued", "--reason", "the customer withdrew", *where]) == 0
    out = capsys.readouterr().out
    assert "cancel requested: run queued stops at its next checkpoint" in out
    assert main(["cancel", "done", *where]) == 0
    assert "run done has already stopped: nothing to cancel" in capsys.readouterr().out
    assert main(["runs", *where]) == 0
    listing = capsys.readouterr().out
    assert "CANCELLING: the customer withdrew" in listing
    assert main(["cancel", "nope", *where]) == 2
    error = capsys.readouterr().err
    assert "no checkpoint for run 'nope'" in error
    if open_shared_store.kind == "postgres":  # never the password
        password = open_shared_store.location[0].split(":")[2].split("@")[0]
        assert password not in out + listing + error


def test_agent_fsm_cancel_of_no_store_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cancel", "r", "--store", str(tmp_path / "missing.sqlite3")]) == 2
    assert "no checkpoint store at" in capsys.readouterr().err


# -- the fleet as OpenTelemetry gauges ---------------------------------------------------------


class Counting:
    """A store whose ``list_runs`` calls are counted (or fail, while ``down``)."""

    def __init__(self, store: CheckpointStore) -> None:
        self.store = store
        self.listings = 0
        self.down = False

    def list_runs(self, limit: int | None = None, *, states: Any = None) -> Any:
        self.listings += 1
        if self.down:
            raise CheckpointError("checkpoint store x: cannot list runs: the server is gone")
        return self.store.list_runs(limit, states=states)


def _gauges(reader: InMemoryMetricReader) -> dict[str, dict[tuple[Any, ...], int]]:
    """Each gauge's points of the latest collection, by their attributes."""
    data = reader.get_metrics_data()
    gauges: dict[str, dict[tuple[Any, ...], int]] = {}
    if data is None:
        return gauges
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points = gauges.setdefault(metric.name, {})
                for point in metric.data.data_points:
                    points[tuple(sorted((point.attributes or {}).items()))] = int(point.value)
    return gauges


def test_fleet_metrics_count_runs_by_state_lease_and_queue(open_store: Opener) -> None:
    clock = None if open_store.kind == "postgres" else ContractClock()
    store = open_store(clock=clock)
    assert isinstance(store, RunQueue)
    assert isinstance(store, RunCancels)
    leases: Any = store
    store.save(RunState(run_id="done", state=AgentState.DONE))
    store.save(RunState(run_id="failed", state=AgentState.ERROR))
    store.enqueue(RunState(run_id="queued"), priority=2)
    store.enqueue(RunState(run_id="cancelled"))
    store.cancel("cancelled", "not wanted")
    driving = leases.claim("driving", "alice", 600)
    store.save(RunState(run_id="driving", state=AgentState.THINK), lease=driving)
    gave_up = leases.claim("gave-up", "bob", 600)
    store.save(RunState(run_id="gave-up", state=AgentState.ACT), lease=gave_up)
    leases.release(gave_up)
    counting = Counting(store)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    FleetMetrics(counting, meter_provider=provider)  # type: ignore[arg-type]
    assert counting.listings == 0  # nothing until a collection
    expected = {
        "agent_fsm.runs": {
            (("agent_fsm.state", "ACT"),): 1,
            (("agent_fsm.state", "DONE"),): 1,
            (("agent_fsm.state", "ERROR"),): 1,
            (("agent_fsm.state", "OBSERVE"),): 2,
            (("agent_fsm.state", "THINK"),): 1,
        },
        "agent_fsm.runs.leased": {(): 1},
        "agent_fsm.runs.waiting": {(): 3},
        "agent_fsm.runs.stuck": {(): 1},
        "agent_fsm.runs.cancelling": {(): 1},
    }
    assert _gauges(reader) == expected
    assert counting.listings == 1  # one listing for every gauge of a collection
    leases.release(driving)
    expected["agent_fsm.runs.leased"] = {(): 0}
    expected["agent_fsm.runs.waiting"] = {(): 4}
    expected["agent_fsm.runs.stuck"] = {(): 2}
    assert _gauges(reader) == expected
    assert counting.listings == 2
    counting.down = True
    assert _gauges(reader) == {}  # a gap, not an error
    assert counting.listings == 3  # tried once for the collection, not once per gauge
    provider.shutdown()
