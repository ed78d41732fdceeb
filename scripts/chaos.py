"""The chaos test's full profile, by hand (``make chaos``): a fleet of worker processes works
through a queue of runs on a PostgreSQL cluster of its own, leases-only and then on DBOS,
while it is attacked (SIGKILLs inside tool calls and saves, PostgreSQL stopped and started,
workers SIGSTOPped past their lease, skewed clocks, double approvals); then every run is
checked, and the figures printed. ``tests/chaos.py`` says what is done and checked;
``tests/test_chaos.py`` runs a small profile in CI.

    python scripts/chaos.py [--mode leases dbos] [--runs 240] [--workers 5] [--seed N] ...

Exits 1 when a problem was found (each is printed). The cluster is started with
scripts/postgres.sh (which installs PostgreSQL as root when it is missing) and deleted at
the end; the workers' logs stay in the directories the summary names.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' chaos modules

from tests.chaos import FULL, MODES, Cluster, run_chaos


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--mode",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="the fleets to attack, one after the other: leases-only workers"
        " (PostgresStore, lease_s, take_next) and DBOS workers (DBOSWorker)",
    )
    parser.add_argument("--runs", type=int, default=FULL.runs, help="runs per mode")
    parser.add_argument(
        "--workers", type=int, default=FULL.workers, help="worker processes at a time"
    )
    parser.add_argument(
        "--kills-in-tools",
        type=int,
        default=FULL.kills_in_tools,
        help="SIGKILLs of a worker inside a non-idempotent tool call (before or after its effect)",
    )
    parser.add_argument(
        "--kills-in-saves",
        type=int,
        default=FULL.kills_in_saves,
        help="SIGKILLs of a worker inside a save: a checkpoint or a journal write, or DBOS"
        " recording a step",
    )
    parser.add_argument(
        "--pg-restarts", type=int, default=FULL.pg_restarts, help="PostgreSQL stops and starts"
    )
    parser.add_argument(
        "--pg-down-s",
        type=float,
        default=FULL.pg_down_s,
        help="how long PostgreSQL stays down each time (seconds; longer than a lease)",
    )
    parser.add_argument(
        "--sigstops",
        type=int,
        default=FULL.sigstops,
        help="workers SIGSTOPped while driving a run, until another worker took it over",
    )
    parser.add_argument(
        "--skews",
        type=float,
        nargs="*",
        default=list(FULL.skews),
        help="clock skews (seconds) of worker slots 1, 2, ... (slot 0 keeps the right time)",
    )
    parser.add_argument(
        "--approval-every",
        type=int,
        default=FULL.approval_every,
        help="every n-th run makes two transfers a person approves (clicked twice, and late)",
    )
    parser.add_argument(
        "--seed", type=int, default=FULL.seed, help="draws when and whom each fault strikes"
    )
    parser.add_argument(
        "--timeline", action="store_true", help="print what was done, when, after each mode"
    )
    args = parser.parse_args()
    profile = dataclasses.replace(
        FULL,
        runs=args.runs,
        workers=args.workers,
        kills_in_tools=args.kills_in_tools,
        kills_in_saves=args.kills_in_saves,
        pg_restarts=args.pg_restarts,
        pg_down_s=args.pg_down_s,
        sigstops=args.sigstops,
        skews=tuple(args.skews),
        approval_every=args.approval_every,
        seed=args.seed,
    )
    failed = False
    with Cluster.started(install=True, watch=os.getpid()) as cluster:
        for mode in args.mode:
            report = run_chaos(mode, profile, cluster)
            if args.timeline:
                print("\n".join(report.timeline))
            print(report.summary(), flush=True)
            print(f"  worker logs: {report.logs}", flush=True)
            failed = failed or bool(report.problems)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
