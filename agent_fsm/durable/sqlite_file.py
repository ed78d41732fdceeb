"""The SQLite file under a ``SQLiteStore``: opened, laid out, and used one transaction at a
time by the store and by its runs' journals (``durable.sqlite_journal``).

The file is in WAL mode (readers never block the writer) with ``synchronous=NORMAL``: a
committed transaction survives a crash of the process, which is what resuming needs (a power
loss may lose the last few, never corrupt older ones). Every write is one ``BEGIN
IMMEDIATE`` transaction, so a crash mid-write leaves the previous state intact, and
concurrent writers (other processes on the file) wait for each other, up to ``timeout``,
instead of failing.

Tables (their layout is versioned with ``PRAGMA user_version``, apart from the checkpoint
schema version each run records):

    runs      run_id, schema_version, header (JSON), summary columns, created/updated times,
              revision, priority, cancel (``durable.queue``; index ``runs_to_take``),
              stop_reason, cost (index ``runs_by_stop``)
    messages  run_id, idx, json           one row per transcript message
    trace     run_id, idx, row, turn      one row per transition
    journal   run_id, key, call, status, result     the tool journal
    leases    run_id, owner, token, expires_at      run leases (``sqlite_leases``)
    revisions deleted                               one row: the highest revision a deleted
                                                    run held (``_REVISIONS``)
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading

import agent_fsm.durable.sqlite_leases as sqlite_leases
from agent_fsm.durable.listing import redacted
from agent_fsm.durable.queue import STOPPED_SQL
from agent_fsm.errors import CheckpointError

__all__ = ["LAYOUT_VERSION", "SQLiteFile", "Transaction"]

LAYOUT_VERSION = 6
"""The table layout, as stored in ``PRAGMA user_version``: 2 added the ``leases`` table, 3
the queue's ``priority`` and ``cancel`` columns of ``runs`` and its index, 4 the
``stop_reason`` and ``cost`` columns and the ``runs_by_stop`` index, 5 the ``revisions``
table, 6 made the queue's index read ``stop_reason`` rather than ``state`` (an older file is
upgraded when opened; an older agent_fsm then refuses it as newer)."""

_QUEUE = (
    "ALTER TABLE runs ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE runs ADD COLUMN cancel TEXT",
    "CREATE INDEX runs_to_take ON runs (priority DESC, created_at, run_id)"
    f" WHERE state NOT IN {STOPPED_SQL}",
)
"""Layout 3: a run's queue priority, its pending cancel request (``durable.queue``), and the
index ``claim_next`` walks: the runs that have not stopped, in the order they are taken."""

_STOPS = (
    "ALTER TABLE runs ADD COLUMN stop_reason TEXT",
    "ALTER TABLE runs ADD COLUMN cost REAL",
    # The runs saved before: each header holds its run's reason and cost, when it recorded
    # them (a damaged header, which json_extract would refuse, gets neither).
    "UPDATE runs SET"
    f" stop_reason = CASE WHEN state NOT IN {STOPPED_SQL} THEN NULL"
    " WHEN json_valid(header) AND json_type(header, '$.stop_reason') = 'text'"
    " THEN json_extract(header, '$.stop_reason') ELSE '' END,"
    " cost = CASE WHEN json_valid(header) AND json_type(header, '$.cost') IN ('real', 'integer')"
    " THEN json_extract(header, '$.cost') END",
    "CREATE INDEX runs_by_stop ON runs (stop_reason) WHERE stop_reason IS NOT NULL",
)
"""Layout 4: a stopped run's stop reason and a run's cost in columns (``list_runs``
filters by the one and shows the other without reading a header; ``encoding.stop_column``),
filled for the runs an older layout kept from their headers, and the index a stop filter
walks: of the stopped runs' reasons only (no revision, which every save changes), so a save
mid-run leaves it alone."""

_REVISIONS = (
    "CREATE TABLE revisions (deleted INTEGER NOT NULL)",
    "INSERT INTO revisions VALUES (0)",
)
"""Layout 5: the highest revision a deleted run held. A save takes a revision above both it
and every stored run's (``sqlite_rows``), so no revision is taken twice in a file, even
after deletes: a store that remembers a run at a revision (``SQLiteStore._seen``) and finds
it there knows the stored history is the one it saw, never a run deleted and made again by
another store up to the same revision and counts. Kept by the rare delete rather than bumped
by every save: a save only reads it, in the statement that reads the highest revision
anyway. An older file starts it at 0: revisions its runs deleted before held are unknown,
and no store of this layout can remember them (each opened the file, upgrading it, first)."""

_TAKE_BY_STOP = (
    "DROP INDEX runs_to_take",
    "CREATE INDEX runs_to_take ON runs (priority DESC, created_at, run_id)"
    " WHERE stop_reason IS NULL",
)
"""Layout 6: the queue's index (layout 3's, ``_QUEUE``) of the runs that have not stopped
told by ``stop_reason``, NULL exactly while a run has not stopped (layout 4 filled it so, and
every save writes it so: ``encoding.stop_value``), rather than by ``state``. SQLite rewrites
a partial index's entry for every UPDATE that names a column the index's WHERE reads, changed
or not: every save names ``state``, which changes on every save, and so wrote the index's
page too (one page more to the write-ahead log per save, ~10k instructions); the save of a run
going on (``sqlite_rows.QUICK_UPDATE``) does not name ``stop_reason``, which stays NULL."""

_LAYOUT = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    schema_version INTEGER NOT NULL,
    header TEXT NOT NULL,
    state TEXT NOT NULL,
    turns INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL,
    message_count INTEGER NOT NULL,
    trace_count INTEGER NOT NULL,
    last_row INTEGER,
    output TEXT,
    error TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    revision INTEGER NOT NULL
);
CREATE INDEX runs_by_revision ON runs (revision);
CREATE TABLE messages (
    run_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    json TEXT NOT NULL,
    PRIMARY KEY (run_id, idx)
);
CREATE TABLE trace (
    run_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    row INTEGER NOT NULL,
    turn INTEGER NOT NULL,
    PRIMARY KEY (run_id, idx)
) WITHOUT ROWID;
CREATE TABLE journal (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    call TEXT NOT NULL,
    status TEXT NOT NULL,
    result TEXT,
    PRIMARY KEY (run_id, key)
);
"""

_SETTLE = (
    "UPDATE journal SET status = 'finished', result = ?1 WHERE run_id = ?2 AND key = ?3"
    " AND (?4 IS NULL OR ?4 = (SELECT revision FROM runs WHERE run_id = ?2))"
)
"""A finished record held back (``SQLiteFile.hold``) written, while the run is at the revision
then known (?4), if one was."""

_UPGRADES: tuple[tuple[int, tuple[str, ...]], ...] = (
    (2, (sqlite_leases.LEASES_TABLE,)),
    (3, _QUEUE),
    (4, _STOPS),
    (5, _REVISIONS),
    (6, _TAKE_BY_STOP),
)
"""Each layout after the first and the statements that bring the one before it there."""


class SQLiteFile:
    """One connection to a store's file, shared by the store and its journals.

    Args:
        path: the database file, created when missing (with its tables).
        timeout: seconds a write waits for another process's write to finish.

    Raises:
        CheckpointError: the file cannot be opened or written, is not an agent_fsm store,
            or was laid out by a newer agent_fsm.

    Safe to share between threads (sync tools run in worker threads): transactions are
    serialised under one lock.
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 5.0) -> None:
        self.path = os.fspath(path)
        """The file, as given."""
        self.name = redacted(self.path)
        """Names the store in errors: the path, or (given a URL by mistake) without its
        password."""
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._held: dict[str, dict[str, tuple[str, int | None]]] = {}
        """run_id -> stored key -> (result JSON, the run's revision then known): finished
        records a journal holds back until the run's next write (``hold``)."""
        self._known: dict[str, int] = {}
        """run_id -> the revision this process last wrote or read of the run (``knows``)."""
        if self.path.lower().startswith(("postgres://", "postgresql://")):
            raise CheckpointError(
                f"{self.name} is a PostgreSQL URL, not a SQLite file: open it with"
                " agent_fsm.durable.postgres.PostgresStore"
            )
        try:
            conn = sqlite3.connect(
                self.path, timeout=timeout, isolation_level=None, check_same_thread=False
            )
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a NUL in the path
            raise CheckpointError(f"cannot open checkpoint store {self.name}: {exc}") from exc
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            self._prepare_layout(conn)
            self._check_writable(conn)
        except (sqlite3.Error, CheckpointError) as exc:
            conn.close()
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"cannot open checkpoint store {self.name}: {exc}") from exc
        self._conn = conn

    def _prepare_layout(self, conn: sqlite3.Connection) -> None:
        """Create the tables in a new file, upgrade an older layout; refuse a file laid out
        by anyone else."""
        if conn.execute("PRAGMA user_version").fetchone()[0] < LAYOUT_VERSION:
            conn.execute("BEGIN IMMEDIATE")  # two processes may create the same new file
            try:
                self._lay_out(conn, conn.execute("PRAGMA user_version").fetchone()[0])
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > LAYOUT_VERSION:
            raise CheckpointError(
                f"checkpoint store {self.name} was laid out by a newer agent_fsm (layout"
                f" version {version}; this version knows {LAYOUT_VERSION}): upgrade agent_fsm"
            )
        if version != LAYOUT_VERSION:
            raise CheckpointError(
                f"checkpoint store {self.name} has unknown layout version {version}"
            )

    def _lay_out(self, conn: sqlite3.Connection, version: int) -> None:
        """Bring a layout of ``version`` to ``LAYOUT_VERSION``, inside the caller's
        transaction, statement by statement (executescript would commit it)."""
        if version == 0:
            if conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
                raise CheckpointError(
                    f"{self.name} is not an agent_fsm checkpoint store (it holds other tables)"
                )
            for statement in _LAYOUT.split(";"):
                if statement.strip():
                    conn.execute(statement)
        for layout, statements in _UPGRADES:
            if version < layout:
                for statement in statements:
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {LAYOUT_VERSION}")

    def _check_writable(self, conn: sqlite3.Connection) -> None:
        """Refuse a store that cannot be written (a read-only file, directory or file system)
        now, rather than at a run's first checkpoint: one write, rolled back."""
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(f"PRAGMA user_version = {LAYOUT_VERSION}")
        except sqlite3.OperationalError as exc:
            if not getattr(exc, "sqlite_errorname", "").startswith("SQLITE_READONLY"):
                raise
            raise CheckpointError(
                f"checkpoint store {self.name} cannot be written ({exc}): runs could not be"
                " saved; give a path this process may write"
            ) from exc
        finally:
            if conn.in_transaction:
                conn.execute("ROLLBACK")

    def hold(self, run_id: str, key: str, result: str) -> None:
        """Keep the finished record of a call (``key`` as stored, ``result`` its JSON) until
        the run's next write transaction (``transaction(..., settling=run_id)``: a checkpoint
        save or a journal record), which writes it first. Until then ``held`` gives it to
        readers in this process; a crash loses it, and the call then reads as started (its
        outcome unknown), as when a crash came just before its record. ``durable.journal``'s
        ``SQLiteJournal`` holds back a record only when no other call of the run is in
        flight, so the next write follows without waiting on anything from outside.

        The record is written only while the run is at the revision this process knew it at
        when it held the record back (``knows``), if it knew one: a run another process
        deleted and made again meanwhile, whose call of the same key may have started since,
        is not given this one's end (the record is then lost, as in a crash)."""
        with self._lock:
            self._held.setdefault(run_id, {})[key] = (result, self._known.get(run_id))

    def knows(self, run_id: str, revision: int) -> None:
        """This process wrote or read the run at ``revision`` (``SQLiteStore``)."""
        self._known[run_id] = revision

    def held(self, run_id: str, key: str) -> str | None:
        """The result JSON held back for the call (``hold``), if any; read inside a
        transaction, which holds the lock."""
        held = self._held.get(run_id, {}).get(key)
        return None if held is None else held[0]

    def holds(self, run_id: str) -> bool:
        """Records are held back for the run."""
        return run_id in self._held

    def forget(self, run_id: str) -> None:
        """Drop what is held back for a deleted run, and its revision; inside its delete's
        transaction."""
        self._held.pop(run_id, None)
        self._known.pop(run_id, None)

    def transaction(self, what: str, *, write: bool, settling: str | None = None) -> Transaction:
        """One transaction on the file, under the lock: committed when the block ends,
        rolled back when it raises. sqlite errors become ``CheckpointError`` saying it could
        not ``what`` (for example "save run 'r1'").

        A write (``write=True``) begins IMMEDIATE: it holds the file's write lock from its
        first statement, so what it reads cannot change before it writes. A read takes a
        deferred transaction: its queries see one snapshot even while another process
        writes.

        ``settling``: a write of that run, which first writes the finished records held
        back for it (``hold``); they are held again if it does not commit.

        Raises:
            CheckpointError: the file is closed, or sqlite failed.
        """
        return Transaction(self, what, write, settling)

    def close(self) -> None:
        """Close the connection; idempotent. Transactions then raise CheckpointError."""
        for run_id in list(self._held):  # best effort: a record lost reads as started
            settled = self.transaction("record journal entries", write=True, settling=run_id)
            with contextlib.suppress(CheckpointError), settled:
                pass
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class Transaction:
    """``SQLiteFile.transaction``'s block: a class rather than a generator context manager,
    as every save and journal record opens one (a generator's frame and its ``next`` and
    ``throw`` cost more than the statements of a small transaction)."""

    __slots__ = ("_conn", "_file", "_settled", "_settling", "_what", "_write")

    def __init__(self, file: SQLiteFile, what: str, write: bool, settling: str | None) -> None:
        self._file = file
        self._what = what
        self._write = write
        self._settling = settling
        self._settled: dict[str, tuple[str, int | None]] | None = None
        self._conn: sqlite3.Connection | None = None

    def __enter__(self) -> sqlite3.Connection:
        file = self._file
        file._lock.acquire()
        try:
            conn = file._conn
            if conn is None:
                raise CheckpointError(f"checkpoint store {file.name} is closed")
            conn.execute("BEGIN IMMEDIATE" if self._write else "BEGIN")
            self._conn = conn
            if self._settling is not None and self._settling in file._held:
                self._settle(conn, self._settling)
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)
            raise
        return conn

    def _settle(self, conn: sqlite3.Connection, run_id: str) -> None:
        """Write the finished records held back for ``run_id`` (``SQLiteFile.hold``)."""
        self._settled = records = self._file._held.pop(run_id)
        conn.executemany(
            _SETTLE, [(result, run_id, key, known) for key, (result, known) in records.items()]
        )

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, _: object
    ) -> None:
        conn, file = self._conn, self._file
        committed = False
        try:
            if conn is None:  # it never began
                pass
            elif kind is None:
                conn.execute("COMMIT")
                committed = True
            elif conn.in_transaction:  # sqlite may have rolled back already
                conn.execute("ROLLBACK")
        except sqlite3.Error as exc:
            raise self._failed(exc) from exc
        finally:
            settled = self._settled
            if settled is not None and not committed:  # held again, under later ones
                assert self._settling is not None
                file._held[self._settling] = {**settled, **file._held.get(self._settling, {})}
            file._lock.release()
        if isinstance(error, sqlite3.Error):
            raise self._failed(error) from error

    def _failed(self, exc: sqlite3.Error) -> CheckpointError:
        return CheckpointError(f"checkpoint store {self._file.name}: cannot {self._what}: {exc}")
