"""Adversarial runs per second through the property harness (``assert_terminates``).

Each example is one generated run of the demo agent: a hostile model behaviour (broken
replies, errors of every kind, absurd usage, lone surrogates), tool doubles that fail, time
out, exit or return huge outputs, on a fake clock, with every run invariant checked. Issue 20
asks for >= 1,000 runs per second on one core; this script measures where it stands.

    python benchmarks/harness_rate.py [--examples N] [--store memory|sqlite] [--instructions]

Hypothesis generation and shrinking are included (shrinking only on a failure, which would
end the script with the failure instead). The rate is examples / wall-clock seconds on one
core; run it on an idle machine and repeat, as timings on shared machines are noisy.

``--instructions`` counts CPU instructions per generated run instead, with valgrind's
callgrind (``apt-get install valgrind``): the same script at two example counts, the
difference divided by the difference in examples, so interpreter start-up, imports and the
agent's set-up cancel out. Counts do not move with the machine's load, so they compare
two versions of the harness where timings cannot. It takes a few minutes.

Measured on a shared 2-core machine (memory store, 2,000 examples; the instructions between
100 and 300 examples):

    composed strategies, ~30 draws a run:       245-285 runs/s, 12.1 M instructions per run
    Catalogue, two draws a run (issue 20):      580-685 runs/s,  4.35 M instructions per run

About half of what is left is hypothesis's own cost of an example (~2.1 M instructions
whatever it draws), the rest playing the run (~2.4 M, most of it the engine).
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

import structlog
from hypothesis import HealthCheck, settings

from agent_fsm.demo import demo_agent
from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.testing import assert_terminates


def _play(examples: int, store_kind: str) -> float:
    """Seconds taken by ``examples`` generated runs of the demo agent."""
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    with tempfile.TemporaryDirectory() as folder:
        store: CheckpointStore = (
            SQLiteStore(Path(folder) / "runs.sqlite3") if store_kind == "sqlite" else MemoryStore()
        )
        fixed = settings(
            max_examples=examples,
            database=None,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        began = time.perf_counter()
        assert_terminates(demo_agent(), settings=fixed, store=store)
        return time.perf_counter() - began


def _instructions(examples: int, store_kind: str, folder: Path) -> int:
    """Instructions executed by a child process playing ``examples`` generated runs."""
    out = folder / f"callgrind.{examples}.out"
    command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable]
    command += [__file__, "--examples", str(examples), "--store", store_kind]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(command, check=True, env=env, capture_output=True)
    match = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"no instruction total in {out}")
    return int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--examples", type=int, default=2_000)
    parser.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    parser.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions per run with callgrind (between 100 and 300 examples)",
    )
    args = parser.parse_args()
    if not args.instructions:
        took = _play(args.examples, args.store)
        print(
            f"{args.examples} adversarial runs ({args.store} store) in {took:.2f} s: "
            f"{args.examples / took:,.0f} runs per second"
        )
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian/Ubuntu: apt-get install valgrind)")
        return 2
    short, long = 100, 300
    with tempfile.TemporaryDirectory() as folder:
        counts = {n: _instructions(n, args.store, Path(folder)) for n in (short, long)}
    per_run = (counts[long] - counts[short]) / (long - short)
    print(
        f"{per_run / 1e6:.2f} M instructions per adversarial run ({args.store} store; "
        f"{short} -> {long} examples)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
