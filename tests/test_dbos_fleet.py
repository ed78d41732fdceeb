"""A DBOS fleet of real processes (tests/dbos_fleet_worker.py) on PostgreSQL, attacked as in
issue 34: a worker SIGSTOPped past its liveness lease, a process that runs ``DBOSAgent.run()``
or takes queued runs without setting any liveness up, a worker whose clock is an hour behind.

This test process is the fleet's scanner: it launches DBOS on the fleet's system tables
(listening to no queue: it runs nothing) and calls ``WorkerLiveness.recover_dead()`` itself,
so every scan happens at a point the test chooses. Runs are held inside a call while the test
holds the advisory lock ``GATE``; everything waits for outcomes (a row written, a lease
expired, a result), with generous upper bounds for a hung test only. ``SHOW_FLEET=1`` prints
what each process wrote (``pytest -s``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

import psycopg
from dbos import DBOS, DBOSClient
from psycopg import sql

from agent_fsm import RunResult, StopReason
from agent_fsm.dbos import WorkerLiveness
from agent_fsm.dbos.agent import WORKFLOW_PREFIX
from agent_fsm.dbos.recovery import LEASE_PREFIX
from agent_fsm.dbos.replies import from_json
from agent_fsm.durable.journal import OutcomeJournal
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import ToolMessage
from tests.dbos_fleet_worker import APP, DBOS_SETTINGS, GATE, QUEUE, TABLES, TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
TTL_S = 2.0
UPPER_BOUND_S = 120.0
"""How long any awaited outcome may take: a limit for a hung test, not a measure."""

pytestmark = [
    pytest.mark.slow,  # real processes: make check leaves it out
    pytest.mark.skipif(sys.platform == "win32", reason="needs SIGSTOP and SIGKILL"),
]


@pytest.fixture
def dbos_schema(postgres_url: str) -> Iterator[str]:
    """DBOS in this process on the fleet's system tables (the test's own: no run of another
    test is left in them to recover), listening to no queue."""
    schema = f"dbos_{uuid.uuid4().hex[:12]}"
    config = {
        "name": APP,
        "system_database_url": postgres_url,
        "dbos_system_schema": schema,
        "executor_id": "pytest-scanner",
        **DBOS_SETTINGS,
    }
    DBOS(config=config)  # type: ignore[arg-type]
    DBOS.listen_queues([])
    DBOS.launch()
    try:
        yield schema
    finally:
        DBOS.destroy(destroy_registry=True)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


class Fleet:
    """The test's handle on the fleet: its store (the journal, the leases, the tables of
    tests/dbos_fleet_worker.py), the gate, the processes it started, and its scanner."""

    def __init__(self, url: str, schema: str, dbos_schema: str) -> None:
        self.url, self.schema, self.dbos_schema = url, schema, dbos_schema
        self.store = PostgresStore(url, schema=schema)
        self.admin = psycopg.connect(url, autocommit=True)
        self.admin.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        self.admin.execute(TABLES)
        self.scanner = WorkerLiveness(self.store, ttl_s=TTL_S)
        self.client = DBOSClient(system_database_url=url, dbos_system_schema=dbos_schema)
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, executor: str, mode: str, skew_s: float = 0.0) -> subprocess.Popen[str]:
        """A process of the fleet (``skew_s``: its clock that far off), once ``ready``."""
        launcher = (
            "import runpy, sys, time\n"
            f"skew = {skew_s!r}\n"
            "if skew:\n"
            "    real = time.time\n"
            "    time.time = lambda: real() + skew\n"
            "runpy.run_module('tests.dbos_fleet_worker', run_name='__main__')\n"
        )
        args = [self.url, self.schema, self.dbos_schema, executor, mode, str(TTL_S)]
        process = subprocess.Popen(
            [sys.executable, "-c", launcher, *args],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.processes.append(process)
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n", process.communicate(timeout=60)
        return process

    def enqueue(self, run_id: str) -> None:
        options = {
            "queue_name": QUEUE.name,
            "workflow_name": WORKFLOW_PREFIX + "fleet",
            "workflow_id": run_id,
            "app_version": DBOS_SETTINGS["application_version"],
        }
        self.client.enqueue(options, f"Do {run_id}.", run_id)  # type: ignore[arg-type]

    def close_gate(self) -> None:
        self.admin.execute("SELECT pg_advisory_lock(%s)", (GATE,))

    def open_gate(self) -> None:
        self.admin.execute("SELECT pg_advisory_unlock(%s)", (GATE,))

    def entered(self, run_id: str, worker: str) -> int:
        found = self.admin.execute(
            "SELECT count(*) FROM entered WHERE run_id = %s AND worker = %s", (run_id, worker)
        ).fetchone()
        return int(found[0]) if found else 0

    def effects(self, run_id: str) -> list[str]:
        rows = self.admin.execute("SELECT worker FROM effects WHERE run_id = %s", (run_id,))
        return [worker for (worker,) in rows]

    def scan(self) -> list[str]:
        return self.scanner.recover_dead()

    def result(self, run_id: str) -> RunResult:
        found: RunResult = DBOS.retrieve_workflow(run_id).get_result()
        return found

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            out, err = process.communicate(timeout=60)
            if os.environ.get("SHOW_FLEET"):
                print(f"--- process {process.args[-3]}:\n{out}\n{err}")
        self.client.destroy()
        self.admin.close()
        self.store.close()


@pytest.fixture
def fleet(postgres_url: str, postgres_schema: str, dbos_schema: str) -> Iterator[Fleet]:
    fleet = Fleet(postgres_url, postgres_schema, dbos_schema)
    try:
        yield fleet
    finally:
        fleet.close()


def wait_for(what: str, done: Callable[[], Any]) -> Any:
    """Wait until ``done()`` is truthy (its value), polling; fail after the upper bound."""
    deadline = time.monotonic() + UPPER_BOUND_S
    while not (found := done()):
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.02)
    return found


def answers(result: RunResult) -> list[str]:
    return [m.content for m in result.messages if isinstance(m, ToolMessage)]


def test_a_worker_that_lost_its_lease_claims_a_fresh_one_and_is_recovered_no_more(
    fleet: Fleet,
) -> None:
    """Issue 34, point 2. Worker ``w-a`` is SIGSTOPped inside a run's call past its lease;
    the scan recovers that run. Woken, ``w-a`` finds its lease taken over and claims a fresh
    one (a new token): a run it takes then is its own, and later scans leave it alone (they
    recovered it at every scan before). Its stale execution of the recovered run stops
    before its next call, so each run's ``send`` happens once."""
    fleet.close_gate()
    worker = fleet.start("w-a", "worker")
    fleet.enqueue("stop-1")
    wait_for("w-a inside stop-1's call", lambda: fleet.entered("stop-1", "w-a"))
    before = fleet.store.lease(LEASE_PREFIX + "w-a")
    assert before is not None

    worker.send_signal(signal.SIGSTOP)
    wait_for("w-a's lease to expire", lambda: fleet.store.lease(LEASE_PREFIX + "w-a") is None)
    assert fleet.scan() == ["stop-1"]
    worker.send_signal(signal.SIGCONT)

    fresh = wait_for("w-a to claim a fresh lease", lambda: fleet.store.lease(LEASE_PREFIX + "w-a"))
    assert fresh.token >= before.token + 2  # the recovery's claim, then its own
    fleet.enqueue("stop-2")
    wait_for("w-a inside stop-2's call", lambda: fleet.entered("stop-2", "w-a"))
    assert fleet.scan() == []  # w-a lives: nothing of its is recovered
    assert fleet.scan() == []

    fleet.open_gate()
    for run_id in ("stop-1", "stop-2"):
        result = fleet.result(run_id)
        assert (result.output, result.stop_reason) == ("done", StopReason.FINAL_ANSWER)
        assert answers(result) == ["through", "sent"]
        assert fleet.effects(run_id) == ["w-a"]


@pytest.mark.parametrize("via", ["run", "queue"])
def test_a_process_without_liveness_set_up_holds_a_lease_from_its_first_run(
    fleet: Fleet, via: str
) -> None:
    """Issue 34, point 3. Process ``p-1`` launches DBOS plainly (the README's first example)
    and runs a run, by ``DBOSAgent.run()`` or from the queue, with no liveness of its own
    making: it holds a lease from that run on, so scans leave its run alone (they took it
    for dead and replayed it while it ran)."""
    run_id = f"plain-{via}"
    fleet.close_gate()
    process = fleet.start("p-1", "plain")
    if via == "run":
        assert process.stdin is not None
        process.stdin.write(f"run {run_id}\n")
        process.stdin.flush()
    else:
        fleet.enqueue(run_id)
    wait_for("p-1 inside its call", lambda: fleet.entered(run_id, "p-1"))
    assert fleet.scan() == []
    assert fleet.scan() == []
    assert fleet.store.lease(LEASE_PREFIX + "p-1") is not None

    fleet.open_gate()
    result = fleet.result(run_id)
    assert (result.output, result.stop_reason) == ("done", StopReason.FINAL_ANSWER)
    assert answers(result) == ["through", "sent"]
    assert fleet.effects(run_id) == ["p-1"]
    assert fleet.entered(run_id, "p-1") == 1  # never replayed
    if via == "run":
        assert process.stdout is not None
        assert process.stdout.readline() == f"result {run_id} done final_answer\n"


def test_a_run_recovered_from_a_worker_an_hour_behind_keeps_its_deadline(fleet: Fleet) -> None:
    """Issue 34, point 5. Worker ``w-slow``, its clock an hour behind, starts a run (time
    limit 600 s) and is killed inside a call; ``w-ok`` replays it. The deadline is read on
    one clock (the fleet's), so the run goes on and finishes: it ended "timed out" at once
    when the start time came from one worker's clock and the time left from another's."""
    fleet.close_gate()
    slow = fleet.start("w-slow", "worker", skew_s=-3600.0)
    fleet.enqueue("skew-1")
    wait_for("w-slow inside skew-1's call", lambda: fleet.entered("skew-1", "w-slow"))
    slow.kill()
    slow.communicate(timeout=60)
    fleet.start("w-ok", "worker")
    wait_for("w-slow's lease to expire", lambda: fleet.store.lease(LEASE_PREFIX + "w-slow") is None)
    assert fleet.scan() == ["skew-1"]
    fleet.open_gate()

    result = fleet.result("skew-1")
    assert (result.output, result.stop_reason) == ("done", StopReason.FINAL_ANSWER)
    assert fleet.entered("skew-1", "w-ok") == 1  # its call ran again there (idempotent)
    assert fleet.effects("skew-1") == ["w-ok"]
    # The start w-slow recorded (with its first model call's outcome, in the journal) is the
    # fleet's time (the store's clock), not its own.
    journal = fleet.store.journal("skew-1")
    assert isinstance(journal, OutcomeJournal)
    kept = journal.outcome_and_lookup("model:0", "cancel")[0]
    assert kept is not None
    began_at = from_json(kept).began_at
    assert began_at is not None
    now = fleet.admin.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert now is not None
    assert 0 < now[0] - began_at < TIMEOUT_S
