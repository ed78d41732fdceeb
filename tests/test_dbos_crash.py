"""Crash test on DBOS (issue 18): three worker processes share a DBOS queue of ``RUNS`` runs
(``tests/dbos_worker.py``), each run a workflow whose model and tool calls are steps; one
worker is killed with SIGKILL at a random moment while it drives runs; the survivors see its
liveness lease expire and hand its runs back to the queue (``WorkerLiveness``), and DBOS
replays them on a survivor. Then every run has finished, exactly once (one workflow result
each, DONE); no non-idempotent side effect happened twice; every transcript keeps the run
invariants.

The kill comes once a random number of runs have finished (between a tenth and six tenths of
them), so it lands amid the work whatever the machine's speed; timeouts are generous upper
bounds only. The counts are printed (``pytest -s`` shows them).
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg")  # the extra agent-fsm[postgres]; tests/stores.py says more
pytest.importorskip("dbos")  # the extra agent-fsm[dbos]

import psycopg
from dbos import DBOSClient
from psycopg import sql

from agent_fsm import AgentState, RunResult
from agent_fsm.dbos.agent import WORKFLOW_PREFIX
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import AssistantMessage, ToolMessage
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import QUEUE, plain_agent
from tests.lease_worker import STEPS, TABLES

ROOT = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("AGENT_FSM_DBOS_CRASH_RUNS", "50"))
WORKERS = 3
SEED = int(os.environ.get("AGENT_FSM_DBOS_CRASH_SEED", "20261124"))
UPPER_BOUND_S = 600.0
"""How long the whole queue may take, at most: a limit for a hung test, not a measure."""

pytestmark = [
    pytest.mark.slow,  # real processes: make check leaves it out
    pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL"),
]


@pytest.fixture
def admin(postgres_url: str, postgres_schema: str) -> Iterator[psycopg.Connection[Any]]:
    """The test's schema, laid out as a journal store first (which wants it empty)."""
    PostgresStore(postgres_url, schema=postgres_schema).close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (postgres_schema,))
        yield conn


@pytest.fixture
def dbos_schema(postgres_url: str) -> Iterator[str]:
    """DBOS's system tables for this test, dropped afterwards."""
    name = f"dbos_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def _start_worker(args: list[str]) -> subprocess.Popen[str]:
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.dbos_worker", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    assert worker.stdout.readline() == "ready\n", worker.communicate(timeout=60)
    return worker


def _start_workers(url: str, schema: str, dbos_schema: str) -> list[subprocess.Popen[str]]:
    """The first worker alone lays DBOS's tables out and registers the queue; then the
    others join."""
    args = [url, schema, dbos_schema]
    first = _start_worker([*args, "worker-0", str(RUNS)])
    return [first, *(_start_worker([*args, f"worker-{n}", str(RUNS)]) for n in range(1, WORKERS))]


def _kill_amid_the_work(
    victim: subprocess.Popen[str],
    name: str,
    admin: psycopg.Connection[Any],
    client: DBOSClient,
    after: int,
    pause: float,
) -> list[str]:
    """SIGKILL ``victim`` ``pause`` seconds after ``after`` runs have finished, at a moment
    it drives runs; return the ids of the runs it was found driving. The worker is frozen
    (SIGSTOP) while they are looked up, so it starts nothing more; but what it sent before
    may still reach the server after the look-up (a run's end, written by DBOS): a run
    found here may have been ended by the victim itself (see ``_died_driving``)."""
    deadline = time.monotonic() + UPPER_BOUND_S
    while True:
        assert victim.poll() is None, "the worker to kill stopped by itself"
        assert time.monotonic() < deadline, "the runs made no progress"
        if admin.execute("SELECT count(*) FROM finishes").fetchone() >= (after,):
            time.sleep(pause)  # a moment at random within the runs the victim drives now
            victim.send_signal(signal.SIGSTOP)
            held = client.list_workflows(status="PENDING", executor_id=name)
            if held:
                victim.send_signal(signal.SIGKILL)
                victim.communicate(timeout=60)  # reap it and close its pipes
                return [status.workflow_id for status in held]
            victim.send_signal(signal.SIGCONT)  # between two runs: let it take the next
        time.sleep(0.005)


def _died_driving(
    found: list[str], victim: str, statuses: dict[str, Any], finishers: dict[str, list[str]]
) -> list[str]:
    """The runs among ``found`` (those the victim was found driving) that it died driving:
    all but those it ended itself. A run's DBOS status names the executor that took it from
    the queue last, which is the one that ended it; the victim's name there means its
    end was already on its way when the victim was frozen (it reached the server after the
    look-up). Such a run must have been announced finished by the victim, and by no one
    else: it ran once, to its end, there."""
    ended_by_victim = [r for r in found if statuses[r].executor_id == victim]
    for run_id in ended_by_victim:
        assert finishers[run_id] == [victim], (run_id, finishers[run_id])
    return [r for r in found if r not in ended_by_victim]


def _problems_of(result: RunResult, run_id: str, admin: psycopg.Connection[Any]) -> list[str]:
    """What is wrong with a finished run's result."""
    agent = plain_agent(admin, "checker")
    problems: list[str] = []
    try:
        check_invariants(result, limits=agent.limits, bound=agent.bound)
    except AssertionError as broken:
        problems.append(str(broken))
    if (result.final_state, result.output, result.run_id) != (AgentState.DONE, "done", run_id):
        problems.append(f"ended {result.final_state} with {result.output!r}")
    calls = [c for m in result.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    if len(calls) != 2 * STEPS:
        problems.append(f"{len(calls)} tool calls, not {2 * STEPS}")
    return problems


def test_a_killed_workers_runs_are_replayed_without_a_side_effect_twice(
    postgres_url: str,
    postgres_schema: str,
    dbos_schema: str,
    admin: psycopg.Connection[Any],
) -> None:
    rng = random.Random(SEED)
    admin.execute(TABLES)
    workers = _start_workers(postgres_url, postgres_schema, dbos_schema)
    client = DBOSClient(system_database_url=postgres_url, dbos_system_schema=dbos_schema)
    try:
        run_ids = [f"job-{n:03d}" for n in range(RUNS)]
        for run_id in run_ids:
            options = {
                "queue_name": QUEUE.name,
                "workflow_name": WORKFLOW_PREFIX + "crash",
                "workflow_id": run_id,
            }
            client.enqueue(options, f"Do the steps of {run_id}.", run_id)  # type: ignore[arg-type]
        index = rng.randrange(WORKERS)
        victim = workers.pop(index)
        kill_after = rng.randint(RUNS // 10, RUNS * 6 // 10)
        pause = rng.uniform(0.0, 0.1)
        found = _kill_amid_the_work(victim, f"worker-{index}", admin, client, kill_after, pause)
        recovered: set[str] = set()  # two survivors may both hand the same run back
        for worker in workers:
            out, err = worker.communicate(timeout=UPPER_BOUND_S)
            assert worker.returncode == 0, f"a surviving worker failed:\n{out}\n{err}"
            recovered.update(filter(None, out.split("recovered ")[-1].strip().split(",")))

        statuses = {s.workflow_id: s for s in client.list_workflows()}
        assert sorted(statuses) == run_ids
        assert {s.status for s in statuses.values()} == {"SUCCESS"}
        results = {run_id: client.retrieve_workflow(run_id).get_result() for run_id in run_ids}
    finally:
        client.destroy()
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate(timeout=60)

    broken = {r: p for r, result in results.items() if (p := _problems_of(result, r, admin))}
    assert not broken, broken
    unknown = sum(
        "outcome of this call to 'send' is unknown" in m.content
        for result in results.values()
        for m in result.messages
        if isinstance(m, ToolMessage)
    )
    effects = collections.Counter(
        (run_id, step) for run_id, step in admin.execute("SELECT run_id, step FROM effects")
    )
    twice = {key: n for key, n in effects.items() if n > 1}
    assert not twice, f"non-idempotent side effects happened more than once: {twice}"
    # Each step's send either happened (once), or its outcome was reported unknown.
    assert len(effects) + unknown >= RUNS * STEPS
    # The killed worker's runs were recovered by the survivors, and finished there.
    finishers = collections.defaultdict(list)
    for run_id, worker in admin.execute("SELECT run_id, worker FROM finishes"):
        finishers[run_id].append(worker)
    dropped = _died_driving(found, f"worker-{index}", statuses, finishers)
    assert dropped, f"the worker ended every run it was found driving: {found}"
    assert set(dropped) <= recovered
    for run_id in dropped:
        assert [w for w in finishers[run_id] if w != f"worker-{index}"], run_id
    # A run ends once; its end is announced again only if its worker died after announcing
    # it and before DBOS recorded the end (then the replay announces it too).
    again = {r: w for r, w in finishers.items() if len(w) > 1}
    assert set(again) <= set(dropped), again
    assert set(finishers) == set(run_ids)
    print(
        f"\nDBOS crash test: {RUNS} runs on {WORKERS} workers, 1 killed (SIGKILL) after"
        f" {kill_after} runs had finished, while driving {len(dropped)} (and ending"
        f" {len(found) - len(dropped)}); runs finished:"
        f" {sum(r.final_state is AgentState.DONE for r in results.values())}/{RUNS} (one"
        f" workflow result each); recovered workflows: {len(recovered)}; ends announced twice:"
        f" {len(again)}; side effects: {sum(effects.values())}, duplicated: {len(twice)};"
        f" outcomes reported unknown: {unknown}"
    )
