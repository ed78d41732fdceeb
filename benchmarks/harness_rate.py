"""Adversarial runs per second through the property harness (``assert_terminates``).

Each example is one generated run of the demo agent: a hostile model behaviour (broken
replies, errors of every kind, absurd usage, lone surrogates), tool doubles that fail, time
out, exit or return huge outputs, on a fake clock, with every run invariant checked. Issue 20
asks for >= 1,000 runs per second on one core; this script measures where it stands.

    python benchmarks/harness_rate.py [--examples N] [--store memory|sqlite]

Hypothesis generation and shrinking are included (shrinking only on a failure, which would
end the script with the failure instead). The rate is examples / wall-clock seconds on one
core; run it on an idle machine and repeat, as timings on shared machines are noisy.
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import time
from pathlib import Path

import structlog
from hypothesis import HealthCheck, settings

from agent_fsm.demo import demo_agent
from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.testing import assert_terminates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2_000)
    parser.add_argument("--store", choices=["memory", "sqlite"], default="memory")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    with tempfile.TemporaryDirectory() as folder:
        store: CheckpointStore = (
            SQLiteStore(Path(folder) / "runs.sqlite3") if args.store == "sqlite" else MemoryStore()
        )
        fixed = settings(
            max_examples=args.examples,
            database=None,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        began = time.perf_counter()
        assert_terminates(demo_agent(), settings=fixed, store=store)
        took = time.perf_counter() - began
    print(
        f"{args.examples} adversarial runs ({args.store} store) in {took:.2f} s: "
        f"{args.examples / took:,.0f} runs per second"
    )


if __name__ == "__main__":
    main()
