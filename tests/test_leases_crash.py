"""Crash test with leases alone (issue 18): three worker processes share a queue of ``RUNS``
runs on one PostgresStore (``tests/lease_worker.py``); one of them is killed with SIGKILL at a
random moment; the survivors take its runs over once its leases expire. Then every run has
finished, exactly once; no non-idempotent side effect happened twice; every transcript and
checkpoint keeps the run invariants.

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
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("psycopg")  # the extra agent-fsm[postgres]; tests/stores.py says more

import psycopg

from agent_fsm import Agent, AgentState, RunResult
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import AssistantMessage, ToolMessage
from agent_fsm.testing import FunctionModel
from agent_fsm.testing.invariants import check_invariants, state_problems
from tests.lease_worker import STEPS, TABLES, build_agent

ROOT = Path(__file__).resolve().parent.parent
RUNS = int(os.environ.get("AGENT_FSM_LEASE_CRASH_RUNS", "50"))
WORKERS = 3
SEED = int(os.environ.get("AGENT_FSM_LEASE_CRASH_SEED", "20261123"))
UPPER_BOUND_S = 600.0
"""How long the whole queue may take, at most: a limit for a hung test, not a measure."""

pytestmark = [
    pytest.mark.slow,  # real processes: make check leaves it out
    pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL"),
]


def _queue(store: PostgresStore) -> None:
    """RUNS runs, created (checkpointed, never stepped) by a producer that leases nothing."""
    producer = Agent(model=FunctionModel(lambda request: "unused"), store=store)
    for n in range(RUNS):
        producer.start(f"Do the steps of job {n}.", run_id=f"job-{n:03d}")


def _start_workers(url: str, schema: str) -> list[subprocess.Popen[str]]:
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.lease_worker", url, schema, f"worker-{n}"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(WORKERS)
    ]
    for worker in workers:
        assert worker.stdout is not None
        assert worker.stdout.readline() == "ready\n", worker.communicate(timeout=60)
    return workers


def _kill_amid_the_work(
    victim: subprocess.Popen[str],
    name: str,
    admin: psycopg.Connection[Any],
    after: int,
    pause: float,
) -> str:
    """SIGKILL ``victim`` ``pause`` seconds after ``after`` runs have finished, at a moment
    it drives a run; return that run's id. The worker is frozen (SIGSTOP) while its lease is
    looked up, so the run it is found driving is the one it dies driving."""
    deadline = time.monotonic() + UPPER_BOUND_S
    while True:
        assert victim.poll() is None, "the worker to kill stopped by itself"
        assert time.monotonic() < deadline, "the runs made no progress"
        if admin.execute("SELECT count(*) FROM finishes").fetchone() >= (after,):
            time.sleep(pause)  # a moment at random within the run the victim drives now
            victim.send_signal(signal.SIGSTOP)
            held = admin.execute(
                "SELECT l.run_id FROM leases l JOIN runs r USING (run_id) WHERE l.owner = %s"
                " AND l.expires_at > 0 AND r.state NOT IN ('DONE', 'ERROR')",
                (name,),
            ).fetchone()
            if held is not None:
                victim.send_signal(signal.SIGKILL)
                victim.communicate(timeout=60)  # reap it and close its pipes
                return str(held[0])
            victim.send_signal(signal.SIGCONT)  # between two runs: let it take the next
        time.sleep(0.005)


def _problems_of(store: PostgresStore, agent: Agent, run_id: str) -> list[str]:
    """What is wrong with a finished run's checkpoint, and its step effects (the step
    numbers of its answered ``send`` calls whose outcome is not unknown)."""
    state = store.load(run_id)
    problems = state_problems(state, agent.machine.rows, limits=agent.limits, bound=agent.bound)
    try:
        check_invariants(RunResult.from_state(state), limits=agent.limits, bound=agent.bound)
    except AssertionError as broken:
        problems.append(str(broken))
    if (state.state, state.output) != (AgentState.DONE, "done"):
        problems.append(f"ended {state.state} with {state.output!r}")
    calls = [c for m in state.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    if len(calls) != 2 * STEPS:
        problems.append(f"{len(calls)} tool calls, not {2 * STEPS}")
    return problems


def test_a_killed_workers_runs_are_taken_over_without_a_side_effect_twice(
    postgres_url: str, postgres_schema: str, admin: psycopg.Connection[Any]
) -> None:
    rng = random.Random(SEED)
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        admin.execute(TABLES)
        _queue(store)
        workers = _start_workers(postgres_url, postgres_schema)
        index = rng.randrange(WORKERS)
        victim = workers.pop(index)
        kill_after = rng.randint(RUNS // 10, RUNS * 6 // 10)
        pause = rng.uniform(0.0, 0.1)
        dropped = _kill_amid_the_work(victim, f"worker-{index}", admin, kill_after, pause)
        for worker in workers:
            out, err = worker.communicate(timeout=UPPER_BOUND_S)
            assert worker.returncode == 0, f"a surviving worker failed:\n{out}\n{err}"

        checker = build_agent(store, admin, "checker")
        summaries = store.list_runs()
        assert len(summaries) == RUNS
        broken = {s.run_id: p for s in summaries if (p := _problems_of(store, checker, s.run_id))}
        assert not broken, broken
        unknown = sum(
            "outcome of this call to 'send' is unknown" in m.content
            for s in summaries
            for m in store.load(s.run_id).messages
            if isinstance(m, ToolMessage)
        )

    effects = collections.Counter(
        (run_id, step) for run_id, step in admin.execute("SELECT run_id, step FROM effects")
    )
    twice = {key: n for key, n in effects.items() if n > 1}
    assert not twice, f"non-idempotent side effects happened more than once: {twice}"
    # Each step's send either happened (once), or its outcome was reported unknown.
    assert len(effects) + unknown >= RUNS * STEPS
    finishes = collections.Counter(r for (r,) in admin.execute("SELECT run_id FROM finishes"))
    # The run the killed worker held was taken over once its lease expired, and finished.
    finisher = admin.execute("SELECT worker FROM finishes WHERE run_id = %s", (dropped,))
    assert finisher.fetchall() not in ([], [(f"worker-{index}",)])
    assert max(finishes.values()) == 1, "a run was finished by two workers"
    # A run the victim finished just before its kill may lack its record: at most one.
    assert len(finishes) >= RUNS - 1
    done = sum(s.state is AgentState.DONE for s in summaries)
    print(
        f"\nlease crash test: {RUNS} runs on {WORKERS} workers, 1 killed (SIGKILL) after"
        f" {kill_after} runs had finished; runs finished: {done}/{RUNS} (recorded by a"
        f" worker: {len(finishes)}, by two: 0); taken over: {dropped}, the run the killed"
        " worker held;"
        f" side effects: {sum(effects.values())}, duplicated: {len(twice)}; outcomes"
        f" reported unknown: {unknown}"
    )
