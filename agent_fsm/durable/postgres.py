"""PostgresStore: checkpoints, the tool journal and run leases in PostgreSQL, for many workers
on many machines (``pip install -e '.[postgres]'``).

The tables live in a schema of their own (``agent_fsm`` by default), created on first use
and versioned (``postgres_rows`` lays them out), so they never meet an application's tables;
the connection and its transactions are ``postgres_database``'s.

A save writes only the new messages and trace rows and the small ``runs`` row, whatever the
transcript's length. Usually that is one statement, one round trip (``QUICK_*_SAVE``): the
store remembers the revision it last wrote or read of the run, and the statement renews the
run's lease (fenced by its token), locks the run's row, appends and rewrites, all only if
that revision is still the stored one (nobody else wrote the run since). Otherwise (the first
save of the run in this store, another writer, a lease to report on, a history cut short)
the save is one transaction of two statements: the run's row locked ``FOR UPDATE`` with the
lease's fence and the stored counts, then the write (``LOCK_*_RUN``, ``WRITE_RUN``). See
``checkpoint`` for what a save keeps and replaces.

Durability: ``record_started``, run creation and lease claims are committed with a flush to
disk, as the journal's contract asks: a call recorded as started stays so even if the server
crashes. Saves and ``record_finished`` are committed with ``synchronous_commit = off``
(unless ``synchronous_saves=True``): a committed save survives the crash of any worker, and
a crash of the server may lose its last fraction of a second of them, never corrupt older
ones: the runs concerned resume from an earlier checkpoint, their calls answered from the
journal or reported "outcome unknown", never run twice. That is SQLiteStore's contract
(WAL, ``synchronous=NORMAL``), without a disk flush per transition.

Round trips: a lease's claim, renewal and release, ``claim_next`` and ``cancel`` are each one
transaction sent whole, and committed, in one round trip (``PostgresDatabase
.durable_statements``: the statements, BEGIN and COMMIT pipelined, the rows read after the
commit); a refused claim reads who holds the lease in the same transaction, a refused
renewal in a second round trip. A run's creation and a save's long way are transactions
whose statements wait for earlier ones' answers (``PostgresDatabase.transaction``), and for
nothing else: BEGIN goes out with the first statements, COMMIT with the last (a creation is
two round trips; a load, whose answers are read after the commit, one).

Lease times are the server's clock (``clock_timestamp()``), so the workers' clocks may
disagree; ``clock`` only stamps ``created_at``/``updated_at``.

The queue (``durable.queue``): ``claim_next`` is one statement, ``SELECT ... FOR UPDATE SKIP
LOCKED`` of the next runnable run along a partial index, and the claim of its lease
(``postgres_queue.NEXT_RUN``); a save of a leased run and a renewal read the run's pending
cancel request in the statements they make anyway.

Connections: a store holds one connection (no pool: a worker's saves are serialised anyway),
so a worker process needs one connection per store, plus DBOS's pool when it runs on DBOS;
size the server's ``max_connections`` for every process of the fleet. Connecting waits at
most ``connect_timeout_s``; a server that refuses, does not answer or has no connection slot
left ("too many clients") is a ``CheckpointError`` saying what to do (``postgres_database``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import agent_fsm.durable.postgres_leases as leases
import agent_fsm.durable.postgres_queue as queue
import agent_fsm.durable.postgres_rows as rows
from agent_fsm.durable.checkpoint import ClosingStore, behind, resumes_in
from agent_fsm.durable.encoding import (
    RunSummary,
    decode_entries,
    decode_header,
    read_summary,
    unknown_run,
)
from agent_fsm.durable.header import RunHeaders
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import Lease, check_id, check_ttl
from agent_fsm.durable.listing import listed, state_names, stop_names
from agent_fsm.durable.postgres_database import CONNECT_TIMEOUT_S, PostgresDatabase
from agent_fsm.durable.postgres_journal import PostgresJournal
from agent_fsm.durable.postgres_rows import LAYOUT_VERSION, Seen, one
from agent_fsm.durable.queue import check_priority, check_reason
from agent_fsm.errors import CheckpointError
from agent_fsm.state import RunState
from agent_fsm.table import StopReason

if TYPE_CHECKING:
    import psycopg

__all__ = ["CONNECT_TIMEOUT_S", "LAYOUT_VERSION", "PostgresStore"]

_DELETE = tuple(
    f"DELETE FROM {table} WHERE run_id = %s"
    for table in ("runs", "messages", "trace", "journal", "leases")
)
"""What ``delete`` runs: the run's rows in every table, its lease's included."""


class PostgresStore(ClosingStore):
    """Checkpoints in PostgreSQL: many worker processes on many machines share one database,
    and lease runs to one another (``LeaseStore``).

    Args:
        url: a libpq connection string or URL (``postgresql://user:pw@host:5432/db``).
        schema: the schema holding the tables; created on first use, with them.
        synchronous_saves: commit every checkpoint save with a flush to disk (see the
            module's "Durability"); journal writes and claims always are.
        clock: the source of ``created_at`` / ``updated_at`` (unix time).
        connect_timeout_s: how long making a connection may take, in whole seconds (at least
            2); None: the URL's own ``connect_timeout``, else ``CONNECT_TIMEOUT_S`` (10).
        create: lay the schema out when it is missing (the default); False refuses a
            missing schema, for a reader (``agent-fsm runs``) that must not create one.

    Raises:
        CheckpointError: the database cannot be reached (the error says why and what to
            do), the schema holds other tables, was laid out by a newer agent_fsm or
            (``create=False``) is missing.
        ConfigError: ``connect_timeout_s`` is not a positive number of seconds.

    One connection per store, under a lock: a worker's saves are serialised anyway (the
    engine saves from the event loop), so a pool would add a dependency and no throughput;
    run many processes, each with its store. A connection found broken (the server
    restarted) is replaced at the next call; the call that found it fails with
    CheckpointError. Usable as a context manager, which closes it.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "agent_fsm",
        synchronous_saves: bool = False,
        clock: Callable[[], float] = time.time,
        connect_timeout_s: float | None = None,
        create: bool = True,
    ) -> None:
        self._db = PostgresDatabase(
            url,
            schema=schema,
            synchronous_saves=synchronous_saves,
            connect_timeout_s=connect_timeout_s,
            create=create,
        )
        self.schema = schema
        self.name = self._db.name
        """Names the store in errors (without the password)."""
        self._clock = clock
        self._seen: dict[str, Seen] = {}
        self._headers = RunHeaders()
        """The encoders of the runs' headers, while they have not stopped: each save
        encodes only the fields that changed since the last one (``durable.header``)."""

    # -- checkpoints ---------------------------------------------------------------------

    def save(self, state: RunState, *, lease: Lease | None = None) -> Lease | None:
        run_id = check_id(state.run_id)
        known = self._seen.get(run_id)
        if known is not None and rows.continues(known, state):
            params = rows.run_values(state, self._headers.encode(state), self._clock())
            params.update(rows.append_params(state, known.messages, known.trace))
            params["known_revision"] = known.revision
            if lease is not None:
                params.update(ttl=lease.ttl_s, token=lease.token)
            quick = rows.QUICK_LEASED_SAVE if lease is not None else rows.QUICK_FREE_SAVE
            with self._db.connected(f"save run {run_id!r}") as conn:
                saved = conn.execute(quick, params).fetchone()
            if saved is not None:
                self._seen[run_id] = rows.seen(saved[0], state)
                if lease is None:
                    return None
                return dataclasses.replace(lease, expires_at=saved[2], cancel_requested=saved[1])
        with self._db.transaction(f"save run {run_id!r}", durable=False) as conn:
            self._seen[run_id], renewed = self._write(conn, state, lease)
        return renewed

    def save_unless_behind(self, state: RunState) -> bool:
        """One transaction: the run's row locked (``FOR UPDATE``: a save of the run by
        another store waits for it, or it for that one, and then reads what that one
        wrote), compared, and written (``_write``)."""
        run_id = check_id(state.run_id)
        with self._db.transaction(f"save run {run_id!r}", durable=False) as conn:
            row = conn.execute(
                "SELECT header::text, trace_count FROM runs WHERE run_id = %s FOR UPDATE",
                (run_id,),
            ).fetchone()
            if row is not None and behind(state, resumes_in(row[0]), row[1]):
                return False
            self._seen[run_id], _ = self._write(conn, state, None)
        return True

    def create(self, state: RunState, *, lease: Lease | None = None) -> bool:
        return self._create(state, lease, 0)

    def enqueue(self, state: RunState, *, priority: int = 0) -> bool:
        return self._create(state, None, check_priority(priority))

    def _create(self, state: RunState, lease: Lease | None, priority: int) -> bool:
        check_id(state.run_id)
        with self._db.transaction(f"create run {state.run_id!r}") as conn:
            created = self._insert(conn, state, lease, priority)
        if created is None:
            return False
        self._seen[state.run_id] = created[0]
        return True

    def _insert(
        self, conn: psycopg.Connection[Any], state: RunState, lease: Lease | None, priority: int
    ) -> tuple[Seen, Lease | None] | None:
        """Write a new run whole, with its queue ``priority``, unless its row exists (then
        write nothing: None); return what is stored and the renewed lease. The row lock of
        the insert makes a concurrent insert of the id wait, then find the row, so of two
        creates exactly one succeeds."""
        run_id = state.run_id
        fence = leases.fence(conn, run_id, lease)
        values = rows.run_values(state, self._headers.encode(state), self._clock(), priority)
        inserted = one(conn.execute(rows.INSERT_RUN, values))
        expires_at = leases.check_fence(conn, run_id, lease, fence)
        if inserted is None:
            return None
        rows.append(conn, state, 0, 0)
        if lease is None or expires_at is None:
            return rows.seen(inserted, state), None
        return rows.seen(inserted, state), dataclasses.replace(lease, expires_at=expires_at)

    def _write(
        self, conn: psycopg.Connection[Any], state: RunState, lease: Lease | None
    ) -> tuple[Seen, Lease | None]:
        """Write ``state`` as its run's checkpoint inside the caller's transaction, in two
        statements (``LOCK_*_RUN``, ``WRITE_RUN``) unless the stored history must be
        checked or cut; return what is then stored, and the renewed lease with the run's
        cancel request (which the save of a stop clears)."""
        run_id = state.run_id
        if lease is not None:
            params = {"run_id": run_id, "ttl": lease.ttl_s, "token": lease.token}
            row = conn.execute(rows.LOCK_LEASED_RUN, params).fetchone()
        else:
            row = conn.execute(rows.LOCK_FREE_RUN, {"run_id": run_id}).fetchone()
        if row is None:  # a first save without create
            created = self._insert(conn, state, lease, 0)
            # None: another writer created the run meanwhile; its row can be locked now.
            return created if created is not None else self._write(conn, state, lease)
        stored_messages, stored_trace, stored_revision, revision, request, *fence = row
        leases.check_locked_fence(conn, run_id, lease, fence)
        known = self._seen.get(run_id)
        if known is not None and known.revision != stored_revision:
            known = None  # another store wrote the run since: compare with what is stored
        messages_from, trace_from = rows.kept(conn, state, stored_messages, stored_trace, known)
        rows.clear(conn, run_id, messages_from, trace_from)
        values = rows.run_values(state, self._headers.encode(state), self._clock())
        values.update(rows.append_params(state, messages_from, trace_from), revision=revision)
        conn.execute(rows.WRITE_RUN, values)
        if lease is None:
            return rows.seen(revision, state), None
        if values["stopped"]:
            request = None
        renewed = dataclasses.replace(lease, expires_at=fence[0], cancel_requested=request)
        return rows.seen(revision, state), renewed

    def load(self, run_id: str) -> RunState:
        check_id(run_id)
        with self._db.transaction(f"load run {run_id!r}", write=False) as conn:
            head = conn.execute(
                "SELECT schema_version, header::text, message_count, trace_count, revision"
                " FROM runs WHERE run_id = %s",
                (run_id,),
            )
            texts = conn.execute(
                "SELECT message::text FROM messages WHERE run_id = %s ORDER BY idx", (run_id,)
            )
            steps = conn.execute(
                "SELECT row_index, turn FROM trace WHERE run_id = %s ORDER BY idx", (run_id,)
            )
        # read after the commit, all three answers at once: one round trip
        row, messages, trace = head.fetchone(), texts.fetchall(), steps.fetchall()
        if row is None:
            raise unknown_run(run_id)
        version, header, message_count, trace_count, revision = row
        if (len(messages), len(trace)) != (message_count, trace_count):
            raise CheckpointError(
                f"checkpoint of run {run_id!r} is incomplete: {len(messages)} of"
                f" {message_count} messages and {len(trace)} of {trace_count} trace entries"
                " stored"
            )
        state = decode_header(run_id, version, header)
        decoded, entries = decode_entries(run_id, [text for (text,) in messages], trace)
        state.messages = decoded
        state.trace = entries
        self._seen[run_id] = rows.seen(revision, state)
        return state

    def exists(self, run_id: str) -> bool:
        check_id(run_id)
        with self._db.connected(f"look up run {run_id!r}") as conn:
            found = conn.execute("SELECT 1 FROM runs WHERE run_id = %s", (run_id,))
            return found.fetchone() is not None

    def list_runs(
        self,
        limit: int | None = None,
        *,
        states: str | Iterable[str] | None = None,
        stop_reasons: StopReason | str | Iterable[StopReason | str | None] | None = None,
    ) -> list[RunSummary]:
        stops = stop_names(stop_reasons)
        params = {
            "states": state_names(states),
            "by_stop": stops is not None,
            "stops": stops or [],
            "limit": None if limit is None else max(limit, 0),
        }
        with self._db.connected("list runs") as conn:  # one statement: one snapshot
            found = conn.execute(rows.LIST_RUNS, params).fetchall()
        return [
            listed(
                read_summary(row[:-6]),
                version=row[-6],
                lease=None if row[-3] is None else (row[-3], row[-2]),
                now=row[-1],
                priority=row[-5],
                cancel_requested=row[-4],
            )
            for row in found
        ]

    def delete(self, run_id: str) -> None:
        check_id(run_id)
        with self._db.transaction(f"delete run {run_id!r}") as conn:
            for statement in _DELETE:
                conn.execute(statement, (run_id,))
        self._seen.pop(run_id, None)
        self._headers.forget(run_id)

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal:
        return PostgresJournal(self._db, check_id(run_id), lease)

    def close(self) -> None:
        """Close the connection; idempotent."""
        self._db.close()

    @property
    def closed(self) -> bool:
        """Whether the store was closed (its calls raise ``CheckpointError`` since)."""
        return self._db.closed

    # -- leases --------------------------------------------------------------------------

    def claim(self, run_id: str, owner: str, ttl_s: float) -> Lease:
        check_id(run_id)
        check_id(owner, "worker id")
        ttl_s = check_ttl(ttl_s)
        params = {"run_id": run_id, "owner": owner, "ttl": ttl_s}
        claim, holder = self._db.durable_statements(
            f"claim run {run_id!r}", (leases.CLAIM, params), (leases.HOLDER, params)
        )
        return leases.claimed(run_id, owner, ttl_s, claim, holder)

    def renew(self, lease: Lease) -> Lease:
        what = f"renew the lease of run {check_id(lease.run_id)!r}"
        params = {"run_id": lease.run_id, "ttl": lease.ttl_s, "token": lease.token}
        renewed = leases.renewed(lease, self._db.durable_statement(what, leases.RENEW, params))
        if renewed is not None:
            return renewed
        with self._db.connected(what) as conn:  # taken over: by whom (nothing is held now)
            raise leases.refusal(conn, lease.run_id, lease)

    def release(self, lease: Lease) -> None:
        what = f"release the lease of run {check_id(lease.run_id)!r}"
        params = {"run_id": lease.run_id, "token": lease.token}
        self._db.durable_statement(what, leases.RELEASE, params)

    def lease(self, run_id: str) -> Lease | None:
        check_id(run_id)
        with self._db.connected(f"look up the lease of run {run_id!r}") as conn:
            return leases.live(conn, run_id)

    # -- the queue -----------------------------------------------------------------------

    def claim_next(self, owner: str, ttl_s: float) -> Lease | None:
        check_id(owner, "worker id")
        ttl_s = check_ttl(ttl_s)
        params = {"owner": owner, "ttl": ttl_s}
        while True:  # again only when another worker claimed the run chosen: it goes on
            found = self._db.durable_statement("claim the next run", queue.NEXT_RUN, params)
            if not found:
                return None
            run_id, request, token, expires_at = found[0]
            if token is not None:
                return Lease(
                    run_id=run_id,
                    owner=owner,
                    token=token,
                    ttl_s=ttl_s,
                    expires_at=expires_at,
                    cancel_requested=request,
                )

    def cancel(self, run_id: str, reason: str) -> bool:
        check_id(run_id)
        reason = check_reason(reason)
        params = {"run_id": run_id, "reason": reason}
        found = self._db.durable_statement(f"cancel run {run_id!r}", queue.CANCEL, params)
        if not found:
            raise unknown_run(run_id)
        return bool(found[0][0])
