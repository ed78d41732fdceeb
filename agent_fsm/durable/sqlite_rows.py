"""The statements of a ``SQLiteStore`` save and the values they take: the run's row
(``GOING_ON_COLUMNS`` and ``STOP_COLUMNS``), written whole by ``INSERT_RUN``, ``UPDATE_RUN``
or, for the common save that reads nothing first, ``QUICK_UPDATE``; and the new messages and
trace entries (``append``). ``durable.sqlite`` decides which statement a save takes.

A save takes a revision above every one the file ever held: above every stored run's and
the highest a deleted run held (``DELETED``, kept by ``FORGET_REVISION``), so none is taken
twice (``durable.sqlite_file``'s layout 5 says why).

A None among a statement's values costs the sqlite3 module of Python 3.11 ~2k instructions
(no adapter is registered for it, and its failed look-up of one makes an ``AttributeError``
and drops it): the save of a run going on binds only the columns it writes, and most of
those are set (its output, error and cost are None while they are unknown)."""

from __future__ import annotations

import sqlite3

from agent_fsm.durable.encoding import encode_message, stop_value, summary_columns
from agent_fsm.state import RunState

__all__ = [
    "DELETED",
    "FORGET_REVISION",
    "GOING_ON_COLUMNS",
    "INSERT_RUN",
    "QUICK_UPDATE",
    "READ_RUN",
    "STOP_COLUMNS",
    "UPDATE_RUN",
    "append",
    "columns",
    "stop",
]

DELETED = "(SELECT deleted FROM revisions)"
"""The highest revision a deleted run held (0 if none)."""

FORGET_REVISION = (
    "UPDATE revisions SET deleted ="
    " MAX(deleted, COALESCE((SELECT revision FROM runs WHERE run_id = ?), 0))"
)
"""Before a run's row is deleted: its revision, if the highest deleted, kept as such."""

GOING_ON_COLUMNS = (
    "schema_version, header, state, turns, total_tokens, message_count, trace_count, last_row,"
    " output, error, updated_at, revision, cost"
)
"""The columns of a run's row every save writes, in ``columns``' order."""

STOP_COLUMNS = "cancel, stop_reason"
"""The columns of a run's row that only a stop or the save after one changes (``stop``): the
run's pending cancel request, cleared by a stop, and its stop reason, NULL while it goes on."""

INSERT_RUN = (
    f"INSERT INTO runs ({GOING_ON_COLUMNS}, {STOP_COLUMNS}, run_id, created_at, priority)"
    f" VALUES ({', '.join('?' * 18)})"
)
"""A new run's row, with its creation time and priority."""

UPDATE_RUN = (
    "UPDATE runs SET "
    + ", ".join(f"{name.strip()} = ?" for name in f"{GOING_ON_COLUMNS}, {STOP_COLUMNS}".split(","))
    + " WHERE run_id = ?"
)
"""The stored row rewritten: its creation time and priority kept, its cancel request as
``SQLiteStore._write`` decides."""

QUICK_UPDATE = (
    "UPDATE runs SET "
    + ", ".join(f"{name.strip()} = ?{n}" for n, name in enumerate(GOING_ON_COLUMNS.split(","), 1))
    + " WHERE run_id = ?14 AND revision = ?15 AND message_count = ?16 AND trace_count = ?17"
    f" AND ?12 > (SELECT MAX(revision) FROM runs) AND ?12 > {DELETED}"
    " AND NOT EXISTS (SELECT 1 FROM leases l WHERE l.run_id = ?14 AND l.expires_at > ?11)"
)
"""``UPDATE_RUN`` for ``SQLiteStore._quick_write``, which reads nothing first, of a run going
on that was going on at its last save: only while the row is at the known revision and counts
(?15, ?16, ?17), the new revision (?12) is the highest the file ever held, and no lease on the
run is live at the save's time (?11). It names no ``STOP_COLUMNS``: the cancel request is
kept, the stop reason stays NULL, and the queue's index, which reads it, is left alone
(``sqlite_file._TAKE_BY_STOP`` says why)."""

READ_RUN = (
    "SELECT r.message_count, r.trace_count, r.created_at, r.revision, r.cancel,"
    f" (SELECT MAX(COALESCE(MAX(revision), 0), {DELETED}) + 1 FROM runs),"
    " EXISTS (SELECT 1 FROM leases l WHERE l.run_id = ?1 AND l.expires_at > ?2)"
    " FROM (SELECT 1) LEFT JOIN runs r ON r.run_id = ?1"
)
"""What a save reads first, in one statement (each one costs a round through the sqlite3
module): the stored run's counts, creation time, revision and cancel request (NULLs for a
new run), the revision the save takes (the next above any the file held), and whether a
lease on the run is live."""


def columns(
    state: RunState, version: int, header: bytes, now: float, revision: int
) -> tuple[object, ...]:
    """The values of ``GOING_ON_COLUMNS`` for ``state``."""
    name, turns, total_tokens, last_row, output, error, _, cost = summary_columns(state)
    return (
        version,
        header.decode(),
        str(name),
        turns,
        total_tokens,
        len(state.messages),
        len(state.trace),
        last_row,
        output,
        error,
        now,
        revision,
        cost,
    )


def stop(state: RunState, cancel: str | None, stopped: bool) -> tuple[str | None, str | None]:
    """The values of ``STOP_COLUMNS`` for ``state``, which ``stopped`` or not, whose pending
    cancel request is ``cancel`` (None once it stopped)."""
    if not stopped:
        return cancel, None
    return None, stop_value(state.stop_reason, stopped=True)


def append(conn: sqlite3.Connection, state: RunState, messages_from: int, trace_from: int) -> None:
    """Insert the messages and trace entries of ``state`` from those indices on (most saves
    add no message: no statement for nothing)."""
    run_id, messages, trace = state.run_id, state.messages, state.trace
    if messages_from < len(messages):
        conn.executemany(
            "INSERT INTO messages VALUES (?, ?, ?)",
            [
                (run_id, idx, encode_message(messages[idx]))
                for idx in range(messages_from, len(messages))
            ],
        )
    if trace_from < len(trace):
        conn.executemany(
            "INSERT INTO trace VALUES (?, ?, ?, ?)",
            [(run_id, idx, *trace[idx]) for idx in range(trace_from, len(trace))],
        )
