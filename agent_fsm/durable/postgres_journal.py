"""One run's tool journal in a PostgresStore's ``journal`` table (``durable.journal``'s
contract): every call is its own transaction, on the store's connection
(``PostgresDatabase``). Keys are stored as ``journal.stored_key`` gives them, calls and
results as ``encoding.encode_model`` (a lone surrogate becomes U+FFFD, never an encoding
error). An outcome (``journal.OutcomeJournal``) is a row of its own, ``status`` ``outcome``, its
JSON in ``result`` (``call`` is JSON ``null``): no tool call's look-up ever meets one, since
outcomes have keys of their own."""

from __future__ import annotations

from typing import Any

import agent_fsm.durable.postgres_leases as leases
from agent_fsm.durable.encoding import encode_model
from agent_fsm.durable.journal import CallStatus, JournalEntry, NotStarted, stored_key
from agent_fsm.durable.leases import Lease
from agent_fsm.durable.postgres_database import PostgresDatabase
from agent_fsm.durable.postgres_rows import NOW
from agent_fsm.errors import CheckpointError
from agent_fsm.messages import ToolCall, ToolMessage

__all__ = ["PostgresJournal"]

_STARTED, _FINISHED = CallStatus.STARTED.value, CallStatus.FINISHED.value
_START = (
    f"INSERT INTO journal SELECT %(run_id)s, %(key)s, %(call)s::json, '{_STARTED}', NULL"
    " WHERE true ON CONFLICT (run_id, key) DO UPDATE SET call = excluded.call,"
    f" status = '{_STARTED}', result = NULL RETURNING 1"
)
"""Record a call as started (``fenced_insert`` adds the lease's fence to its WHERE)."""

_FIRST_START = (
    "WITH started AS ("
    + leases.fenced_insert(
        f"INSERT INTO journal SELECT %(run_id)s, %(key)s, %(call)s::json, '{_STARTED}', NULL"
        " WHERE true ON CONFLICT (run_id, key) DO NOTHING RETURNING 1",
        None,
    )
    + ") SELECT EXISTS (SELECT FROM started), seen.call::text, seen.status, seen.result::text"
    " FROM (SELECT) AS one LEFT JOIN journal AS seen"
    " ON seen.run_id = %(run_id)s AND seen.key = %(key)s"
)
"""A call's first start (``lookup_or_start``) on a journal without a lease: recorded unless
an entry exists or another's lease is live, and the entry read (as it was before)."""

_FIRST_START_LEASED = (
    "WITH fence AS (UPDATE leases SET expires_at = " + NOW + " + %(ttl)s"
    " WHERE run_id = %(run_id)s AND token = %(token)s RETURNING 1), started AS ("
    f"INSERT INTO journal SELECT %(run_id)s, %(key)s, %(call)s::json, '{_STARTED}', NULL"
    " WHERE EXISTS (SELECT FROM fence) ON CONFLICT (run_id, key) DO NOTHING RETURNING 1)"
    " SELECT EXISTS (SELECT FROM started), seen.call::text, seen.status, seen.result::text"
    " FROM (SELECT) AS one LEFT JOIN journal AS seen"
    " ON seen.run_id = %(run_id)s AND seen.key = %(key)s"
)
"""The same under a lease, whose renewal is the fence (``leases.fenced_insert``'s)."""

_START_UNLESS_KNOWN = (
    "WITH seen AS (SELECT key, call::text AS call, status, result::text AS result FROM journal"
    " WHERE run_id = %(run_id)s AND key = ANY(%(keys)s)), started AS ("
    + leases.fenced_insert(
        f"INSERT INTO journal SELECT %(run_id)s, %(key)s, %(call)s::json, '{_STARTED}', NULL"
        " WHERE NOT EXISTS (SELECT FROM seen) ON CONFLICT (run_id, key) DO NOTHING RETURNING 1",
        None,
    )
    + ") SELECT EXISTS (SELECT FROM started), seen.key, seen.call, seen.status, seen.result"
    " FROM (SELECT) AS one LEFT JOIN seen ON true"
)
"""Read two entries of the run and, when neither exists and no live lease is on the run,
record a call as started under the first (``start_unless_known``)."""

_FINISH_AND_LOOK_UP = (
    f"WITH done AS (UPDATE journal SET status = '{_FINISHED}', result = %(result)s"
    " WHERE run_id = %(run_id)s AND key = %(key)s RETURNING 1)"
    " SELECT EXISTS (SELECT FROM done), other.call::text, other.status, other.result::text"
    " FROM (SELECT) AS one LEFT JOIN journal AS other"
    " ON other.run_id = %(run_id)s AND other.key = %(other)s"
)
"""Record a call as finished, and read another entry of the run (as it was before)."""

_FINISH_FIRST = (
    f"WITH done AS (UPDATE journal SET status = '{_FINISHED}', result = %(result)s"
    f" WHERE run_id = %(run_id)s AND key = %(key)s AND status = '{_STARTED}' RETURNING 1)"
    " SELECT EXISTS (SELECT FROM done), seen.call::text, seen.status, seen.result::text"
    " FROM (SELECT) AS one LEFT JOIN journal AS seen"
    " ON seen.run_id = %(run_id)s AND seen.key = %(key)s"
)
"""Record a started call as finished, unless it is finished already; read the entry (as it
was before the statement)."""

_FINISH_FIRST_AND_LOOK_UP = (
    f"WITH done AS (UPDATE journal SET status = '{_FINISHED}', result = %(result)s"
    f" WHERE run_id = %(run_id)s AND key = %(key)s AND status = '{_STARTED}' RETURNING 1)"
    " SELECT other.call::text, other.status, other.result::text,"
    " EXISTS (SELECT FROM done), seen.call::text, seen.status, seen.result::text"
    " FROM (SELECT) AS one LEFT JOIN journal AS seen"
    " ON seen.run_id = %(run_id)s AND seen.key = %(key)s"
    " LEFT JOIN journal AS other ON other.run_id = %(run_id)s AND other.key = %(other)s"
)
"""``_FINISH_FIRST``, and another entry of the run read (as it was before the statement)."""

_OUTCOME = "outcome"
"""The ``status`` of a row that keeps an outcome (``keep_outcome``), not a tool call."""

_KEEP_OUTCOME = (
    "WITH kept AS (INSERT INTO journal SELECT %(run_id)s, %(key)s, 'null'::json,"
    f" '{_OUTCOME}', %(outcome)s::json ON CONFLICT (run_id, key) DO NOTHING RETURNING 1)"
    " SELECT EXISTS (SELECT FROM kept), seen.result::text"
    " FROM (SELECT) AS one LEFT JOIN journal AS seen"
    " ON seen.run_id = %(run_id)s AND seen.key = %(key)s"
)
"""Keep an outcome unless one is kept under its key; read the one kept before (as it was
before the statement)."""


class PostgresJournal:
    """The journal of ``run_id`` in ``database``, whose ``record_started`` is fenced by
    ``lease`` (``durable.leases``)."""

    __slots__ = ("_db", "_lease", "_run_id")

    def __init__(self, database: PostgresDatabase, run_id: str, lease: Lease | None) -> None:
        self._db = database
        self._run_id = run_id
        self._lease = lease

    def lookup(self, key: str) -> JournalEntry | None:
        with self._db.connected(f"read journal entry {key!r}") as conn:
            row = conn.execute(
                "SELECT call::text, status, result::text FROM journal"
                " WHERE run_id = %s AND key = %s",
                (self._run_id, stored_key(key)),
            ).fetchone()
        return None if row is None else self._entry(key, row)

    def lookup_pair(self, key: str, other: str) -> tuple[JournalEntry | None, JournalEntry | None]:
        """Both entries in one statement (``journal.PairedLookup``)."""
        first, second = self._two_rows(key, other, f"read journal entries {key!r} and {other!r}")
        return (
            None if first is None else self._entry(key, first),
            None if second is None else self._entry(other, second),
        )

    def _two_rows(self, key: str, other: str, doing: str) -> tuple[Any, Any]:
        """The rows (call, status, result) of ``key`` and ``other``, None for a row not
        there, read in one statement; ``doing`` names the read in a failure's message."""
        keys = stored_key(key), stored_key(other)
        with self._db.connected(doing) as conn:
            rows = conn.execute(
                "SELECT key, call::text, status, result::text FROM journal"
                " WHERE run_id = %s AND key = ANY(%s)",
                (self._run_id, list(keys)),
            ).fetchall()
        found = {row[0]: row[1:] for row in rows}
        return found.get(keys[0]), found.get(keys[1])

    def _entry(self, key: str, row: tuple[str, str, str | None]) -> JournalEntry:
        """The entry of a row read back: a damaged one is a ``CheckpointError``."""
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

    def _start_params(self, key: str, call: ToolCall) -> dict[str, object]:
        """The parameters of a statement that records ``call`` started under ``key``,
        with the lease's when the journal is fenced."""
        params: dict[str, object] = {
            "run_id": self._run_id,
            "key": stored_key(key),
            "call": encode_model(call),
        }
        if self._lease is not None:
            params.update(ttl=self._lease.ttl_s, token=self._lease.token)
        return params

    def record_started(self, key: str, call: ToolCall) -> None:
        """Committed with a flush to disk before returning: it guards a side effect about to
        happen. Fenced by the run's lease (``durable.leases``): a driver whose lease was
        taken over must not start the call, and gets ``RunLeased``. One statement, whose
        answer is read after the commit (it wrote nothing when the fence failed)."""
        run_id, lease = self._run_id, self._lease
        params = self._start_params(key, call)
        started = self._db.durable_statement(
            f"record journal entry {key!r}", leases.fenced_insert(_START, lease), params
        )
        if not started:
            with self._db.connected(f"record journal entry {key!r}") as conn:
                raise leases.refusal(conn, run_id, lease)

    def lookup_or_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        """A call's first start (``journal.StartingJournal``): the entry for ``key`` when
        there is one, else ``call`` recorded as started and None, in one statement committed
        with a flush to disk, fenced as ``record_started`` is. An insert that meets a row
        committed after the statement's snapshot (another execution starting the same call
        at that moment) writes nothing, and the row is read again and answered: only one
        execution starts the call.

        Raises:
            NotStarted: there is no entry and the fence refused the start (``RunLeased``
                its cause), or the write failed.
            CheckpointError: the entry could not be read.
        """
        run_id, lease = self._run_id, self._lease
        params = self._start_params(key, call)
        sql = _FIRST_START if lease is None else _FIRST_START_LEASED
        try:
            row = self._db.durable_statement(f"record journal entry {key!r}", sql, params)[0]
        except CheckpointError as exc:  # nothing was committed: not started, maybe unread
            entry = self.lookup(key)  # raises when it cannot be read either
            if entry is not None:
                return entry
            raise NotStarted(str(exc)) from exc
        assert row is not None  # one row, whatever the journal holds
        if row[0]:
            return None
        if row[1] is not None:
            return self._entry(key, row[1:])
        entry = self.lookup(key)  # committed after the snapshot, or the fence refused
        if entry is not None:
            return entry
        with self._db.connected(f"record journal entry {key!r}") as conn:
            refused = leases.refusal(conn, run_id, lease)
        raise NotStarted(str(refused)) from refused

    def start_unless_known(
        self, key: str, call: ToolCall, other: str
    ) -> tuple[JournalEntry | None, JournalEntry | None, bool]:
        """``lookup(key)``, ``lookup(other)`` and, when both are None, the call's first start
        (as ``lookup_or_start``: never over an entry another execution records meanwhile,
        which is answered instead), in one statement, committed with a flush to disk
        (``journal.StartingLookup``); the third value says whether the call was recorded. A
        journal fenced by a lease reads and records in two statements (its fence renews the
        lease, which one statement cannot do alongside the read).

        Raises:
            as ``record_started``.
        """
        if self._lease is not None:
            first, second = self.lookup_pair(key, other)
            if first is None and second is None:
                entry = self._first_start(key, call)
                return entry, None, entry is None
            return first, second, False
        keys = stored_key(key), stored_key(other)
        params = {
            "run_id": self._run_id,
            "key": keys[0],
            "keys": list(keys),
            "call": encode_model(call),
        }
        rows = self._db.durable_statement(
            f"record journal entry {key!r}", _START_UNLESS_KNOWN, params
        )
        started = bool(rows[0][0])
        found = {row[1]: row[2:] for row in rows if row[1] is not None}
        first, second = found.get(keys[0]), found.get(keys[1])
        if not started and first is None and second is None:
            # Refused by the fence (another's live lease), or the key recorded meanwhile by
            # another execution of the step (a worker taken for dead that goes on): its row
            # came after this statement's snapshot, and the insert met it and did nothing.
            # Read again (the other's insert has committed by now, or rolled back): an entry
            # found is answered as found, never recorded over, so that only one execution
            # starts the call; none found leaves the fence to say why it refused (or, when
            # the other rolled back, to record the start).
            first_entry, second_entry = self.lookup_pair(key, other)
            if first_entry is None and second_entry is None:
                entry = self._first_start(key, call)
                return entry, None, entry is None
            return first_entry, second_entry, False
        return (
            None if first is None else self._entry(key, first),
            None if second is None else self._entry(other, second),
            started,
        )

    def _first_start(self, key: str, call: ToolCall) -> JournalEntry | None:
        """``lookup_or_start`` for ``start_unless_known``, whose caller found no entry: None
        when recorded; the entry another execution recorded meanwhile otherwise.

        Raises:
            as ``record_started`` (the cause of ``NotStarted``: ``RunLeased``, say).
        """
        try:
            return self.lookup_or_start(key, call)
        except NotStarted as exc:
            cause = exc.__cause__
            raise (cause if isinstance(cause, Exception) else exc) from None

    def finish_and_lookup(self, key: str, result: ToolMessage, other: str) -> JournalEntry | None:
        """``record_finished`` and ``lookup(other)`` in one statement
        (``journal.FinishingLookup``), committed as ``record_finished`` is. ``other`` is read
        as it was before the statement (another key than ``key``)."""
        row = self._finishing(_FINISH_AND_LOOK_UP, key, result, other)
        if not row[0]:
            raise KeyError(f"journal entry {key!r} finished without having started")
        return None if row[1] is None else self._entry(other, row[1:])

    def finish_first(self, key: str, result: ToolMessage) -> JournalEntry | None:
        """``journal.FirstFinish``: one statement, committed as ``record_finished`` is. An
        end another execution records at that moment makes the update find the row finished
        (it waits for that writer, then checks again): the entry is read again and its end
        answered."""
        return self._first_end(key, result, self._finishing(_FINISH_FIRST, key, result))

    def finish_first_and_lookup(
        self, key: str, result: ToolMessage, other: str
    ) -> tuple[JournalEntry | None, JournalEntry | None]:
        """``finish_first`` and ``lookup(other)`` in one statement
        (``journal.FirstFinishingLookup``), committed as ``record_finished`` is. ``other`` is
        read as it was when the statement began (another key than ``key``)."""
        row = self._finishing(_FINISH_FIRST_AND_LOOK_UP, key, result, other)
        found = None if row[0] is None else self._entry(other, row[:3])
        return self._first_end(key, result, row[3:]), found

    def _finishing(
        self, statement: str, key: str, result: ToolMessage, other: str | None = None
    ) -> tuple[Any, ...]:
        """The one row of a statement that records the end of ``key`` (and reads ``other``,
        if given), committed as ``record_finished`` is."""
        params = {"run_id": self._run_id, "key": stored_key(key), "result": encode_model(result)}
        if other is not None:
            params["other"] = stored_key(other)
        with self._db.connected(f"record journal entry {key!r}") as conn:
            row: tuple[Any, ...] | None = conn.execute(statement, params).fetchone()
        assert row is not None  # one row, whatever the journal holds
        return row

    def _first_end(
        self, key: str, result: ToolMessage, row: tuple[Any, ...]
    ) -> JournalEntry | None:
        """The entry after ``_FINISH_FIRST`` (its row: whether it recorded ``result``, and
        the entry as it was before): ``result``'s end, or the end recorded before."""
        done, call, status, recorded = row
        if call is None:
            return None
        if done:
            entry = self._entry(key, (call, status, None))
            return JournalEntry(key, entry.call, CallStatus.FINISHED, result)
        if status == _FINISHED:
            return self._entry(key, (call, status, recorded))
        return self.lookup(key)  # finished by another after this statement's snapshot

    def keep_outcome(self, key: str, outcome: str) -> str:
        """``journal.OutcomeJournal``: one statement, committed as ``record_finished`` is.
        An outcome another execution keeps at that moment makes the insert wait for it and
        do nothing: the row is read again and its outcome answered (a ``json`` value reads
        back as the text that was written)."""
        params = {"run_id": self._run_id, "key": stored_key(key), "outcome": outcome}
        with self._db.connected(f"keep outcome {key!r}") as conn:
            row = conn.execute(_KEEP_OUTCOME, params).fetchone()
        assert row is not None  # one row, whatever the journal holds
        kept, before = row
        if kept:
            return outcome
        if before is None:  # kept by another after this statement's snapshot
            with self._db.connected(f"read outcome {key!r}") as conn:
                again = conn.execute(
                    "SELECT result::text FROM journal WHERE run_id = %s AND key = %s",
                    (self._run_id, params["key"]),
                ).fetchone()
            if again is None:  # the other rolled back: keep this one now
                return self.keep_outcome(key, outcome)
            before = again[0]
        return str(before)

    def outcome_and_lookup(self, key: str, other: str) -> tuple[str | None, JournalEntry | None]:
        """Both rows in one statement (``journal.OutcomeJournal``)."""
        doing = f"read outcome {key!r} and journal entry {other!r}"
        kept, entry = self._two_rows(key, other, doing)
        outcome = None if kept is None or kept[1] != _OUTCOME else kept[2]
        return outcome, None if entry is None else self._entry(other, entry)

    def record_finished(self, key: str, result: ToolMessage) -> None:
        """Not fenced: it records what really happened to a call started under a valid
        lease. Committed without waiting for the disk, as saves are: if a crash of the
        server loses it, the call looks started, and is answered "outcome unknown" (or run
        again, if idempotent): never twice."""
        with self._db.connected(f"record journal entry {key!r}") as conn:
            updated = conn.execute(
                f"UPDATE journal SET status = '{_FINISHED}', result = %s WHERE run_id = %s"
                " AND key = %s RETURNING 1",
                (encode_model(result), self._run_id, stored_key(key)),
            ).fetchone()
        if updated is None:
            raise KeyError(f"journal entry {key!r} finished without having started")
