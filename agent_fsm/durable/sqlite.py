"""SQLiteStore: the embedded default checkpoint store, one file shared by several processes.

The file, its tables and its transactions are ``durable.sqlite_file``'s: WAL mode, every
write one ``BEGIN IMMEDIATE`` transaction, so a crash mid-save leaves the previous checkpoint
intact and concurrent writers wait for each other (up to ``timeout``) instead of failing.

A save inserts only the new messages and trace rows and rewrites the small ``runs`` row,
whose header encodes again only the fields that changed (``durable.header``); see
``checkpoint`` for the rules. The common save, of a run going on that this store wrote or
read last, reads nothing first: one UPDATE guarded by what it assumes (``_quick_write``); any
other save (a stop, the save after one) first reads the run's stored counts (one indexed
lookup). A save of a leased run checks and renews the lease in its own transaction
(``durable.leases``), and reads the run's pending cancel request with its counts
(``durable.queue``). ``claim_next`` is one write transaction: the
first runnable run by the ``runs_to_take`` index, claimed.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

import agent_fsm.durable.sqlite_leases as sqlite_leases
import agent_fsm.durable.sqlite_rows as rows
from agent_fsm.durable.checkpoint import ClosingStore, behind, resumes_in
from agent_fsm.durable.encoding import (
    STORED_SUMMARY,
    RunSummary,
    decode_entries,
    decode_header,
    encode_message,
    read_summary,
    unknown_run,
)
from agent_fsm.durable.header import RunHeaders
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import Lease, check_id, check_ttl
from agent_fsm.durable.listing import listed, state_names, stop_names
from agent_fsm.durable.queue import check_priority, check_reason
from agent_fsm.durable.sqlite_file import LAYOUT_VERSION, SQLiteFile
from agent_fsm.durable.sqlite_journal import SQLiteJournal
from agent_fsm.errors import CheckpointError
from agent_fsm.messages import Message
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, StopReason

__all__ = ["LAYOUT_VERSION", "SQLiteStore"]

_LIST_RUNS = (
    "SELECT "
    + ", ".join(f"r.{name}" for name in STORED_SUMMARY).replace("messages", "message_count")
    + ", r.schema_version, r.priority, r.cancel, l.owner, l.expires_at FROM runs r"
    " LEFT JOIN leases l ON l.run_id = r.run_id{where} ORDER BY r.revision DESC LIMIT ?"
)
"""What ``list_runs`` reads: each run's summary columns, schema version, queue priority,
cancel request and last lease."""

_NEXT_RUN = (
    "SELECT r.run_id FROM runs r"
    " WHERE r.stop_reason IS NULL AND NOT EXISTS (SELECT 1 FROM leases l"
    " WHERE l.run_id = r.run_id AND l.expires_at > ?)"
    " ORDER BY r.priority DESC, r.created_at, r.run_id LIMIT 1"
)
"""The next runnable run (``durable.queue``): not stopped (its ``stop_reason`` NULL), no live
lease, by priority, age and id, along the partial index of the runs that have not stopped
(``sqlite_file._TAKE_BY_STOP``)."""


class SQLiteStore(ClosingStore):
    """Checkpoints in one SQLite file: the embedded default, safe for several processes,
    which it can lease runs to (``LeaseStore``; lease times are ``clock``'s).

    Args:
        path: the database file, created when missing (with its tables).
        timeout: seconds a write waits for another process's write to finish.
        clock: the time (unix seconds) of ``created_at`` / ``updated_at`` and of leases.

    Raises:
        CheckpointError: the file cannot be opened or written, is not an agent_fsm store,
            or was laid out by a newer agent_fsm.

    Usable as a context manager, which closes it. Safe to share between threads (sync tools
    run in worker threads); calls are serialised.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = "agent_fsm.sqlite3",
        *,
        timeout: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._file = SQLiteFile(path, timeout=timeout)
        self.path = self._file.path
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        """run_id → what this store last wrote or read of the run: while the stored
        revision is that one and the live state still holds that very last message, the
        stored messages are known to match without reading one back."""
        self._top = 0
        """The highest revision this store took or read: ``_quick_write`` takes the next."""
        self._headers = RunHeaders()
        """The encoders of the runs' headers, while they have not stopped: each save
        encodes only the fields that changed since the last one (``durable.header``)."""

    def save(self, state: RunState, *, lease: Lease | None = None) -> Lease | None:
        check_id(state.run_id)
        with self._file.transaction(
            f"save run {state.run_id!r}", write=True, settling=state.run_id
        ) as conn:
            revision, renewed = self._write(conn, state, lease)
        self._saved(revision, state)
        return renewed

    def save_unless_behind(self, state: RunState) -> bool:
        """One write transaction (``BEGIN IMMEDIATE``): no other process writes between
        the comparison and the save."""
        run_id = check_id(state.run_id)
        with self._file.transaction(f"save run {run_id!r}", write=True, settling=run_id) as conn:
            row = conn.execute(
                "SELECT header, trace_count FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is not None and behind(state, resumes_in(row[0]), row[1]):
                return False
            revision, _ = self._write(conn, state, None)
        self._saved(revision, state)
        return True

    def create(self, state: RunState, *, lease: Lease | None = None) -> bool:
        return self._create(state, lease, 0)

    def enqueue(self, state: RunState, *, priority: int = 0) -> bool:
        return self._create(state, None, check_priority(priority))

    def _create(self, state: RunState, lease: Lease | None, priority: int) -> bool:
        run_id = check_id(state.run_id)
        with self._file.transaction(f"create run {run_id!r}", write=True, settling=run_id) as conn:
            # BEGIN IMMEDIATE holds the write lock from here: no other process can create
            # the run between this look-up and the write.
            if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                return False
            revision, _ = self._write(conn, state, lease, priority)
        self._saved(revision, state)
        return True

    def _saved(self, revision: int, state: RunState) -> None:
        """Remember what is stored at ``revision``, so the next save of the run need not
        read it back."""
        messages, trace = state.messages, state.trace
        self._top = max(self._top, revision)
        self._file.knows(state.run_id, revision)
        self._seen[state.run_id] = _Seen(
            revision,
            len(messages),
            messages[-1] if messages else None,
            len(trace),
            trace[-1] if trace else None,
            state.state in TERMINAL_STATES,
        )

    def _write(
        self, conn: sqlite3.Connection, state: RunState, lease: Lease | None, priority: int = 0
    ) -> tuple[int, Lease | None]:
        """Write ``state`` as its run's checkpoint, inside the caller's transaction (fenced
        by ``lease``, which it renews; ``priority``: a new run's); return the run's new
        revision and the renewed lease, with the run's pending cancel request, which the
        save of a stop clears."""
        run_id = state.run_id
        now = self._clock()
        if lease is not None:
            sqlite_leases.renew(conn, lease, now)
        stopped = state.state in TERMINAL_STATES
        version, header = self._headers.encode(state)
        if lease is None and not stopped:
            quick = self._quick_write(conn, state, now, (version, header))
            if quick is not None:
                return quick, None
        stored_messages, stored_trace, created_at, stored_revision, request, revision, leased = (
            conn.execute(rows.READ_RUN, (run_id, now)).fetchone()
        )
        if lease is None and leased:
            sqlite_leases.fence(conn, run_id, None, now)  # raises, naming the holder
        if stored_revision is None:  # a new run
            stored_messages, stored_trace, created_at = 0, 0, now
        kept = self._kept(conn, state, (stored_messages, stored_trace), stored_revision)
        rows.append(conn, state, *kept)
        columns = rows.columns(state, version, header, now, revision)
        request, stop_reason = rows.stop(state, request, stopped)
        if stored_revision is None:
            values = (*columns, request, stop_reason, run_id, created_at, priority)
            conn.execute(rows.INSERT_RUN, values)
        else:
            conn.execute(rows.UPDATE_RUN, (*columns, request, stop_reason, run_id))
        if lease is None:
            return int(revision), None
        renewed = dataclasses.replace(lease, expires_at=now + lease.ttl_s, cancel_requested=request)
        return int(revision), renewed

    def _quick_write(
        self,
        conn: sqlite3.Connection,
        state: RunState,
        now: float,
        header: tuple[int, bytes],
    ) -> int | None:
        """The common save of a run going on without a lease, read nothing first: one
        statement (``sqlite_rows.QUICK_UPDATE``) rewrites the run's row only if it is still at
        the revision and counts this store last wrote or read, going on then too (so its
        ``stop_reason`` is NULL and stays so, and the stored entries are the ones
        it knows, which the live state continues: no revision is taken twice in the file, not
        even by a run deleted and made again, ``sqlite_rows``), no lease on the run is live,
        and no other store took a revision since this one's latest (the new one, the next, is
        then the highest the file ever held); then only the new entries are inserted. Returns
        the new revision, or None when the statement matched nothing (it wrote nothing) or
        the run stopped at its last save: the save then takes the long way, which reads what
        is stored and says why (a stop, and the save after one, take it too: once a run)."""
        seen = self._seen.get(state.run_id)
        messages, trace = state.messages, state.trace
        if not (
            seen is not None
            and not seen.stopped
            and 0 < seen.messages <= len(messages)
            and 0 < seen.steps <= len(trace)
            and messages[seen.messages - 1] is seen.last
            and trace[seen.steps - 1] is seen.last_step
        ):
            return None
        revision = self._top + 1
        columns = rows.columns(state, *header, now, revision)
        known = (state.run_id, seen.revision, seen.messages, seen.steps)
        updated = conn.execute(rows.QUICK_UPDATE, (*columns, *known))
        if updated.rowcount != 1:
            return None
        rows.append(conn, state, seen.messages, seen.steps)
        return revision

    def _kept(
        self,
        conn: sqlite3.Connection,
        state: RunState,
        stored: tuple[int, int],
        revision: int | None,
    ) -> tuple[int, int]:
        """How many of the stored messages and trace entries stay; the others are deleted.

        Entries beyond the live state's go (a run restored from an older checkpoint and
        continued). The rest stay only if the live state continues both lists, its entries
        at the last stored indices being the stored ones; otherwise it is another history
        (``checkpoint``'s rules), written whole: transcript and trace are one history.
        """
        run_id, messages, trace = state.run_id, state.messages, state.trace
        seen = self._seen.get(run_id)
        if (  # the common case, checked at once: the live run continues what this store wrote
            seen is not None
            and seen.revision == revision
            and 0 < seen.messages == stored[0] <= len(messages)
            and 0 < seen.steps == stored[1] <= len(trace)
            and messages[seen.messages - 1] is seen.last
            and trace[seen.steps - 1] is seen.last_step
        ):
            return stored
        kept_messages, kept_trace = min(stored[0], len(messages)), min(stored[1], len(trace))
        if not (
            self._same_message(conn, run_id, kept_messages, messages, revision)
            and self._same_step(conn, run_id, kept_trace, trace, revision)
        ):
            kept_messages = kept_trace = 0
        for table, kept, count in (
            ("messages", kept_messages, stored[0]),
            ("trace", kept_trace, stored[1]),
        ):
            if kept == 0:  # all of it (rows a deleted run left, if any)
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            elif kept < count:
                conn.execute(f"DELETE FROM {table} WHERE run_id = ? AND idx >= ?", (run_id, kept))
        return kept_messages, kept_trace

    def _same_message(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        kept: int,
        live: list[Message],
        revision: int | None,
    ) -> bool:
        """Whether the live message at index ``kept - 1`` is the stored one."""
        if kept == 0 or self._known(run_id, revision, (kept, live[kept - 1]), messages=True):
            return True
        found = conn.execute(
            "SELECT json FROM messages WHERE run_id = ? AND idx = ?", (run_id, kept - 1)
        ).fetchone()
        return found is not None and found[0] == encode_message(live[kept - 1])

    def _same_step(
        self,
        conn: sqlite3.Connection,
        run_id: str,
        kept: int,
        live: list[tuple[int, int]],
        revision: int | None,
    ) -> bool:
        """Whether the live trace entry at index ``kept - 1`` is the stored one."""
        if kept == 0 or self._known(run_id, revision, (kept, live[kept - 1]), messages=False):
            return True
        found = conn.execute(
            "SELECT row, turn FROM trace WHERE run_id = ? AND idx = ?", (run_id, kept - 1)
        ).fetchone()
        return found is not None and tuple(found) == tuple(live[kept - 1])

    def _known(
        self, run_id: str, revision: int | None, last: tuple[int, object], *, messages: bool
    ) -> bool:
        """Whether this store saw the stored ``revision`` hold ``last[0]`` messages (or
        trace entries) ending with that very object ``last[1]``: then they match without
        reading one back (a live state's entries are not changed in place)."""
        seen = self._seen.get(run_id)
        if seen is None or seen.revision != revision:
            return False
        count, entry = (seen.messages, seen.last) if messages else (seen.steps, seen.last_step)
        return count == last[0] and entry is last[1]

    def load(self, run_id: str) -> RunState:
        check_id(run_id)
        with self._file.transaction(f"load run {run_id!r}", write=False) as conn:
            row = conn.execute(
                "SELECT schema_version, header, message_count, trace_count, revision FROM runs"
                " WHERE run_id = ?",
                (run_id,),
            ).fetchone()
            if row is None:
                raise unknown_run(run_id)
            texts = conn.execute(
                "SELECT json FROM messages WHERE run_id = ? ORDER BY idx", (run_id,)
            ).fetchall()
            trace = conn.execute(
                "SELECT row, turn FROM trace WHERE run_id = ? ORDER BY idx", (run_id,)
            ).fetchall()
        version, header, message_count, trace_count, revision = row
        if (len(texts), len(trace)) != (message_count, trace_count):
            raise CheckpointError(
                f"checkpoint of run {run_id!r} is incomplete: {len(texts)} of {message_count}"
                f" messages and {len(trace)} of {trace_count} trace entries stored"
            )
        state = decode_header(run_id, version, header)
        messages, entries = decode_entries(run_id, [text for (text,) in texts], trace)
        state.messages = messages
        state.trace = entries
        self._saved(revision, state)
        return state

    def exists(self, run_id: str) -> bool:
        check_id(run_id)
        with self._file.transaction(f"look up run {run_id!r}", write=False) as conn:
            found = conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return found is not None

    def list_runs(
        self,
        limit: int | None = None,
        *,
        states: str | Iterable[str] | None = None,
        stop_reasons: StopReason | str | Iterable[StopReason | str | None] | None = None,
    ) -> list[RunSummary]:
        where, params = _filters(state_names(states), stop_names(stop_reasons))
        with self._file.transaction("list runs", write=False) as conn:
            rows = conn.execute(
                _LIST_RUNS.format(where=where),
                (*params, -1 if limit is None else max(limit, 0)),
            ).fetchall()
        now = self._clock()
        return [
            listed(
                read_summary(row[:-5]),
                version=row[-5],
                lease=None if row[-2] is None else (row[-2], row[-1]),
                now=now,
                priority=row[-4],
                cancel_requested=row[-3],
            )
            for row in rows
        ]

    def delete(self, run_id: str) -> None:
        check_id(run_id)
        with self._file.transaction(f"delete run {run_id!r}", write=True) as conn:
            conn.execute(rows.FORGET_REVISION, (run_id,))  # never taken again
            for table in ("runs", "messages", "trace", "journal", "leases"):
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            self._file.forget(run_id)
        self._seen.pop(run_id, None)
        self._headers.forget(run_id)

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal:
        return SQLiteJournal(self._file, check_id(run_id), lease, self._clock)

    def claim(self, run_id: str, owner: str, ttl_s: float) -> Lease:
        check_id(run_id)
        check_id(owner, "worker id")
        ttl_s = check_ttl(ttl_s)
        with self._file.transaction(f"claim run {run_id!r}", write=True) as conn:
            return sqlite_leases.claim(conn, run_id, owner, ttl_s, self._clock())

    def renew(self, lease: Lease) -> Lease:
        check_id(lease.run_id)
        with self._file.transaction(f"renew the lease of run {lease.run_id!r}", write=True) as conn:
            expires_at = sqlite_leases.renew(conn, lease, self._clock())
            request = sqlite_leases.requested(conn, lease.run_id)
        return dataclasses.replace(lease, expires_at=expires_at, cancel_requested=request)

    def claim_next(self, owner: str, ttl_s: float) -> Lease | None:
        check_id(owner, "worker id")
        ttl_s = check_ttl(ttl_s)
        with self._file.transaction("claim the next run", write=True) as conn:
            now = self._clock()
            found = conn.execute(_NEXT_RUN, (now,)).fetchone()
            if found is None:
                return None
            return sqlite_leases.claim(conn, found[0], owner, ttl_s, now)

    def cancel(self, run_id: str, reason: str) -> bool:
        check_id(run_id)
        reason = check_reason(reason)
        with self._file.transaction(f"cancel run {run_id!r}", write=True) as conn:
            row = conn.execute("SELECT state FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise unknown_run(run_id)
            if row[0] in TERMINAL_STATES:
                return False
            conn.execute(
                "UPDATE runs SET cancel = COALESCE(cancel, ?) WHERE run_id = ?", (reason, run_id)
            )
        return True

    def release(self, lease: Lease) -> None:
        check_id(lease.run_id)
        with self._file.transaction(
            f"release the lease of run {lease.run_id!r}", write=True
        ) as conn:
            sqlite_leases.release(conn, lease)

    def lease(self, run_id: str) -> Lease | None:
        check_id(run_id)
        with self._file.transaction(f"look up the lease of run {run_id!r}", write=False) as conn:
            return sqlite_leases.live(conn, run_id, self._clock())

    def close(self) -> None:
        """Close the file; idempotent."""
        self._file.close()


def _filters(names: list[str] | None, stops: list[str] | None) -> tuple[str, list[str]]:
    """The WHERE clause of ``_LIST_RUNS`` and its parameters, for the states ``names`` and
    the ``stops`` (``listing.stop_names``) chosen, if any."""
    clauses, params = [], []
    if names is not None:
        clauses.append(f"r.state IN ({', '.join('?' * len(names))})")
        params += names
    if stops is not None:  # along the partial index runs_by_stop
        clauses.append(f"r.stop_reason IN ({', '.join('?' * len(stops))})" if stops else "0")
        params += stops
    return (f" WHERE {' AND '.join(clauses)}" if clauses else ""), params


class _Seen(NamedTuple):
    """What a SQLiteStore last wrote or read of a run: at ``revision``, the stored messages
    were ``messages`` many, the last of them ``last``, and the stored trace entries ``steps``
    many, the last of them ``last_step`` (the live state's very tuple); the run had
    ``stopped`` (its ``stop_reason`` column not NULL)."""

    revision: int
    messages: int
    last: Message | None
    steps: int
    last_step: tuple[int, int] | None
    stopped: bool
