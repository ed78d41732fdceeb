"""The PostgreSQL database under a ``PostgresStore``: one connection, its schema laid out on
first use, and the statements and transactions the store and its runs' journals
(``durable.postgres_journal``) make on it. The only module importing psycopg at run time.

Connecting waits at most ``connect_timeout_s``; a connection that cannot be made is a
``CheckpointError`` that says what to do (a server that refuses, one that does not answer, one
out of connection slots: "too many clients"), naming the store without its password, which no
message of this module ever holds (``checkpoint.redacted``).

The tables live in a schema of their own (``agent_fsm`` by default), created on first use
and versioned (``postgres_rows`` lays them out), so they never meet an application's tables.
The session commits with ``synchronous_commit = off`` unless ``synchronous_saves``; a
``durable`` transaction commits with a flush to disk whatever the session's default
(``durable.postgres``, "Durability", says which writes are).
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import pq, sql
from psycopg.abc import Params
from psycopg.conninfo import conninfo_to_dict

import agent_fsm.durable.postgres_rows as rows
from agent_fsm.durable.checkpoint import redacted
from agent_fsm.durable.postgres_rows import LAYOUT_VERSION, one
from agent_fsm.errors import CheckpointError, ConfigError

__all__ = ["CONNECT_TIMEOUT_S", "PostgresDatabase"]

CONNECT_TIMEOUT_S = 10.0
"""How long a connection may take when neither ``connect_timeout_s`` nor the URL's own
``connect_timeout`` says: long enough for a slow network, short enough that a worker whose
database is gone says so instead of hanging."""

LOCK_WAIT_S = 2.0
"""How long a statement of a store waits for a row lock another session holds before it
fails (``lock_timeout``, set once the layout is ready: laying it out may wait longer for
the other workers starting at once). The store's own transactions hold their locks for a
round trip or two; a lock held longer belongs to a process frozen inside a transaction
(SIGSTOPped, swapped out, its machine suspended), and PostgreSQL keeps it for as long as the
process stays frozen: a pipelined transaction never counts as idle on the server. Without the
limit, every worker that came to take the frozen one's runs over would wait on it, with the
thread renewing its own lease, and a whole fleet would stand still. With it, the waiting
call fails (``CheckpointError``) and is tried again later; the frozen worker's runs wait for
it to wake or die."""

_NO_SLOTS = re.compile(r"too many (connections|clients)|connection slots are reserved")


class PostgresDatabase:
    """One connection to a store's schema, under a lock, shared by the store and its
    journals; made when first needed, and again after it broke (the server restarted).

    Args:
        url: a libpq connection string or URL (``postgresql://user:pw@host:5432/db``).
        schema: the schema holding the tables; created on first use, with them.
        synchronous_saves: the session's commits flush to disk too (not only ``durable``
            transactions).
        connect_timeout_s: how long making a connection may take (whole seconds, at least
            2: libpq's rule); None: the URL's ``connect_timeout``, else ``CONNECT_TIMEOUT_S``.
        create: lay the schema out when it is missing; False refuses a missing one (what
            reads a store, such as ``agent-fsm runs``, must not create one by mistake).

    Raises:
        CheckpointError: not a connection string, the database cannot be reached, or the
            schema holds other tables, was laid out by a newer agent_fsm or (``create`` off)
            is missing.
        ConfigError: ``connect_timeout_s`` is not a positive number of seconds.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str,
        synchronous_saves: bool,
        connect_timeout_s: float | None = None,
        create: bool = True,
    ) -> None:
        self.schema = schema
        self._url = url
        self._synchronous_saves = synchronous_saves
        self._create = create
        self._lock = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        try:
            params = conninfo_to_dict(url)
        except psycopg.Error as exc:  # its text may quote the URL: not chained, scrubbed
            detail = redacted(str(exc), secrets_of=url)
            raise CheckpointError(f"not a PostgreSQL connection string or URL: {detail}") from None
        where = f"{params.get('host', 'localhost')}:{params.get('port', 5432)}"
        self.name = f"postgresql://{where}/{params.get('dbname', '')} (schema {schema})"
        """Names the store in errors (without the password)."""
        self._connect_timeout = _timeout(connect_timeout_s, params.get("connect_timeout"))
        self._waited = f"{self._connect_timeout or params.get('connect_timeout')} s"
        with self.connected("open the store"):
            pass

    def _connection(self) -> psycopg.Connection[Any]:
        """The open connection, made (and the layout checked) when there is none."""
        if self._closed:
            raise CheckpointError(f"checkpoint store {self.name} is closed")
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            try:
                conn = psycopg.connect(
                    self._url, autocommit=True, connect_timeout=self._connect_timeout
                )
            except psycopg.OperationalError as exc:
                raise self._unreachable(exc) from None
            try:
                conn.execute(
                    "SELECT set_config('search_path', quote_ident(%s), false),"
                    " set_config('synchronous_commit', %s, false)",
                    (self.schema, "on" if self._synchronous_saves else "off"),
                )
                self._prepare_layout(conn)
                conn.execute(
                    "SELECT set_config('lock_timeout', %s, false)",
                    (f"{round(LOCK_WAIT_S * 1000)}ms",),
                )
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return conn

    def _prepare_layout(self, conn: psycopg.Connection[Any]) -> None:
        """Create the schema and tables when missing, bring an older layout up to date (each
        once, under an advisory lock: several workers may start at once); refuse a schema
        laid out by anyone else, or by a newer agent_fsm."""
        # The catalog itself, not to_regclass: its cache may not have seen a layout that
        # another worker committed while this one waited for the lock.
        found = (
            "SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid ="
            " c.relnamespace WHERE n.nspname = %s AND c.relname = 'layout')"
        )
        latest = "SELECT max(version) FROM layout"
        exists = one(conn.execute(found, (self.schema,)))
        if not exists and not self._create:
            raise CheckpointError(
                f"no agent_fsm checkpoint store at {self.name}: the schema holds no"
                " agent_fsm tables (name the schema the workers use)"
            )
        version = one(conn.execute(latest)) if exists else None
        if not exists or (isinstance(version, int) and version < LAYOUT_VERSION):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.name,))
                if not one(conn.execute(found, (self.schema,))):
                    self._lay_out(conn)
                version = one(conn.execute(latest))
                while isinstance(version, int) and version < LAYOUT_VERSION:
                    version += 1
                    for statement in rows.UPGRADES[version]:
                        conn.execute(statement)
        version = one(conn.execute(latest))
        if version is not None and version > LAYOUT_VERSION:
            raise CheckpointError(
                f"checkpoint store {self.name} was laid out by a newer agent_fsm (layout"
                f" version {version}; this version knows {LAYOUT_VERSION}): upgrade agent_fsm"
            )
        if version != LAYOUT_VERSION:
            raise CheckpointError(
                f"checkpoint store {self.name} has unknown layout version {version}"
            )

    def _lay_out(self, conn: psycopg.Connection[Any]) -> None:
        taken = conn.execute(
            "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s",
            (self.schema,),
        )
        if one(taken):
            raise CheckpointError(
                f"{self.name} is not an agent_fsm checkpoint store (its schema holds other"
                " tables): give the store a schema of its own"
            )
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self.schema)))
        for statement in rows.LAYOUT:
            conn.execute(statement)

    def _unreachable(self, exc: psycopg.OperationalError) -> CheckpointError:
        """The error for a connection that could not be made: what happened, and what to do."""
        text = redacted(" ".join(str(exc).split()), secrets_of=self._url)
        if "timeout expired" in text:
            advice = (
                f"no answer within {self._waited}: is the host reachable and the"
                " port right? (connect_timeout_s sets the wait)"
            )
        elif _NO_SLOTS.search(text):
            advice = (
                "the server has no connection left for this one (too many clients): each"
                " PostgresStore holds one connection, and each DBOS process a pool of its own;"
                " run fewer processes or smaller pools, raise the server's max_connections, or"
                " put a session-mode pooler (PgBouncer) in front"
            )
        elif "refused" in text:
            advice = (
                "nothing accepts connections there: is PostgreSQL running on that host and port?"
            )
        else:
            advice = "check the URL's host, port, user, password and database"
        return CheckpointError(f"checkpoint store {self.name}: cannot connect: {advice} ({text})")

    @contextmanager
    def connected(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """The connection, under the lock, in autocommit: each statement commits on its own
        (one round trip; for a read that needs no snapshot across statements, or a write of
        one statement). Database errors become ``CheckpointError`` saying it could not
        ``what`` (for example "save run 'r1'").

        Raises:
            CheckpointError: the store is closed, or the database failed.
        """
        with self._lock:
            try:
                yield self._connection()
            except psycopg.Error as exc:
                detail = redacted(" ".join(str(exc).split()), secrets_of=self._url)
                raise CheckpointError(
                    f"checkpoint store {self.name}: cannot {what}: {detail}"
                ) from exc

    @contextmanager
    def transaction(
        self, what: str, *, write: bool = True, durable: bool = True
    ) -> Iterator[psycopg.Connection[Any]]:
        """One transaction, pipelined, under the lock (``connected``'s errors): committed
        when the block ends, rolled back when it raises (or a statement fails). A read
        (``write=False``) sees one snapshot (repeatable read), so its statements agree with
        each other while other workers write. A ``durable`` write commits with a flush to
        disk even when the session's commits do not.

        Round trips: BEGIN (and the setting) go out with the block's first statements and
        are not waited for; COMMIT goes out with its last ones and the Sync ending the
        pipeline. A block reading no rows is one round trip, and each read of rows not yet
        received adds one (rows read after the block are there: they cost nothing). A
        failure costs one more, for the ROLLBACK.

        Raises:
            CheckpointError: the store is closed, or the database failed (the transaction
                may or may not have been committed when the connection was lost).
        """
        begin = "BEGIN" if write else "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
        with self.connected(what) as conn:
            try:
                with conn.pipeline():
                    conn.execute(begin)
                    if write and durable and not self._synchronous_saves:
                        conn.execute("SET LOCAL synchronous_commit = on")
                    yield conn
                    conn.execute("COMMIT")
            except BaseException:
                if not conn.broken and conn.pgconn.transaction_status != pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise

    def durable_statement(self, what: str, statement: str, params: Params) -> list[Any]:
        """One write statement in a transaction of its own, committed with a flush to disk,
        in *one* round trip; its rows (none for a statement returning none).
        ``durable_statements`` of one statement.

        Raises:
            CheckpointError: the store is closed, or the database failed (the statement
                may or may not have been committed when the connection was lost).
        """
        return self.durable_statements(what, (statement, params))[0]

    def durable_statements(self, what: str, *statements: tuple[str, Params]) -> list[list[Any]]:
        """Statements in one ``durable`` transaction of their own, in *one* round trip:
        BEGIN, the setting, the statements and COMMIT are sent together and their rows read
        after the commit, a list per statement (empty for a statement returning none). No
        statement can depend on another's answer, only on what it wrote: each runs after
        the previous one, in the same transaction, holding the locks the previous ones took.
        Rolled back when one fails: none of them is committed then.

        Raises:
            CheckpointError: as ``transaction``'s.
        """
        with self.transaction(what) as conn:
            cursors = [conn.execute(statement, params) for statement, params in statements]
        return [cursor.fetchall() if cursor.description else [] for cursor in cursors]

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def close(self) -> None:
        """Close the connection; idempotent. Calls then raise CheckpointError."""
        with self._lock:
            self._closed = True
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _timeout(seconds: object, from_url: object) -> int | None:
    """The ``connect_timeout`` to hand libpq: ``seconds`` in whole seconds (at least 2,
    libpq's rule); None, when ``seconds`` is None and the URL sets its own, to keep that;
    else ``CONNECT_TIMEOUT_S``.

    Raises:
        ConfigError: ``seconds`` is not a positive, finite number.
    """
    if seconds is None:
        return None if from_url else int(CONNECT_TIMEOUT_S)
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds < 1e6:
        raise ConfigError(
            f"connect_timeout_s must be a positive number of seconds, got {seconds!r}"
        )
    return max(2, math.ceil(seconds))
