"""A worker of tests/test_dbos_crash.py, and the agent the DBOS tests share.

``python -m tests.dbos_worker URL SCHEMA DBOS_SCHEMA WORKER_ID RUNS`` registers the crash
test's ``DBOSAgent`` and launches a ``DBOSWorker`` on the throwaway cluster (system tables in
``DBOS_SCHEMA``, executor id ``WORKER_ID``, its liveness lease held from launch), and takes
runs from the queue until ``RUNS`` runs exist and none is left unfinished. Each run makes
``STEPS`` tool turns of two calls, as in tests/lease_worker.py:

- ``send`` (not idempotent) inserts ``(run_id, step, worker)`` into ``effects``: the side
  effect that must never happen twice;
- ``lookup`` (idempotent) computes a value; it may run again after a crash.

The model is a function of the transcript. Every ``RunFinished`` event is recorded in
``finishes`` (run_id, worker): a run replayed after its worker died after the event and
before DBOS recorded the end announces it again. Prints ``ready`` once DBOS is launched, and
``recovered ID,ID,...`` (the runs it handed back from dead workers) when it leaves.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from dbos import DBOS, DBOSConfig
from psycopg import sql

from agent_fsm import Agent, MemoryStore
from agent_fsm.dbos import DBOSAgent, DBOSWorker, RunQueue, WorkerLiveness
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.events import Event, RunFinished
from tests.lease_worker import job_agent

LIVENESS_TTL_S = 1.0
QUEUE = RunQueue(name="crash_runs", worker_concurrency=4, polling_interval_s=0.05)
PROCESS_LEASES = MemoryStore()
"""Where a test process launched by ``launched`` keeps its liveness lease."""


FAST_DBOS: DBOSConfig = {"notification_listener_polling_interval_sec": 0.05, "log_level": "WARNING"}
"""DBOS settings of the tests' processes: quick to notice notifications, quiet."""


HANG_GUARD_S = 300.0
"""How long a DBOS test waits for something that must come (a held call entered, a replay's
result) before it fails saying what did not come: far beyond what a working run takes on a
loaded machine (seconds), and a failure with a reason instead of a CI job that never ends."""


APP_VERSION = "agent_fsm-tests"
"""The DBOS application version of every process launched with ``dbos_config``: a test's
own process and its helpers (tests/dbos_canceller.py) run one version on the test's system
database, whatever workflows each registered before its launch.

DBOS hands a workflow that names no version (a fork: how the tests replay a run) only to a
process of the latest version registered on its system database. By default a version
hashes the workflows registered at launch, which differ between processes: the pytest
process's first launch counts every ``@DBOS.workflow`` its test modules made at import
(tests/test_dbos_unstepped.py's, when collected), a helper's counts none. A helper launched
after the test's process then registered the latest version, the test's process took no
fork any more, and every replay it made afterwards waited for ever (seen as a hang of
test_a_request_made_during_a_tool_call_is_read_with_its_end_and_no_model_step_reads_again,
after test_a_run_is_cancelled_from_another_process on the same xdist worker)."""


def dbos_config(url: str, dbos_schema: str, executor_id: str, name: str) -> DBOSConfig:
    """DBOS on the test cluster, its system tables in a schema of the test's own, at the
    tests' one application version (``APP_VERSION``)."""
    return {
        "name": name,
        "system_database_url": url,
        "dbos_system_schema": dbos_schema,
        "executor_id": executor_id,
        "application_version": APP_VERSION,
        **FAST_DBOS,
    }


@contextmanager
def launched(url: str, name: str) -> Iterator[str]:
    """DBOS launched in this process (executor id ``pytest``), its system tables in a fresh
    schema, whose name is yielded; destroyed, and the schema dropped, afterwards. A test
    module's fixture: DBOS is one per process."""
    schema = f"dbos_{uuid.uuid4().hex[:12]}"
    DBOS(config=dbos_config(url, schema, "pytest", name))
    # The process's liveness lives as long as its DBOS, in a store of its own: a test's
    # journal store is closed when the test ends, and runs check the lease at every call.
    WorkerLiveness(PROCESS_LEASES, ttl_s=LIVENESS_TTL_S).start()
    DBOS.launch()
    try:
        yield schema
    finally:
        DBOS.destroy(destroy_registry=True)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def build_agent(journal: PostgresStore, effects: psycopg.Connection[Any], worker: str) -> DBOSAgent:
    """The crash test's DBOSAgent, registered as ``crash``."""
    return DBOSAgent(plain_agent(effects, worker), journal=journal, name="crash", queue=QUEUE)


def plain_agent(effects: psycopg.Connection[Any], worker: str) -> Agent:
    """The job agent of tests/lease_worker.py, recording in ``finishes`` every run it ends."""

    def finished(event: Event) -> None:
        if isinstance(event, RunFinished):
            effects.execute("INSERT INTO finishes VALUES (%s, %s)", (event.run_id, worker))

    return job_agent(effects, worker, handlers=[finished])


def work_left(runs: int) -> bool:
    """Runs are still to come (the test enqueues them once the workers are up), or
    unfinished (a dead worker's stay PENDING until they are recovered)."""
    if len(DBOS.list_workflows()) < runs:
        return True
    return bool(DBOS.list_workflows(status=["ENQUEUED", "PENDING"]))


def main(url: str, schema: str, dbos_schema: str, worker: str, runs: str) -> int:
    with (
        PostgresStore(url, schema=schema) as journal,
        psycopg.connect(url, autocommit=True) as effects,
    ):
        effects.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        liveness = WorkerLiveness(journal, ttl_s=LIVENESS_TTL_S)
        agent = build_agent(journal, effects, worker)
        with DBOSWorker(
            "agent_fsm_crash",
            url,
            liveness=liveness,
            executor_id=worker,
            pool_size=6,
            dbos_schema=dbos_schema,
            config=FAST_DBOS,
        ):
            asyncio.run(QUEUE.register())
            print("ready", flush=True)
            while work_left(int(runs)):
                time.sleep(0.1)
        del agent
    print(f"recovered {','.join(liveness.recovered)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:6]))
