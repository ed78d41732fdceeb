"""Round trips, statements and transactions per run of a leases-only run on PostgresStore, call
by call: what each store and tool journal call of benchmarks/stores.py's run (``--stores
postgres``) sends the server, counted from libpq's trace of the store's connection. Counts,
not times: they do not move with a busy machine.

The run is stores.py's (``--turns`` model calls, each but the last calling one async no-op
tool, checkpointed after every transition under a lease, ``lease_s=30``), driven one after
another in this process. Printed per call kind and run: the calls, the round trips (the
client reading answers after it sent: what a call waits for the server), the statements (the
SQL sent, BEGIN, COMMIT and SET LOCAL aside) and the transactions (a statement outside
BEGIN ... COMMIT is one of its own; the server's ``xact_commit`` counts the same), then the
totals. psycopg's prepared statements are turned off on the traced connection, so that each
statement's text is in the trace (preparing a statement costs a round trip once per
connection; the real store's does so after five uses).

    python benchmarks/round_trips.py [--runs 20] [--turns 10]

PostgreSQL: the database of AGENT_FSM_POSTGRES_URL, else a throwaway cluster started (and
stopped) with scripts/postgres.sh; a fresh schema, dropped after.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import re
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stores import agent_options, postgres_url, storage  # stores.py's run

STORE_CALLS = (
    "create",
    "enqueue",
    "save",
    "save_unless_behind",
    "load",
    "exists",
    "delete",
    "claim",
    "renew",
    "release",
    "lease",
    "claim_next",
    "cancel",
)
CONTROL = ("BEGIN", "SET LOCAL", "COMMIT", "ROLLBACK")
_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


def count(trace: str) -> collections.Counter[str]:
    """Round trips, statements and transactions in libpq's trace of one call (its lines:
    time, direction F or B, length, message type, contents)."""
    counted: collections.Counter[str] = collections.Counter()
    last, in_transaction, query = "", False, ""
    for line in trace.splitlines():
        fields = line.split("\t")
        if len(fields) < 4:
            continue
        direction, message = fields[1], fields[3]
        if direction == "B" and last == "F":
            counted["round trips"] += 1
        last = direction
        if direction == "F" and message == "Parse":
            query = _QUOTED.findall(fields[4])[1]
        elif direction == "F" and message == "Execute":
            if query.startswith("BEGIN"):
                in_transaction = True
            elif query.startswith(("COMMIT", "ROLLBACK")):
                in_transaction = False
                counted["transactions"] += 1
            elif not query.startswith(CONTROL):
                counted["statements"] += 1
                counted["transactions"] += not in_transaction
    return counted


def traced(counts: dict[str, collections.Counter[str]], store: Any) -> Callable[..., Any]:
    """A decorator counting what each call of a method sends on ``store``'s connection
    (calls made inside another counted call count as that one's)."""
    depth = [0]

    def decorate(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def counting(*args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return method(*args, **kwargs)
            conn = store._db._connection()
            conn.prepare_threshold = None
            with tempfile.NamedTemporaryFile("w+") as out:
                conn.pgconn.trace(out.fileno())
                depth[0] += 1
                try:
                    return method(*args, **kwargs)
                finally:
                    depth[0] -= 1
                    conn.pgconn.untrace()
                    out.seek(0)
                    counts[name].update(count(out.read()), calls=1)

        return counting

    return decorate


class _Counted:
    """A tool journal whose calls are counted (``traced``); it has the methods the journal
    has, so the engine uses the same ones."""

    def __init__(self, journal: Any, decorate: Callable[..., Any]) -> None:
        self._journal = journal
        self._decorate = decorate

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._journal, name)
        return self._decorate(f"journal.{name}", found) if callable(found) else found


def measure(location: str, runs: int, turns: int) -> dict[str, collections.Counter[str]]:
    from agent_fsm import Agent
    from agent_fsm.durable.postgres import PostgresStore

    url, schema = location.split(" ", 1)
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with PostgresStore(url, schema=schema) as store:
        decorate = traced(counts, store)
        for name in STORE_CALLS:
            setattr(store, name, decorate(f"store.{name}", getattr(store, name)))
        journal = store.journal
        store.journal = lambda run_id, **lease: _Counted(journal(run_id, **lease), decorate)
        agent = Agent(**agent_options(turns), store=store, lease_s=30)

        async def drive() -> None:
            for n in range(runs):
                result = await agent.run("go", run_id=f"run-{n:05d}")
                assert result.output == "done", result

        asyncio.run(drive())
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="runs (default: 20)")
    parser.add_argument(
        "--turns",
        type=int,
        default=10,
        help="model calls per run; each but the last calls the tool once (default: 10)",
    )
    args = parser.parse_args()
    with postgres_url() as url, storage("postgres", url) as location:
        counts = measure(location, args.runs, args.turns)
    columns = ("calls", "round trips", "statements", "transactions")
    print(f"{args.runs} runs x {args.turns} turns (model calls), leased; per run:")
    header = f"{'call':32}" + "".join(f"{column:>14}" for column in columns)
    print(header)
    print("-" * len(header))
    total: collections.Counter[str] = collections.Counter()
    for name, counted in sorted(counts.items()):
        total.update(counted)
        print(f"{name:32}" + "".join(f"{counted[c] / args.runs:>14.1f}" for c in columns))
    print(f"{'total':32}" + "".join(f"{total[c] / args.runs:>14.1f}" for c in columns))


if __name__ == "__main__":
    main()
