"""How PostgresStore lays checkpoints out in tables, and writes only what is new.

The tables (in the store's own schema; ``LAYOUT_VERSION`` in its ``layout`` table):

    layout    version                               the table layout
    runs      run_id, schema_version, header, summary columns, created/updated, revision,
              priority, cancel (``durable.queue``; index ``runs_to_take``), stop_reason,
              cost (index ``runs_by_stop``)
    messages  run_id, idx, message (json)           one row per transcript message
    trace     run_id, idx, row_index, turn          one row per transition
    journal   run_id, key, call, status, result     the tool journal
    leases    run_id, owner, token, expires_at      run leases (``durable.leases``)

``revision`` comes from one sequence and changes at every save of a run: a store that finds
the revision it last wrote or read knows the stored rows are the ones it saw, and compares
the live state with what it remembers (``Seen``) instead of reading rows back.

The functions take the store's connection and run inside its transaction; psycopg is imported
for the type checker only (``durable.postgres`` is the module that uses it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from agent_fsm.durable.encoding import (
    STORED_SUMMARY,
    encode_message,
    stop_value,
    summarize,
)
from agent_fsm.durable.queue import STOPPED_SQL
from agent_fsm.messages import Message
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[Any]
    Cursor = psycopg.Cursor[Any]

__all__ = [
    "APPEND",
    "INSERT_RUN",
    "LAYOUT",
    "LAYOUT_VERSION",
    "LIST_RUNS",
    "LOCK_FREE_RUN",
    "LOCK_LEASED_RUN",
    "NOW",
    "QUICK_FREE_SAVE",
    "QUICK_LEASED_SAVE",
    "UPGRADES",
    "WRITE_RUN",
    "Seen",
    "append",
    "append_params",
    "clear",
    "continues",
    "kept",
    "one",
    "run_values",
    "seen",
]

LAYOUT_VERSION = 3
"""The table layout, as stored in the schema's ``layout`` table: 2 added the queue's
``priority`` and ``cancel`` columns of ``runs`` and its index, 3 the ``stop_reason`` and
``cost`` columns and the ``runs_by_stop`` index (``UPGRADES``)."""

LAYOUT = (
    "CREATE TABLE layout (version integer NOT NULL)",
    "CREATE SEQUENCE revisions",
    """CREATE TABLE runs (
        run_id text PRIMARY KEY,
        schema_version integer NOT NULL,
        header json NOT NULL,
        state text NOT NULL,
        turns integer NOT NULL,
        total_tokens bigint NOT NULL,
        message_count integer NOT NULL,
        trace_count integer NOT NULL,
        last_row integer,
        output text,
        error text,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        revision bigint NOT NULL
    )""",
    "CREATE INDEX runs_by_revision ON runs (revision)",
    """CREATE TABLE messages (
        run_id text NOT NULL, idx integer NOT NULL, message json NOT NULL,
        PRIMARY KEY (run_id, idx)
    )""",
    """CREATE TABLE trace (
        run_id text NOT NULL, idx integer NOT NULL, row_index integer NOT NULL,
        turn integer NOT NULL, PRIMARY KEY (run_id, idx)
    )""",
    """CREATE TABLE journal (
        run_id text NOT NULL, key text NOT NULL, call json NOT NULL, status text NOT NULL,
        result json, PRIMARY KEY (run_id, key)
    )""",
    """CREATE TABLE leases (
        run_id text PRIMARY KEY, owner text NOT NULL, token bigint NOT NULL,
        expires_at double precision NOT NULL
    )""",
    "INSERT INTO layout VALUES (1)",
)
"""The statements that lay out a new schema, at layout version 1, in order; ``UPGRADES``
then bring it to ``LAYOUT_VERSION``, as they bring an older schema."""

UPGRADES: dict[int, tuple[str, ...]] = {
    2: (
        "ALTER TABLE runs ADD COLUMN priority integer NOT NULL DEFAULT 0",
        "ALTER TABLE runs ADD COLUMN cancel text",
        "CREATE INDEX runs_to_take ON runs (priority DESC, created_at, run_id)"
        f" WHERE state NOT IN {STOPPED_SQL}",
        "UPDATE layout SET version = 2",
    ),
    3: (
        "ALTER TABLE runs ADD COLUMN stop_reason text",
        "ALTER TABLE runs ADD COLUMN cost double precision",
        "UPDATE runs SET"
        f" stop_reason = CASE WHEN state NOT IN {STOPPED_SQL} THEN NULL"
        " WHEN json_typeof(header) = 'object'"
        " AND json_typeof(header -> 'stop_reason') = 'string'"
        " THEN header ->> 'stop_reason' ELSE '' END,"
        " cost = CASE WHEN json_typeof(header) = 'object'"
        " AND json_typeof(header -> 'cost') = 'number' THEN (header ->> 'cost')::float8 END",
        "CREATE INDEX runs_by_stop ON runs (stop_reason, revision) WHERE stop_reason IS NOT NULL",
        "UPDATE layout SET version = 3",
    ),
}
"""The statements that bring a schema from the version before each key to the key: 2, a
run's queue priority, its pending cancel request (``durable.queue``) and the index
``postgres_queue.NEXT_RUN`` walks (the runs that have not stopped, in the order they are
taken); 3, a stopped run's stop reason and a run's cost in columns, filled for the runs
saved before from their headers, and the index a stop filter walks, newest first."""

NOW = "extract(epoch FROM clock_timestamp())::float8"
"""The server's time as unix seconds: lease times are read there, never on a worker."""

LIST_RUNS = (
    "SELECT "
    + ", ".join(f"r.{name}" for name in STORED_SUMMARY).replace("messages", "message_count")
    + ", r.schema_version, r.priority, r.cancel, l.owner, l.expires_at, "
    + NOW
    + " FROM runs r LEFT JOIN leases l ON l.run_id = r.run_id"
    " WHERE (%(states)s::text[] IS NULL OR r.state = ANY(%(states)s::text[]))"
    " AND (NOT %(by_stop)s OR r.stop_reason = ANY(%(stops)s::text[]))"
    " ORDER BY r.revision DESC LIMIT %(limit)s"
)
"""What ``list_runs`` reads: each run's summary columns (``STORED_SUMMARY``), schema
version, queue priority, cancel request and last lease, with the server's time (lease
expiry is the server's); of the states chosen (``states``, NULL for all) and, with
``by_stop``, the stop reasons (``stops``, as ``encoding.stop_column`` keeps them)."""

INSERT_RUN = (
    "INSERT INTO runs (run_id, schema_version, header, state, turns, total_tokens,"
    " message_count, trace_count, last_row, output, error, created_at, updated_at, revision,"
    " priority, stop_reason, cost)"
    " VALUES (%(run_id)s, %(version)s, %(header)s, %(state)s, %(turns)s, %(total_tokens)s,"
    " %(message_count)s, %(trace_count)s, %(last_row)s, %(output)s, %(error)s, %(now)s,"
    " %(now)s, nextval('revisions'), %(priority)s, %(stop_reason)s, %(cost)s)"
    " ON CONFLICT (run_id) DO NOTHING"
    " RETURNING revision"
)
"""A new run's row, with its queue priority, unless the run exists (its row lock makes a
concurrent insert wait)."""

LOCK_LEASED_RUN = (
    "WITH fence AS (UPDATE leases SET expires_at = " + NOW + " + %(ttl)s"
    " WHERE run_id = %(run_id)s AND token = %(token)s RETURNING expires_at)"
    " SELECT message_count, trace_count, revision, nextval('revisions'), cancel,"
    " (SELECT expires_at FROM fence) FROM runs WHERE run_id = %(run_id)s FOR UPDATE"
)
"""A save's first statement, when the store holds the run's lease: renew it (fenced by its
token: a NULL expiry says it was taken over), and read the run's stored counts, revision
and cancel request with its row locked until the save commits, and the revision the save
will write."""

LOCK_FREE_RUN = (
    "SELECT r.message_count, r.trace_count, r.revision, nextval('revisions'), r.cancel,"
    " l.owner, l.expires_at, " + NOW + " FROM runs r LEFT JOIN leases l"
    " ON l.run_id = r.run_id AND l.expires_at > " + NOW + " WHERE r.run_id = %(run_id)s"
    " FOR UPDATE OF r"
)
"""``LOCK_LEASED_RUN`` when the store holds no lease on the run: the holder of a live one,
if any (the save is then refused)."""

_RUN_COLUMNS = (
    " schema_version = %(version)s, header = %(header)s,"
    " state = %(state)s, turns = %(turns)s, total_tokens = %(total_tokens)s,"
    " message_count = %(message_count)s, trace_count = %(trace_count)s,"
    " last_row = %(last_row)s, output = %(output)s, error = %(error)s, updated_at = %(now)s,"
    " stop_reason = %(stop_reason)s, cost = %(cost)s,"
    " cancel = CASE WHEN %(stopped)s THEN NULL ELSE runs.cancel END,"
)
"""The ``runs`` row's columns a save rewrites (all but the id, the revision, the creation
time and the priority; the save of a stop clears the cancel request)."""

_INSERTS = (
    " m AS (INSERT INTO messages SELECT %(run_id)s, * FROM"
    " unnest(%(message_idx)s::integer[], %(messages)s::json[])),"
    " t AS (INSERT INTO trace SELECT %(run_id)s, * FROM"
    " unnest(%(trace_idx)s::integer[], %(trace_rows)s::integer[], %(trace_turns)s::integer[]))"
)
APPEND = "WITH" + _INSERTS + " SELECT 1"
"""Insert new messages and trace entries (``append_params``), in one statement."""

WRITE_RUN = (
    "WITH"
    + _INSERTS
    + " UPDATE runs SET"
    + _RUN_COLUMNS
    + " revision = %(revision)s WHERE run_id = %(run_id)s"
)
"""A save's second statement: the new entries and the run's row, in one."""


def _appended_to(run: str) -> str:
    """``_INSERTS`` that write only when the CTE ``run`` found the run's row."""
    return (
        f" m AS (INSERT INTO messages SELECT {run}.run_id, x.* FROM {run},"
        " unnest(%(message_idx)s::integer[], %(messages)s::json[]) x),"
        f" t AS (INSERT INTO trace SELECT {run}.run_id, x.* FROM {run},"
        " unnest(%(trace_idx)s::integer[], %(trace_rows)s::integer[],"
        " %(trace_turns)s::integer[]) x)"
    )


_QUICK_SAVE = (
    " known AS (SELECT run_id FROM runs WHERE run_id = %(run_id)s"
    " AND revision = %(known_revision)s AND {fenced} FOR UPDATE),"
    + _appended_to("known")
    + " UPDATE runs SET"
    + _RUN_COLUMNS
    + " revision = nextval('revisions') FROM known WHERE runs.run_id = known.run_id"
    " RETURNING runs.revision, runs.cancel{expiry}"
)
QUICK_LEASED_SAVE = (
    "WITH fence AS (UPDATE leases SET expires_at = " + NOW + " + %(ttl)s"
    " WHERE run_id = %(run_id)s AND token = %(token)s RETURNING expires_at),"
    + _QUICK_SAVE.format(
        fenced="EXISTS (SELECT FROM fence)", expiry=", (SELECT expires_at FROM fence)"
    )
)
"""A whole save in one statement (so in one round trip, committed on its own), for a run
whose stored rows this store knows (``Seen``): it renews the lease, appends the new entries
and rewrites the run's row, all only if the run's revision is still the known one and the
lease's token still the run's latest; it returns the new revision, the run's cancel request
(``durable.queue``) and the lease's new expiry. No row back: nothing but the renewal
happened, and the save takes the long way (``LOCK_LEASED_RUN``, ``WRITE_RUN``), which says
why."""

QUICK_FREE_SAVE = "WITH" + _QUICK_SAVE.format(
    fenced="NOT EXISTS (SELECT FROM leases WHERE run_id = %(run_id)s AND expires_at > " + NOW + ")",
    expiry="",
)
"""``QUICK_LEASED_SAVE`` without a lease: only if no lease on the run is live."""


class Seen(NamedTuple):
    """What a store last wrote or read of a run: while the stored ``revision`` is this one,
    the stored prefix ends with these entries, and need not be read back to be compared."""

    revision: int
    messages: int
    last_message: Message | None
    trace: int
    last_trace: tuple[int, int] | None


def seen(revision: int, state: RunState) -> Seen:
    """What is stored once ``state`` was written (or read) at ``revision``."""
    messages, trace = state.messages, state.trace
    return Seen(
        revision,
        len(messages),
        messages[-1] if messages else None,
        len(trace),
        trace[-1] if trace else None,
    )


def continues(known: Seen, state: RunState) -> bool:
    """``state`` extends what ``known`` says is stored: its entries up to the known counts
    are the known ones, so only the rest is new (``QUICK_*_SAVE``)."""
    messages, trace = state.messages, state.trace
    if len(messages) < known.messages or len(trace) < known.trace:
        return False
    if known.messages and messages[known.messages - 1] is not known.last_message:
        return False
    return not known.trace or trace[known.trace - 1] == known.last_trace


def one(cursor: Cursor) -> Any:
    """The first column of the first row, or None."""
    row = cursor.fetchone()
    return None if row is None else row[0]


def run_values(
    state: RunState, encoded: tuple[int, bytes], now: float, priority: int = 0
) -> dict[str, Any]:
    """The run's row, for ``INSERT_RUN`` (created and updated at ``now``, with ``priority``)
    and ``WRITE_RUN``; ``encoded``: its schema version and header (``encode_header``)."""
    version, header = encoded
    line = summarize(state, created_at=now, updated_at=now)
    stopped = state.state in TERMINAL_STATES
    return {
        "run_id": state.run_id,
        "version": version,
        "header": header.decode(),
        "state": str(line.state),
        "turns": line.turns,
        "total_tokens": line.total_tokens,
        "message_count": line.messages,
        "trace_count": len(state.trace),
        "last_row": line.last_row,
        "output": line.output,
        "error": line.error,
        "stop_reason": stop_value(line.stop_reason, stopped=stopped),
        "cost": line.cost,
        "now": now,
        "stopped": stopped,
        "priority": priority,
    }


def append_params(state: RunState, messages_from: int, trace_from: int) -> dict[str, Any]:
    """``APPEND``'s parameters: the messages and trace entries from the given indices on."""
    messages, trace = state.messages, state.trace
    new_trace = trace[trace_from:]
    return {
        "run_id": state.run_id,
        "message_idx": list(range(messages_from, len(messages))),
        "messages": [encode_message(m) for m in messages[messages_from:]],
        "trace_idx": list(range(trace_from, len(trace))),
        "trace_rows": [row for row, _ in new_trace],
        "trace_turns": [turn for _, turn in new_trace],
    }


def clear(conn: Connection, run_id: str, messages_from: int, trace_from: int) -> None:
    """Before writing all of the messages or of the trace, delete what a deleted run or
    another history left there."""
    if messages_from == 0:
        conn.execute("DELETE FROM messages WHERE run_id = %s", (run_id,))
    if trace_from == 0:
        conn.execute("DELETE FROM trace WHERE run_id = %s", (run_id,))


def append(conn: Connection, state: RunState, messages_from: int, trace_from: int) -> None:
    """Insert the messages and trace entries from the given indices on (``clear`` first)."""
    clear(conn, state.run_id, messages_from, trace_from)
    if messages_from < len(state.messages) or trace_from < len(state.trace):
        conn.execute(APPEND, append_params(state, messages_from, trace_from))


def kept(
    conn: Connection,
    state: RunState,
    stored_messages: int,
    stored_trace: int,
    known: Seen | None,
) -> tuple[int, int]:
    """How many of the stored messages and trace entries stay, after deleting those beyond
    the live state's (a run restored from an older checkpoint and continued). They stay only
    if the live state continues both lists, its entries at the last stored indices being the
    stored ones; otherwise it is another history, written whole (0, 0: ``append`` clears
    first). ``known``: what the store remembers, when the stored revision is the one it
    saw."""
    run_id, messages, trace = state.run_id, state.messages, state.trace
    kept_messages, kept_trace = min(stored_messages, len(messages)), min(stored_trace, len(trace))
    if not (
        _same_message(conn, run_id, kept_messages, messages, known)
        and _same_step(conn, run_id, kept_trace, trace, known)
    ):
        return 0, 0
    if 0 < kept_messages < stored_messages:
        conn.execute(
            "DELETE FROM messages WHERE run_id = %s AND idx >= %s", (run_id, kept_messages)
        )
    if 0 < kept_trace < stored_trace:
        conn.execute("DELETE FROM trace WHERE run_id = %s AND idx >= %s", (run_id, kept_trace))
    return kept_messages, kept_trace


def _same_message(
    conn: Connection, run_id: str, kept: int, live: list[Message], known: Seen | None
) -> bool:
    """Whether the live message at index ``kept - 1`` is the stored one: known without
    reading it when the store saw the stored revision end with that very object."""
    if kept == 0:
        return True
    last = live[kept - 1]
    if known is not None and known.messages == kept and known.last_message is last:
        return True
    found = one(
        conn.execute(
            "SELECT message::text FROM messages WHERE run_id = %s AND idx = %s",
            (run_id, kept - 1),
        )
    )
    return bool(found == encode_message(last))


def _same_step(
    conn: Connection, run_id: str, kept: int, live: list[tuple[int, int]], known: Seen | None
) -> bool:
    """Whether the live trace entry at index ``kept - 1`` is the stored one."""
    if kept == 0:
        return True
    last = tuple(live[kept - 1])
    if known is not None and known.trace == kept and known.last_trace == last:
        return True
    found = conn.execute(
        "SELECT row_index, turn FROM trace WHERE run_id = %s AND idx = %s", (run_id, kept - 1)
    ).fetchone()
    return found is not None and tuple(found) == last
