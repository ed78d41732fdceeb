"""A process of tests/test_dbos_fleet.py's fleet, and the agent its runs follow.

``python -m tests.dbos_fleet_worker URL SCHEMA DBOS_SCHEMA EXECUTOR MODE TTL_S`` opens the
journal (a ``PostgresStore`` in ``SCHEMA``, which also holds the tables below), registers the
``fleet`` agent and launches DBOS (system tables in ``DBOS_SCHEMA``, executor id
``EXECUTOR``) in one of two ways:

- ``worker``: a ``DBOSWorker``, whose ``WorkerLiveness`` (``TTL_S``, no scans of its own: the
  test scans) holds the lease from launch; it takes runs from ``QUEUE``;
- ``plain``: ``DBOS(config=...)`` and ``DBOS.launch()`` alone, as the README's first DBOS
  example: no liveness of its own making, so the first run it executes starts the default
  one. It takes runs from ``QUEUE`` too.

Then it prints ``ready`` and reads commands from stdin: ``run ID`` runs ``ID`` here
(``DBOSAgent.run``) and prints ``result ID OUTPUT STOP_REASON`` once it ends; ``quit``
leaves. Each run makes two tool turns, then answers ``done``:

- ``wait_gate`` (idempotent) records ``(run_id, worker)`` in ``entered`` and waits while the
  test holds the advisory lock ``GATE``: a run the test can hold mid-call at will;
- ``send`` (not idempotent) records ``(run_id, worker)`` in ``effects``: the effect that must
  never happen twice.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import psycopg

from agent_fsm import Agent, Limits, tool
from agent_fsm.dbos import DBOSAgent, RunQueue, WorkerLiveness
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage
from agent_fsm.testing import FunctionModel, call, reply

APP = "agent_fsm_fleet"
APP_VERSION = "fleet-test"
"""Every process of the fleet (the test's too) runs this version: a scan sees its runs."""
GATE = 72_034_101
QUEUE = RunQueue(name="fleet_runs", worker_concurrency=4, polling_interval_s=0.05)
TABLES = """
CREATE TABLE entered (run_id text NOT NULL, worker text NOT NULL);
CREATE TABLE effects (run_id text NOT NULL, worker text NOT NULL)
"""
DBOS_SETTINGS: dict[str, Any] = {
    "application_version": APP_VERSION,
    "notification_listener_polling_interval_sec": 0.05,
    "log_level": "WARNING",
}
NEVER_S = 10.0**6
"""The workers' scan interval: they never scan (the test does)."""
TIMEOUT_S = 600.0
"""The runs' time limit: far above how long a test holds them (an upper bound only)."""


def fleet_agent(url: str, schema: str, worker: str) -> Agent:
    """Two tool turns (``wait_gate``, then ``send``), then "done"."""

    def connect() -> psycopg.Connection[Any]:
        conn = psycopg.connect(url, autocommit=True)
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (schema,))
        return conn

    @tool(idempotent=True, timeout_s=TIMEOUT_S)
    def wait_gate(run: str) -> str:
        """Wait until the gate opens."""
        with connect() as conn:
            conn.execute("INSERT INTO entered VALUES (%s, %s)", (run, worker))
            conn.execute("SELECT pg_advisory_lock_shared(%s)", (GATE,))
            conn.execute("SELECT pg_advisory_unlock_shared(%s)", (GATE,))
        return "through"

    @tool
    def send(run: str) -> str:
        """Send the run's message (not idempotent)."""
        with connect() as conn:
            conn.execute("INSERT INTO effects VALUES (%s, %s)", (run, worker))
        return "sent"

    def model(request: ModelRequest) -> ModelResponse:
        answered = sum(isinstance(m, ToolMessage) for m in request.messages)
        if answered == 0:
            return reply("", call("wait_gate", run=request.run_id))
        if answered == 1:
            return reply("", call("send", run=request.run_id))
        return reply("done")

    return Agent(
        model=FunctionModel(model),
        tools=[wait_gate, send],
        limits=Limits(max_turns=5, timeout_s=TIMEOUT_S, loop_detection=False),
    )


async def serve(agent: DBOSAgent) -> None:
    """Run the commands read from stdin (see the module docstring)."""
    loop = asyncio.get_running_loop()
    running: set[asyncio.Task[None]] = set()

    async def run(run_id: str) -> None:
        result = await agent.run(f"Do {run_id}.", run_id=run_id)
        print(f"result {run_id} {result.output} {result.stop_reason.value}", flush=True)

    while True:
        line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
        if not line or line[0] == "quit":
            return
        task = asyncio.create_task(run(line[1]))
        running.add(task)
        task.add_done_callback(running.discard)


def main(url: str, schema: str, dbos_schema: str, executor: str, mode: str, ttl_s: str) -> int:
    from dbos import DBOS

    with PostgresStore(url, schema=schema) as journal:
        agent = DBOSAgent(
            fleet_agent(url, schema, executor), journal=journal, name="fleet", queue=QUEUE
        )
        liveness = WorkerLiveness(journal, ttl_s=float(ttl_s), scan_s=NEVER_S)
        try:
            from agent_fsm.dbos import DBOSWorker
        except ImportError:  # agent_fsm before issue 34: its README's worker, to show the bugs
            DBOSWorker = None  # type: ignore[assignment,misc]
        if mode == "worker" and DBOSWorker is not None:
            worker = DBOSWorker(
                APP,
                url,
                liveness=liveness,
                executor_id=executor,
                pool_size=4,
                dbos_schema=dbos_schema,
                config=DBOS_SETTINGS,
            )
            worker.launch()
        else:
            config = {
                "name": APP,
                "system_database_url": url,
                "dbos_system_schema": dbos_schema,
                "executor_id": executor,
                **DBOS_SETTINGS,
            }
            DBOS(config=config)  # type: ignore[arg-type]
            DBOS.launch()
            if mode == "worker":
                liveness.start()
        asyncio.run(QUEUE.register())
        print("ready", flush=True)
        asyncio.run(serve(agent))
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:7]))
