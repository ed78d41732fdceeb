"""Checkpoint cost per transition and runs per second on every store, with one and with
several worker processes.

Each run makes ``--turns`` model calls (instant: a FunctionModel), every one but the last
calling one async no-op tool, and is checkpointed after every transition under a lease
(``lease_s=30``, as several workers sharing a store run). The runs are split evenly between
the worker processes; each worker opens its own store on the shared storage (one SQLite
file; one PostgreSQL schema) and drives its runs one after another. MemoryStore cannot be
shared between processes: with several workers each has its own.

``dbos``: the same runs as DBOS workflows (``DBOSAgent.run``), each worker a ``DBOSWorker`` on
the PostgreSQL database (DBOS's tables in a schema of their own, the tool journal and the
liveness lease in a ``PostgresStore``): no checkpoints and no run leases (each model call's
outcome is kept in the journal, which is in "rest" as the step that recorded it was, and each
tool call is kept in the journal too, either made as a step only when the journal cannot
stand for one), so the save columns are empty.
``dbos-async``: the same, with DBOS's commits not waiting for the disk
(``DBOSWorker(synchronous_commit=False)``; the journal's starts still do).

Printed per store and number of workers: runs per second (all runs over the wall time from
the first worker's start to the last one's end), saves per run, the mean and the 99th
percentile of one save (what a transition pays for its checkpoint), what the tool journal
costs per tool call (its look-up, start and finish; for DBOS also the look-ups of a cancel
request that model steps make themselves), the rest of the time per transition (the
engine, the model, the tool, leases taken and released), and the CPU time the worker
processes used per run (all their threads: on a machine with fewer cores than workers, it
is what bounds runs per second). On PostgreSQL also what the server did, from its
statistics (the benchmark's cluster serves nothing else, but every process's background
work is counted): transactions committed per run,
and WAL flushes to disk per tool call (``pg_stat_wal.wal_sync``): the fsync-bearing round
trips, less what group commit shares between workers, plus the WAL writer's own flushes of
the commits made without waiting for the disk.

    python benchmarks/stores.py [--runs 1000] [--turns 10] [--workers 1 4] [--stores ...]
    (stores: memory sqlite postgres dbos dbos-async)

PostgreSQL: the database of AGENT_FSM_POSTGRES_URL, else a throwaway cluster started (and
stopped) with scripts/postgres.sh. Each configuration gets a fresh schema, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import multiprocessing
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import structlog

ROOT = Path(__file__).resolve().parent.parent
DBOS_KINDS = ("dbos", "dbos-async")


def _open(kind: str, location: str) -> Any:
    from agent_fsm import MemoryStore, SQLiteStore

    if kind == "memory":
        return MemoryStore()
    if kind == "sqlite":
        return SQLiteStore(location)
    from agent_fsm.durable.postgres import PostgresStore

    url, schema = location.split(" ", 1)
    return PostgresStore(url, schema=schema)


def agent_options(turns: int) -> dict[str, Any]:
    """The benchmark's agent: an instant model, one async no-op tool, ``turns`` turns."""
    from agent_fsm import Limits, tool
    from agent_fsm.messages import ModelRequest, ModelResponse
    from agent_fsm.testing import FunctionModel, call, reply

    @tool
    async def step(n: int) -> int:
        """Return n + 1."""
        return n + 1

    def model(request: ModelRequest) -> ModelResponse | str:
        return reply("", call("step", n=request.turn)) if request.turn < turns else "done"

    return {
        "model": FunctionModel(model),
        "tools": [step],
        "limits": Limits(max_turns=turns + 1, loop_detection=False),
    }


def _dbos_config(url: str, schema: str, executor: str) -> Any:
    return {
        "name": "agent_fsm_bench",
        "system_database_url": url,
        "dbos_system_schema": f"{schema}_dbos",
        "executor_id": executor,
        "log_level": "WARNING",
    }


def _worker(kind: str, location: str, run_ids: list[str], turns: int) -> dict[str, Any]:
    """Drive ``run_ids`` to the end in this process; return its timings."""
    from agent_fsm import Agent

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    store = _open("postgres" if kind in DBOS_KINDS else kind, location)
    saves: list[float] = []
    save = store.save

    def timed_save(state: Any, **lease: Any) -> None:
        started = time.perf_counter()
        save(state, **lease)
        saves.append(time.perf_counter() - started)

    store.save = timed_save
    journal_s: list[float] = []
    started_keys: list[str] = []
    journal = store.journal

    def timed_journal(run_id: str, **lease: Any) -> _TimedJournal:
        return _TimedJournal(journal(run_id, **lease), journal_s, started_keys)

    store.journal = timed_journal
    runner: Any
    worker: Any = None
    if kind in DBOS_KINDS:  # a fleet's worker process, as the README's (DBOSWorker)
        from agent_fsm.dbos import DBOSAgent, DBOSWorker, WorkerLiveness

        url, schema = location.split(" ", 1)
        runner = DBOSAgent(Agent(**agent_options(turns)), journal=store, name="bench")
        worker = DBOSWorker(
            "agent_fsm_bench",
            url,
            liveness=WorkerLiveness(store),
            executor_id=f"bench-{os.getpid()}",
            dbos_schema=f"{schema}_dbos",
            synchronous_commit=kind == "dbos",
            config={"log_level": "WARNING"},
        )
        worker.launch()
    else:
        runner = Agent(**agent_options(turns), store=store, lease_s=30)
    transitions = 0

    async def drive() -> None:
        nonlocal transitions
        for run_id in run_ids:
            result = await runner.run("go", run_id=run_id)
            assert result.output == "done", result
            transitions += len(result.trace)

    started, cpu = time.time(), time.process_time()
    asyncio.run(drive())
    ended, cpu = time.time(), time.process_time() - cpu
    if worker is not None:
        worker.destroy()
    store.close()
    return {
        "start": started,
        "end": ended,
        "saves": saves,
        "journal_s": sum(journal_s),
        "tool_calls": len(started_keys),
        "transitions": transitions,
        "cpu_s": cpu,
    }


class _TimedJournal:
    """A tool journal that adds the time of each of its calls to ``spent``, and the key of
    each call started to ``started`` (a DBOS model step reads the journal too: a cancel
    request, ``agent_fsm.dbos.cancelling``, whose time counts here)."""

    def __init__(self, journal: Any, spent: list[float], started: list[str]) -> None:
        self._journal = journal
        self._spent = spent
        self._started = started
        if hasattr(journal, "lookup_pair"):  # one read for a DBOS tool step (PairedLookup)
            self.lookup_pair = self._lookup_pair
        if hasattr(journal, "finish_and_lookup"):  # a DBOS tool step's end (FinishingLookup)
            self.finish_and_lookup = self._finish_and_lookup
        if hasattr(journal, "start_unless_known"):  # and its start (StartingLookup)
            self.start_unless_known = self._start_unless_known
        if hasattr(journal, "lookup_or_start"):  # a call's first start (StartingJournal)
            self.lookup_or_start = self._lookup_or_start
        if hasattr(journal, "finish_first"):  # a DBOS tool call's end without a step
            self.finish_first = self._finish_first
        if hasattr(journal, "finish_first_and_lookup"):  # and with its cancel request's read
            self.finish_first_and_lookup = self._finish_first_and_lookup
        if hasattr(journal, "keep_outcome"):  # a DBOS model call's outcome (OutcomeJournal):
            self.keep_outcome = journal.keep_outcome  # a step's record before, in "rest"
            self.outcome_and_lookup = journal.outcome_and_lookup

    def _timed(self, method: str, *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return getattr(self._journal, method)(*args)
        finally:
            self._spent.append(time.perf_counter() - started)

    def lookup(self, key: str) -> Any:
        return self._timed("lookup", key)

    def _lookup_pair(self, key: str, other: str) -> Any:
        return self._timed("lookup_pair", key, other)

    def _start_unless_known(self, key: str, call: Any, other: str) -> Any:
        self._started.append(key)
        return self._timed("start_unless_known", key, call, other)

    def _finish_first(self, key: str, result: Any) -> Any:
        return self._timed("finish_first", key, result)

    def _finish_first_and_lookup(self, key: str, result: Any, other: str) -> Any:
        return self._timed("finish_first_and_lookup", key, result, other)

    def _lookup_or_start(self, key: str, call: Any) -> Any:
        found = self._timed("lookup_or_start", key, call)
        if found is None:
            self._started.append(key)
        return found

    def _finish_and_lookup(self, key: str, result: Any, other: str) -> Any:
        return self._timed("finish_and_lookup", key, result, other)

    def record_started(self, key: str, call: Any) -> None:
        self._started.append(key)
        self._timed("record_started", key, call)

    def record_finished(self, key: str, result: Any) -> None:
        self._timed("record_finished", key, result)


def _server_counts(location: str) -> tuple[int, int]:
    """The PostgreSQL server's transactions committed in the database, and its WAL flushes
    to disk (``pg_stat_wal.wal_sync``), so far."""
    import psycopg

    url = location.split(" ", 1)[0]
    with psycopg.connect(url, autocommit=True) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        syncs = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    assert commits is not None
    assert syncs is not None
    return int(commits[0]), int(syncs[0])


def measure(kind: str, location: str, runs: int, turns: int, workers: int) -> dict[str, float]:
    """One configuration: ``runs`` runs split between ``workers`` processes."""
    ids = [f"run-{n:05d}" for n in range(runs)]
    context = multiprocessing.get_context("spawn")  # no connection crosses a fork
    on_server = kind in ("postgres", *DBOS_KINDS)
    before = _server_counts(location) if on_server else (0, 0)
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        parts = [
            pool.submit(_worker, kind, location, ids[n::workers], turns) for n in range(workers)
        ]
        results = [part.result() for part in parts]
    after = _server_counts(location) if on_server else (0, 0)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    saves = [s for r in results for s in r["saves"]]
    transitions = sum(r["transitions"] for r in results)
    busy = sum(r["end"] - r["start"] for r in results)
    journal_s = sum(r["journal_s"] for r in results)
    tool_calls = sum(r["tool_calls"] for r in results)
    nan = float("nan")  # no checkpoints (dbos); no server (memory, sqlite)
    calls = runs * (turns - 1)  # every turn but the last calls the tool once
    return {
        "commits_per_run": (after[0] - before[0]) / runs if on_server else nan,
        "syncs_per_call": (after[1] - before[1]) / calls if on_server else nan,
        "runs_per_s": runs / wall,
        "saves_per_run": len(saves) / runs,
        "save_us": statistics.fmean(saves) * 1e6 if saves else nan,
        "save_p99_us": statistics.quantiles(saves, n=100)[98] * 1e6 if saves else nan,
        "journal_us": journal_s / tool_calls * 1e6,
        "rest_us": (busy - sum(saves) - journal_s) / transitions * 1e6,
        "cpu_ms_per_run": sum(r["cpu_s"] for r in results) / runs * 1e3,
    }


@contextmanager
def postgres_url() -> Iterator[str]:
    """AGENT_FSM_POSTGRES_URL, or a throwaway cluster for the benchmark's duration."""
    url = os.environ.get("AGENT_FSM_POSTGRES_URL")
    if url:
        yield url
        return
    script = ROOT / "scripts" / "postgres.sh"
    home = Path(tempfile.mkdtemp(prefix="agent-fsm-bench-pg."))
    subprocess.run(
        ["bash", str(script), "start", "--dir", str(home)], check=True, stdout=subprocess.DEVNULL
    )
    try:
        yield (home / "url").read_text().strip()
    finally:
        subprocess.run(["bash", str(script), "stop", str(home)], check=True)


@contextmanager
def storage(kind: str, pg_url: str | None) -> Iterator[str]:
    """A fresh place for a store of ``kind``: a SQLite file, a PostgreSQL schema."""
    if kind == "memory":
        yield ""
    elif kind == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield str(Path(tmp) / "bench.sqlite3")
    else:
        import psycopg
        from psycopg import sql

        assert pg_url is not None
        schema = f"bench_{uuid.uuid4().hex[:12]}"
        if kind in DBOS_KINDS:  # DBOS lays its tables out once, before the workers start
            from dbos import DBOS

            DBOS(config=_dbos_config(pg_url, schema, "bench-setup"))
            DBOS.launch()
            DBOS.destroy(destroy_registry=True)
        try:
            yield f"{pg_url} {schema}"
        finally:
            with psycopg.connect(pg_url, autocommit=True) as conn:
                for name in (schema, f"{schema}_dbos"):
                    drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name))
                    conn.execute(drop)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--runs", type=int, default=1000, help="runs per configuration (default: 1000)"
    )
    parser.add_argument(
        "--turns",
        type=int,
        default=10,
        help="model calls per run; each but the last calls the tool once (default: 10)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 4],
        help="numbers of worker processes to measure, each sharing the runs (default: 1 4)",
    )
    parser.add_argument(
        "--stores",
        nargs="+",
        default=["memory", "sqlite", "postgres", "dbos"],
        choices=["memory", "sqlite", "postgres", *DBOS_KINDS],
        help="what to measure: postgres is leases-only runs on PostgresStore, dbos the same"
        " runs as DBOS workflows on the same server, dbos-async the same with DBOS's commits"
        " not waiting for the disk (DBOSWorker(synchronous_commit=False)) (default: memory"
        " sqlite postgres dbos)",
    )
    args = parser.parse_args()
    print(f"{args.runs} runs x {args.turns} turns (model calls), leased, on {os.cpu_count()} cores")
    header = (
        f"{'store':10} {'workers':>7} {'runs/s':>8} {'saves/run':>9} {'µs/save':>8}"
        f" {'p99 µs':>8} {'µs journal/tool call':>20} {'µs/transition, rest':>19}"
        f" {'commits/run':>11} {'WAL flushes/tool call':>21} {'worker CPU ms/run':>17}"
    )
    print(header)
    print("-" * len(header))
    needs_server = {"postgres", *DBOS_KINDS} & set(args.stores)
    server = postgres_url() if needs_server else contextlib.nullcontext(None)
    with server as pg_url:
        for kind in args.stores:
            for workers in args.workers:
                with storage(kind, pg_url) as location:
                    m = measure(kind, location, args.runs, args.turns, workers)
                save, p99 = (
                    (f"{m['save_us']:>8.0f}", f"{m['save_p99_us']:>8.0f}")
                    if m["saves_per_run"]
                    else (f"{'-':>8}", f"{'-':>8}")
                )
                print(
                    f"{kind:10} {workers:>7} {m['runs_per_s']:>8.1f} {m['saves_per_run']:>9.1f}"
                    f" {save} {p99} {m['journal_us']:>20.0f} {m['rest_us']:>19.0f}"
                    f" {m['commits_per_run']:>11.1f} {m['syncs_per_call']:>21.2f}"
                    f" {m['cpu_ms_per_run']:>17.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
