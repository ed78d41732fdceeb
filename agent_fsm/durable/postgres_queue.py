"""The queue's statements in a PostgresStore (the contract is ``durable.queue``'s): the
claim of the next runnable run and a cancel request, each one statement.

``NEXT_RUN`` walks the partial index ``runs_to_take`` (``postgres_rows.UPGRADES``) of the
runs that have not stopped, in the order they are taken, locks the first one no live lease
holds with ``FOR UPDATE SKIP LOCKED`` (so workers asking at once skip each other's choice
instead of waiting for it) and claims its lease as ``postgres_leases``'s claim does. The
pending cancel request is read with the run's row, and again by every fenced save and
renewal (``postgres_rows``, ``postgres_leases``): it costs no statement of its own.
"""

from __future__ import annotations

from agent_fsm.durable.postgres_rows import NOW
from agent_fsm.durable.queue import STOPPED_SQL

__all__ = ["CANCEL", "NEXT_RUN"]

NEXT_RUN = (
    "WITH next AS (SELECT r.run_id, r.cancel FROM runs r"
    f" WHERE r.state NOT IN {STOPPED_SQL} AND NOT EXISTS (SELECT FROM leases l"
    " WHERE l.run_id = r.run_id AND l.expires_at > " + NOW + ")"
    " ORDER BY r.priority DESC, r.created_at, r.run_id LIMIT 1 FOR UPDATE OF r SKIP LOCKED),"
    " claimed AS (INSERT INTO leases AS l SELECT run_id, %(owner)s, 1, " + NOW + " + %(ttl)s"
    " FROM next ON CONFLICT (run_id) DO UPDATE SET owner = excluded.owner,"
    " token = l.token + 1, expires_at = excluded.expires_at WHERE l.expires_at <= "
    + NOW
    + " RETURNING l.run_id, l.token, l.expires_at)"
    " SELECT next.run_id, next.cancel, claimed.token, claimed.expires_at"
    " FROM next LEFT JOIN claimed ON claimed.run_id = next.run_id"
)
"""``claim_next`` in one statement: the next runnable run (not stopped, no live lease; by
priority, age and id), its row locked and the rows other workers hold locked skipped, and
its lease claimed. No row: nothing is runnable. A row without a token: a worker claimed
that run between this statement's snapshot and its claim, which then found the lease live
and took nothing: try again."""

CANCEL = (
    "WITH marked AS (UPDATE runs SET cancel = COALESCE(cancel, %(reason)s)"
    f" WHERE run_id = %(run_id)s AND state NOT IN {STOPPED_SQL} RETURNING 1)"
    " SELECT EXISTS (SELECT FROM marked) FROM runs WHERE run_id = %(run_id)s"
)
"""``cancel`` in one statement: record the request (the first reason stays) unless the run
stopped (a concurrent save of its stop is waited for, then seen). No row: no such run;
else whether the request was recorded."""
