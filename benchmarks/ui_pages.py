"""How long `agent-fsm ui` takes to serve its pages over a store of 10,000 runs (issue 36's
goal: under 200 ms each).

    python benchmarks/ui_pages.py [--runs N] [--rounds R] [--store PATH]

It fills a SQLite store with N runs (copies of three real runs: a finished one, one paused
on ask_user, one on an approval; the first N/10 left mid-run), serves the ui with uvicorn on
127.0.0.1 as `agent-fsm ui` does, and times whole HTTP requests from a client in this
process (connection, server, page), R rounds each, reporting the median and the worst:
the runs list as it opens (the newest 200), the list filtered by a stop reason (a common
one, the running runs, two that no run has: one of ERROR, one of DONE, so every DONE run is
read; and a common one with 2,000 shown), filtered by
state, one run's page, and one step of it.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.table import AgentState
from agent_fsm.ui.app import create_app
from tests.ui_support import serving, sqlite_runs


def _fill(folder: Path, count: int) -> tuple[SQLiteStore, str]:
    runs = sqlite_runs(folder)
    store = runs.store
    assert isinstance(store, SQLiteStore)
    models = [store.load(run_id) for run_id in (runs.finished, runs.asking, runs.approving)]
    started = time.perf_counter()
    for number in range(count - 3):
        state = copy.deepcopy(models[number % 3])
        state.run_id = f"run-{number:06d}"
        if number < count // 10:
            state.state = AgentState.THINK  # left mid-run
        store.save(state)
    print(f"filled {count} runs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return store, runs.finished


def _time(url: str, rounds: int) -> tuple[float, float, int]:
    times, size = [], 0
    for _ in range(rounds):
        started = time.perf_counter()
        with urllib.request.urlopen(url) as response:
            size = len(response.read())
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times), max(times), size


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        store, finished = _fill(Path(folder), args.runs)
        app = create_app(store, store_name="bench.sqlite3")
        pages = {
            "runs list (newest 200)": "/",
            "runs list, stop=final_answer": "/?stop=final_answer",
            "runs list, stop=running": "/?stop=running",
            "runs list, stop=timeout (none)": "/?stop=timeout",
            "runs list, stop=max_tokens (none)": "/?stop=max_tokens",
            "runs list, stop=ask_user, 2000": "/?stop=ask_user&limit=2000",
            "runs list, state=DONE": "/?state=DONE",
            "one run": f"/runs/{finished}",
            "one run, step 3": f"/runs/{finished}?step=3",
        }
        with serving(app) as base:
            print(f"{args.runs} runs, {args.rounds} rounds each, whole HTTP requests (ms)")
            print(f"{'page':<32} {'median':>8} {'worst':>8} {'bytes':>9}")
            for name, path in pages.items():
                _time(base + path, 1)  # warm
                median, worst, size = _time(base + path, args.rounds)
                print(f"{name:<32} {median:>8.1f} {worst:>8.1f} {size:>9,}")


if __name__ == "__main__":
    main()
