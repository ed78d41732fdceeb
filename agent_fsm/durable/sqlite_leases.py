"""Run leases in a SQLiteStore's ``leases`` table (the contract is ``durable.leases``'s).

Every function runs inside the caller's ``BEGIN IMMEDIATE`` transaction, which holds the
file's write lock: a claim's look-up and write, and a fenced write's token check and the
write itself, cannot interleave with another process's. Times are the store's clock (one
machine: the processes sharing the file read the same clock). A released lease keeps its row
(expired), so the run's token only ever grows; the row goes with the run (``delete``).
"""

from __future__ import annotations

import sqlite3

from agent_fsm.durable.leases import Lease, leased_error, lost_error

__all__ = ["LEASES_TABLE", "claim", "fence", "live", "release", "renew", "requested"]

LEASES_TABLE = """
CREATE TABLE leases (
    run_id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
)
"""


def claim(conn: sqlite3.Connection, run_id: str, owner: str, ttl_s: float, now: float) -> Lease:
    """Take the run's lease unless a live one exists.

    Raises:
        RunLeased: another lease is live.
    """
    row = conn.execute(
        "SELECT owner, token, expires_at FROM leases WHERE run_id = ?", (run_id,)
    ).fetchone()
    if row is not None and row[2] > now:
        raise leased_error(run_id, row[0], row[2], now)
    token = row[1] + 1 if row is not None else 1
    conn.execute(
        "INSERT INTO leases VALUES (?, ?, ?, ?) ON CONFLICT (run_id) DO UPDATE SET"
        " owner = excluded.owner, token = excluded.token, expires_at = excluded.expires_at",
        (run_id, owner, token, now + ttl_s),
    )
    return Lease(
        run_id=run_id,
        owner=owner,
        token=token,
        ttl_s=ttl_s,
        expires_at=now + ttl_s,
        cancel_requested=requested(conn, run_id),
    )


def requested(conn: sqlite3.Connection, run_id: str) -> str | None:
    """The run's pending cancel request (``durable.queue``), or None."""
    row = conn.execute("SELECT cancel FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else row[0]


def renew(conn: sqlite3.Connection, lease: Lease, now: float) -> float:
    """Extend ``lease`` to ``now + ttl_s``; return the new expiry.

    Raises:
        RunLeased: the lease was taken over.
    """
    expires_at = now + lease.ttl_s
    updated = conn.execute(
        "UPDATE leases SET expires_at = ? WHERE run_id = ? AND token = ?",
        (expires_at, lease.run_id, lease.token),
    ).rowcount
    if not updated:
        row = conn.execute(
            "SELECT owner, expires_at FROM leases WHERE run_id = ?", (lease.run_id,)
        ).fetchone()
        raise lost_error(lease, *(row if row is not None else ("nobody", 0.0)))
    return float(expires_at)


def fence(conn: sqlite3.Connection, run_id: str, lease: Lease | None, now: float) -> None:
    """Check that a write of ``run_id`` under ``lease`` may commit, renewing the lease; with
    none, check that no lease is live.

    Raises:
        RunLeased: ``lease`` was taken over, or (none given) a lease is live.
    """
    if lease is not None:
        renew(conn, lease, now)
        return
    row = live(conn, run_id, now)
    if row is not None:
        raise leased_error(run_id, row.owner, row.expires_at, now)


def live(conn: sqlite3.Connection, run_id: str, now: float) -> Lease | None:
    """The run's live lease, or None."""
    row = conn.execute(
        "SELECT owner, token, expires_at FROM leases WHERE run_id = ? AND expires_at > ?",
        (run_id, now),
    ).fetchone()
    if row is None:
        return None
    owner, token, expires_at = row
    return Lease(run_id=run_id, owner=owner, token=token, ttl_s=0.0, expires_at=expires_at)


def release(conn: sqlite3.Connection, lease: Lease) -> None:
    """Let the lease expire now, unless it was taken over meanwhile."""
    conn.execute(
        "UPDATE leases SET expires_at = 0 WHERE run_id = ? AND token = ?",
        (lease.run_id, lease.token),
    )
