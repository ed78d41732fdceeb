"""Run leases in a PostgresStore's ``leases`` table (the contract is ``durable.leases``'s).

A claim, a renewal and a release are each one transaction of their own, which the store
sends in one round trip (``PostgresDatabase.durable_statements``): their statements here
(``CLAIM`` and ``HOLDER``, ``RENEW``, ``RELEASE``), and what their rows say (``claimed``,
``renewed``). The functions taking a connection run inside the caller's transaction (a
fenced write's). Times are read on the server
(``NOW``), so the workers' clocks never matter. A claim is one ``INSERT ... ON CONFLICT DO
UPDATE ... WHERE expired``: the row lock it takes makes a concurrent claim wait and then find
the lease live, so exactly one of them wins. A fenced write first updates the lease row by
its token (the renewal): a takeover committed before it leaves no row to update, and one
attempted after it waits for the write's commit, so a write and a takeover never interleave.
A released lease keeps its row (expired), so the run's token only ever grows. A claim and a
renewal also read the run's pending cancel request (``durable.queue``) in their statement.

psycopg is imported for the type checker only (``durable.postgres`` is the module using it).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agent_fsm.durable.leases import Lease, leased_error, lost_error
from agent_fsm.durable.postgres_rows import NOW
from agent_fsm.errors import RunLeased

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[Any]
    Cursor = psycopg.Cursor[Any]

__all__ = [
    "CLAIM",
    "HOLDER",
    "RELEASE",
    "RENEW",
    "check_fence",
    "check_locked_fence",
    "claimed",
    "fence",
    "fenced_insert",
    "live",
    "refusal",
    "renewed",
]

CLAIM = (
    "INSERT INTO leases AS l VALUES (%(run_id)s, %(owner)s, 1, " + NOW + " + %(ttl)s)"
    " ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner, token = l.token + 1,"
    " expires_at = excluded.expires_at WHERE l.expires_at <= "
    + NOW
    + " RETURNING token, expires_at, (SELECT cancel FROM runs r WHERE r.run_id = l.run_id)"
)
"""Take the run ``%(run_id)s``'s lease for ``%(owner)s`` for ``%(ttl)s`` seconds unless a
live one exists: the new token, expiry and the run's cancel request; no row when refused.
The conflicting row stays locked until the transaction ends, claimed or not (PostgreSQL's
``ON CONFLICT DO UPDATE`` locks it before its ``WHERE``), so ``HOLDER`` sent after it in
the same transaction reads the lease that refused it."""

HOLDER = "SELECT owner, expires_at, " + NOW + " FROM leases WHERE run_id = %(run_id)s"
"""Who holds the run ``%(run_id)s``'s lease, until when, and the server's time now."""

_NOBODY = ("nobody", 0.0, 0.0)
"""What ``HOLDER`` tells of a run whose lease row is gone: no holder, expired."""

RENEW = (
    "UPDATE leases SET expires_at = " + NOW + " + %(ttl)s"
    " WHERE run_id = %(run_id)s AND token = %(token)s"
    " RETURNING expires_at, (SELECT cancel FROM runs r WHERE r.run_id = leases.run_id)"
)
"""Extend the lease of token ``%(token)s`` on ``%(run_id)s`` by ``%(ttl)s`` seconds from now:
its new expiry and the run's cancel request; no row when it was taken over."""

RELEASE = "UPDATE leases SET expires_at = 0 WHERE run_id = %(run_id)s AND token = %(token)s"
"""Let the lease of token ``%(token)s`` on ``%(run_id)s`` expire now, unless it was taken
over meanwhile (then nothing changes)."""

_LIVE = (
    "SELECT owner, expires_at, token, " + NOW + " FROM leases WHERE run_id = %s"
    " AND expires_at > " + NOW
)


def fenced_insert(insert: str, lease: Lease | None) -> str:
    """``insert`` (an ``INSERT ... SELECT`` of the run ``%(run_id)s``, ending in ``WHERE``
    and a ``RETURNING``) made to write only under the fence: the renewal of ``lease`` (with
    ``%(ttl)s``, ``%(token)s``), or (none given) no live lease on the run. One statement: no
    row back says the fence failed and nothing was written (``refusal`` says why)."""
    if lease is not None:
        return (
            "WITH fence AS (UPDATE leases SET expires_at = " + NOW + " + %(ttl)s"
            " WHERE run_id = %(run_id)s AND token = %(token)s RETURNING 1) "
            + insert.replace(" WHERE ", " WHERE EXISTS (SELECT FROM fence) AND ", 1)
        )
    return insert.replace(
        " WHERE ",
        " WHERE NOT EXISTS (SELECT FROM leases WHERE run_id = %(run_id)s"
        " AND expires_at > " + NOW + ") AND ",
        1,
    )


def refusal(conn: Connection, run_id: str, lease: Lease | None) -> RunLeased:
    """Why a fenced write of ``run_id`` under ``lease`` was refused: the lease was taken
    over, or (none given) another's lease is live."""
    holder, expires_at, now = _holder(conn, run_id)
    if lease is None:
        return leased_error(run_id, holder, expires_at, now)
    return lost_error(lease, holder, expires_at)


def claimed(run_id: str, owner: str, ttl_s: float, claim: list[Any], holder: list[Any]) -> Lease:
    """The lease a claim took: ``CLAIM``'s rows, and those of ``HOLDER`` sent after it in
    the same transaction.

    Raises:
        RunLeased: another lease is live (``holder`` names it).
    """
    if not claim:
        owned_by, expires_at, now = holder[0] if holder else _NOBODY
        raise leased_error(run_id, owned_by, expires_at, now)
    token, expires_at, request = claim[0]
    return Lease(
        run_id=run_id,
        owner=owner,
        token=token,
        ttl_s=ttl_s,
        expires_at=expires_at,
        cancel_requested=request,
    )


def fence(conn: Connection, run_id: str, lease: Lease | None) -> Cursor:
    """Send the fence of a write of ``run_id`` under ``lease``: the lease's renewal, or (none
    given) the look-up of a live lease. Its result is read after the write's own statement
    was sent too, in one round trip (``check_fence``)."""
    if lease is not None:
        return conn.execute(RENEW, {"ttl": lease.ttl_s, "run_id": run_id, "token": lease.token})
    return conn.execute(_LIVE, (run_id,))


def check_fence(conn: Connection, run_id: str, lease: Lease | None, sent: Cursor) -> float | None:
    """The renewed expiry of ``lease`` (None without one), from the fence ``sent``.

    Raises:
        RunLeased: ``lease`` was taken over, or (none given) a lease is live.
    """
    row = sent.fetchone()
    if lease is None:
        if row is not None:
            owner, expires_at, _, now = row
            raise leased_error(run_id, owner, expires_at, now)
        return None
    if row is None:
        holder, expires_at, _ = _holder(conn, run_id)
        raise lost_error(lease, holder, expires_at)
    return float(row[0])


def check_locked_fence(
    conn: Connection, run_id: str, lease: Lease | None, fence: list[Any]
) -> None:
    """``check_fence`` for the fence columns a save reads with the run's row
    (``LOCK_LEASED_RUN``: the renewed expiry; ``LOCK_FREE_RUN``: a live lease's holder,
    expiry and the server's time)."""
    if lease is None:
        owner, expires_at, now = fence
        if owner is not None:
            raise leased_error(run_id, owner, expires_at, now)
    elif fence[0] is None:
        holder, expires_at, _ = _holder(conn, run_id)
        raise lost_error(lease, holder, expires_at)


def renewed(lease: Lease, renewal: list[Any]) -> Lease | None:
    """``lease`` renewed, with the run's pending cancel request, from ``RENEW``'s rows; None
    when it was taken over (``refusal`` says by whom)."""
    if not renewal:
        return None
    expires_at, request = renewal[0]
    return replace(lease, expires_at=float(expires_at), cancel_requested=request)


def live(conn: Connection, run_id: str) -> Lease | None:
    """The run's live lease, or None."""
    row = conn.execute(_LIVE, (run_id,)).fetchone()
    if row is None:
        return None
    owner, expires_at, token, _ = row
    return Lease(run_id=run_id, owner=owner, token=token, ttl_s=0.0, expires_at=expires_at)


def _holder(conn: Connection, run_id: str) -> tuple[str, float, float]:
    """Who holds the run's lease, until when, and the server's time now (``HOLDER``)."""
    row = conn.execute(HOLDER, {"run_id": run_id}).fetchone()
    return (row[0], row[1], row[2]) if row is not None else _NOBODY
