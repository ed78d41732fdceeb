"""Adversarial runs per second through the property harness (``assert_terminates``).

Each run is one generated behaviour played against the demo agent: a hostile model (broken
replies, errors of every kind, absurd usage, lone surrogates), tool doubles that fail, time
out, exit or return huge outputs, on a fake clock, with every run invariant checked. Issue 20
asks for >= 1,000 runs per second on one core; this script measures where it stands.

    python benchmarks/harness_rate.py [--examples N] [--store none|memory|sqlite] [--instructions]

``--store none`` (the default) is the harness's own configuration, ``assert_terminates(agent)``:
runs checkpoint only where they pause. ``memory`` and ``sqlite`` checkpoint every transition
in a durable store, as an agent with ``store=`` does. The runs counted are the runs played
(``Stage.play``), not hypothesis examples: a batch plays up to eight, and records drawn alike
are played once. Hypothesis generation is included, shrinking only on a failure (which would
end the script with the failure instead). Timings on shared machines are noisy: run it on an
idle machine, and repeat.

``--instructions`` counts CPU instructions per run instead, with valgrind's callgrind
(``apt-get install valgrind``): the same script at two sizes, the difference divided by the
difference in runs played, so interpreter start-up, imports and the agent's set-up cancel
out. Counts do not move with the machine's load, so they compare two versions of the harness
where timings cannot. It takes a few minutes.

Measured on a shared 2-core machine, instructions between 304 and 1,000 runs asked for
(wall rates vary twofold with the neighbours' load; the highest were on a quiet machine):

    composed strategies, ~30 draws a run (before issue 20):    12.1 M per run (memory; 100-300)
    a block and a script drawn per run (stop 29):               4.71 M (memory), 413-585 runs/s
    eight records drawn as one value per example (stop 30):     2.66 M (memory), 558-900 runs/s
                                                                2.12 M (none), 664-1,219 runs/s
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import structlog
from hypothesis import HealthCheck, settings

from agent_fsm.demo import demo_agent
from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.testing import assert_terminates
from agent_fsm.testing.harness import CaseResult, Stage


def _play(examples: int, store_kind: str) -> tuple[int, float]:
    """How many runs ``examples`` requested generated runs of the demo agent played, and the
    seconds they took."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    played = 0
    play = Stage.play

    def counted(stage: Stage, *args: Any, **kwargs: Any) -> CaseResult:
        nonlocal played
        played += 1
        return play(stage, *args, **kwargs)

    Stage.play = counted  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as folder:
        stores: dict[str, CheckpointStore | None] = {
            "none": None,
            "memory": MemoryStore(),
            "sqlite": SQLiteStore(Path(folder) / "runs.sqlite3"),
        }
        store = stores[store_kind]
        fixed = settings(
            max_examples=examples,
            database=None,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        began = time.perf_counter()
        assert_terminates(demo_agent(), settings=fixed, store=store)
        return played, time.perf_counter() - began


def _instructions(examples: int, store_kind: str, folder: Path) -> tuple[int, int]:
    """Runs played and instructions executed by a child process asked for ``examples``
    generated runs."""
    out = folder / f"callgrind.{examples}.out"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    command += [__file__, "--examples", str(examples), "--store", store_kind]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    child = subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    match = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.MULTILINE)
    runs = re.search(r"^(\d+) adversarial runs", child.stdout, re.MULTILINE)
    if match is None or runs is None:
        raise SystemExit(f"no instruction total in {out}, or no run count in {child.stdout!r}")
    return int(runs.group(1)), int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=2_000)
    parser.add_argument("--store", choices=["none", "memory", "sqlite"], default="none")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per run with callgrind (between 304 and 1,000 runs asked)",
    )
    args = parser.parse_args()
    if not args.instructions:
        played, took = _play(args.examples, args.store)
        print(
            f"{played} adversarial runs ({args.store} store) in {took:.2f} s: "
            f"{played / took:,.0f} runs per second"
        )
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian/Ubuntu: apt-get install valgrind)")
        return 2
    short, long = 304, 1_000
    with tempfile.TemporaryDirectory() as folder:
        (runs_a, count_a), (runs_b, count_b) = (
            _instructions(n, args.store, Path(folder)) for n in (short, long)
        )
    per_run = (count_b - count_a) / (runs_b - runs_a)
    print(
        f"{per_run / 1e6:.2f} M instructions per adversarial run ({args.store} store; "
        f"{runs_a} -> {runs_b} runs played)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
