"""One run's tool journal in a SQLiteStore's ``journal`` table (``durable.journal``'s
contract): every call is its own transaction on the store's file (``SQLiteFile``), and
``lookup_or_start`` reads a call's entry and records it started in one
(``journal.StartingJournal``). Keys are
stored as ``journal.stored_key`` gives them, calls and results as ``encoding.encode_model``
(a lone surrogate becomes U+FFFD, never an encoding error)."""

from __future__ import annotations

from collections.abc import Callable

import agent_fsm.durable.sqlite_leases as sqlite_leases
from agent_fsm.durable.encoding import encode_model
from agent_fsm.durable.journal import CallStatus, JournalEntry, NotStarted, stored_key
from agent_fsm.durable.leases import Lease
from agent_fsm.durable.sqlite_file import SQLiteFile
from agent_fsm.errors import CheckpointError
from agent_fsm.messages import ToolCall, ToolMessage

__all__ = ["SQLiteJournal"]

_LOOKUP = "SELECT call, status, result FROM journal WHERE run_id = ? AND key = ?"

_START = (
    "INSERT INTO journal VALUES (?, ?, ?, 'started', NULL) ON CONFLICT (run_id, key)"
    " DO UPDATE SET call = excluded.call, status = excluded.status, result = NULL"
)
"""A call recorded as started (``CallStatus.STARTED``), replacing any entry of its key."""


class SQLiteJournal:
    """The journal of ``run_id`` in ``file``, whose ``record_started`` is fenced by
    ``lease`` at the time ``clock`` reads (the store's: ``durable.leases``)."""

    __slots__ = ("_clock", "_file", "_lease", "_run_id")

    def __init__(
        self, file: SQLiteFile, run_id: str, lease: Lease | None, clock: Callable[[], float]
    ) -> None:
        self._file = file
        self._run_id = run_id
        self._lease = lease
        self._clock = clock

    def lookup(self, key: str) -> JournalEntry | None:
        with self._file.transaction(f"read journal entry {key!r}", write=False) as conn:
            row = conn.execute(_LOOKUP, (self._run_id, stored_key(key))).fetchone()
        return None if row is None else self._entry(key, row)

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        # One write transaction (BEGIN IMMEDIATE): no other writer between the read and the
        # record. Fenced by the run's lease only when it writes, as record_started is.
        stored, row, absent = stored_key(key), None, False
        try:
            with self._file.transaction(f"record journal entry {key!r}", write=True) as conn:
                row = conn.execute(_LOOKUP, (self._run_id, stored)).fetchone()
                if row is None:
                    absent = True
                    sqlite_leases.fence(conn, self._run_id, self._lease, self._clock())
                    conn.execute(_START, (self._run_id, stored, encode_model(call)))
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
        with self._file.transaction(f"record journal entry {key!r}", write=True) as conn:
            sqlite_leases.fence(conn, self._run_id, self._lease, self._clock())
            conn.execute(_START, (self._run_id, stored_key(key), encode_model(call)))

    def record_finished(self, key: str, result: ToolMessage) -> None:
        with self._file.transaction(f"record journal entry {key!r}", write=True) as conn:
            updated = conn.execute(
                "UPDATE journal SET status = ?, result = ? WHERE run_id = ? AND key = ?",
                (CallStatus.FINISHED.value, encode_model(result), self._run_id, stored_key(key)),
            ).rowcount
            if not updated:
                raise KeyError(f"journal entry {key!r} finished without having started")
