"""One run's tool journal in a SQLiteStore's ``journal`` table (``durable.journal``'s
contract): every call is its own transaction on the store's file (``SQLiteFile``), and
``lookup_or_start`` reads a call's entry and records it started in one
(``journal.StartingJournal``). Keys are
stored as ``journal.stored_key`` gives them, calls and results as ``encoding.encode_model``
(a lone surrogate becomes U+FFFD, never an encoding error)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

import agent_fsm.durable.sqlite_leases as sqlite_leases
from agent_fsm.durable.encoding import encode_model
from agent_fsm.durable.journal import CallStatus, JournalEntry, NotStarted, stored_key
from agent_fsm.durable.leases import Lease, leased_error
from agent_fsm.durable.sqlite_file import SQLiteFile, Transaction
from agent_fsm.errors import CheckpointError
from agent_fsm.messages import ToolCall, ToolMessage

__all__ = ["SQLiteJournal"]

_LOOKUP = "SELECT call, status, result FROM journal WHERE run_id = ? AND key = ?"

_START = (
    "INSERT INTO journal VALUES (?, ?, ?, 'started', NULL) ON CONFLICT (run_id, key)"
    " DO UPDATE SET call = excluded.call, status = excluded.status, result = NULL"
)
"""A call recorded as started (``CallStatus.STARTED``), replacing any entry of its key."""

_START_UNLEASED = (
    "INSERT INTO journal SELECT ?1, ?2, ?3, 'started', NULL WHERE NOT EXISTS"
    " (SELECT 1 FROM leases WHERE run_id = ?1 AND expires_at > ?4) ON CONFLICT (run_id, key)"
    " DO UPDATE SET call = excluded.call, status = excluded.status, result = NULL"
)
"""``_START`` unless a lease on the run is live (``sqlite_leases.fence`` without a lease)."""

_FIRST_START = (
    "INSERT INTO journal SELECT ?1, ?2, ?3, 'started', NULL WHERE NOT EXISTS"
    " (SELECT 1 FROM leases WHERE run_id = ?1 AND expires_at > ?4 AND token != ?5)"
    " ON CONFLICT (run_id, key) DO NOTHING"
)
"""A call's first start (``lookup_or_start``): recorded unless its key has an entry, which
it leaves as it is, or a lease on the run other than the journal's own is live (?5: its
token, or 0 without one, which no lease has, tokens starting at 1: ``sqlite_leases.claim``;
not NULL, which the sqlite3 module binds the slow way, ``sqlite_rows``). One statement for
the usual call, which has no entry; what refused it otherwise is read after."""


class SQLiteJournal:
    """The journal of ``run_id`` in ``file``, whose ``record_started`` is fenced by
    ``lease`` at the time ``clock`` reads (the store's: ``durable.leases``)."""

    __slots__ = ("_clock", "_file", "_lease", "_open", "_run_id")

    def __init__(
        self, file: SQLiteFile, run_id: str, lease: Lease | None, clock: Callable[[], float]
    ) -> None:
        self._file = file
        self._run_id = run_id
        self._lease = lease
        self._clock = clock
        self._open: set[str] = set()
        """The calls (keys as stored) this journal recorded started and not yet finished."""

    def lookup(self, key: str) -> JournalEntry | None:
        stored = stored_key(key)
        with self._file.transaction(f"read journal entry {key!r}", write=False) as conn:
            row = conn.execute(_LOOKUP, (self._run_id, stored)).fetchone()
            held = self._file.held(self._run_id, stored)
        if row is not None and held is not None:  # finished, its record held back
            row = (row[0], CallStatus.FINISHED.value, held)
        return None if row is None else self._entry(key, row)

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        # One write transaction (BEGIN IMMEDIATE): no other writer between the record and
        # the read of what refused it. Fenced by the run's lease only when it writes, as
        # record_started is: an entry found is answered whoever holds the run.
        stored, row, absent = stored_key(key), None, False
        try:
            with self._transaction(key) as conn:
                run_id, now, lease = self._run_id, self._clock(), self._lease
                token = 0 if lease is None else lease.token  # not None: see _FIRST_START
                values = (run_id, stored, encode_model(call), now, token)
                absent = conn.execute(_FIRST_START, values).rowcount == 1
                if not absent:  # the key's entry, or another's live lease, refused it
                    row = conn.execute(_LOOKUP, (run_id, stored)).fetchone()
                    absent = row is None
                    if absent:
                        self._refuse(conn, now)
                elif lease is not None:
                    sqlite_leases.renew(conn, lease, now)  # raises when taken over meanwhile
                if absent:
                    self._open.add(stored)
        except Exception as exc:
            if row is not None:  # read; nothing was to be written
                return self._entry(key, row)
            if absent:
                raise NotStarted(f"{type(exc).__name__}: {exc}") from exc
            raise
        return None if row is None else self._entry(key, row)

    def _entry(self, key: str, row: tuple[str, str, str | None]) -> JournalEntry:
        call, status, result = row
        try:
            return JournalEntry(
                key,
                ToolCall.model_validate_json(call),
                CallStatus(status),
                None if result is None else ToolMessage.model_validate_json(result),
            )
        except (ValueError, TypeError) as exc:  # a damaged row: not a text, not JSON
            raise CheckpointError(
                f"journal entry {key!r} of run {self._run_id!r} is unreadable: {exc}"
            ) from exc

    def record_started(self, key: str, call: ToolCall) -> None:
        # Committed before returning: it guards a side effect about to happen. Fenced by the
        # run's lease: a driver whose lease was taken over must not start the call.
        stored = stored_key(key)
        with self._transaction(key) as conn:
            self._start(conn, stored, call)

    def _transaction(self, key: str) -> Transaction:
        """A write of the run, which first writes what the file holds back for it."""
        return self._file.transaction(
            f"record journal entry {key!r}", write=True, settling=self._run_id
        )

    def _start(self, conn: sqlite3.Connection, stored: str, call: ToolCall) -> None:
        """Record ``call`` started under ``stored``, fenced by the run's lease: without one,
        by the same statement, which writes only while no lease is live (one statement)."""
        run_id, now, recorded = self._run_id, self._clock(), encode_model(call)
        if self._lease is not None:
            sqlite_leases.renew(conn, self._lease, now)  # raises when taken over
            conn.execute(_START, (run_id, stored, recorded))
        elif not conn.execute(_START_UNLEASED, (run_id, stored, recorded, now)).rowcount:
            self._refuse(conn, now)
        self._open.add(stored)

    def _refuse(self, conn: sqlite3.Connection, now: float) -> None:
        """Raise ``RunLeased`` naming the live lease a record found on the run."""
        holder = sqlite_leases.live(conn, self._run_id, now)
        assert holder is not None  # found live by the statement, in this transaction
        raise leased_error(self._run_id, holder.owner, holder.expires_at, now)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        """Written at once, or held back (``SQLiteFile.hold``) when the call is the last of
        the run in flight that this journal started: then the run's next write, a checkpoint
        save or the next call's start, which follows without waiting on anything from
        outside, writes it in its own transaction (one write transaction fewer per call).
        A crash before that loses it: the call then reads as started, its outcome unknown,
        as after a crash just before its record. ``settle`` writes what is held back."""
        stored = stored_key(key)
        if stored in self._open:
            self._open.discard(stored)
            if not self._open:
                self._file.hold(self._run_id, stored, encode_model(result))
                return
        with self._transaction(key) as conn:
            updated = conn.execute(
                "UPDATE journal SET status = ?, result = ? WHERE run_id = ? AND key = ?",
                (CallStatus.FINISHED.value, encode_model(result), self._run_id, stored),
            ).rowcount
            if not updated:
                raise KeyError(f"journal entry {key!r} finished without having started")

    def settle(self) -> None:
        """Write the finished records held back for the run (``record_finished``) now: its
        driver lets go of it (``durable.journal.settle``)."""
        if self._file.holds(self._run_id):
            with self._file.transaction(
                "record journal entries", write=True, settling=self._run_id
            ):
                pass
