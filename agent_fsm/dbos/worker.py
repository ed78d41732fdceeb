"""``DBOSWorker``: one process of a DBOS fleet, launched with its connections counted and its
liveness held from launch.

**Connections.** A PostgreSQL server takes ``max_connections`` clients (100 by default), and
every process of the fleet holds some: DBOS's pool (DBOS's own default is 20 per process, so
five workers and a producer used up a default server) plus the one DBOS's notification
listener keeps, and one per ``PostgresStore`` the process opens. A ``DBOSWorker`` gives DBOS a
pool of ``pool_size`` connections (the engine is built here, so the size is this option and
nothing else) and *opens them all at launch*, held for the process's life (DBOS's pool would
open them one by one under load anyway, and never close them); DBOS's listener takes one of
them for its own at launch, and the pool opens one more in its place when all are busy:
``pool_size + 1`` in all. So a fleet too large for its server fails at the launch of the
worker that does not fit, with a ``ConfigError`` that says so and what to change, instead of
a worker that stalls later retrying "too many clients". Size a fleet as::

    workers x (pool_size + 1 + its PostgresStores) + other clients <= max_connections

A worker's runs make one system-database round trip at a time each, and DBOS's own threads
(queue polling, notifications) a few more, so ``pool_size`` about the runs it drives at once
(``RunQueue.worker_concurrency``) plus 2 keeps them from waiting for a connection.

**Commits that do not wait for the disk** (``synchronous_commit=False``). DBOS commits each
step's outcome, and a tool step its journal's start, with a flush to disk: about three flushes
per tool call, each a disk's latency (1 to 10 ms on a busy disk) on the run's path. Off, DBOS's
own commits (step outcomes, workflow statuses, queue claims) do not wait for the disk, as
``PostgresStore``'s saves do not: a crash of the PostgreSQL *server* (not of a worker) may
lose their last fraction of a second, and the runs concerned replay from an earlier step, as
if their worker had died then. The journal still records every tool call as started with a
flush before the call runs, and a flush carries every commit made before it on that server:
so no recorded step a call followed can be lost once the call has started, and no call runs
twice. That holds only when the journal store is on the same PostgreSQL server as DBOS's
system database (``database_url``), as in the fleet this module describes. One flush per tool
call instead of about three (``benchmarks/stores.py``, ``dbos-async``).

**No ping before each use.** DBOS's own engine pings a pooled connection each time it takes
one (``pool_pre_ping``): two round trips more per step, a tenth of a DBOS run's. A
``DBOSWorker``'s pool does not: a connection the server closed (a restart, an administrator)
fails its first statement instead, which marks the pool stale (every connection opened
before is replaced on its next use), and DBOS waits and runs that statement again on a fresh
connection, as it does for a connection lost mid-statement (its ``db_retry``): a second or so
once per outage, instead of two round trips on every step.

**Liveness from launch.** The process's ``WorkerLiveness`` claims its lease after
``DBOS(config=...)`` sets the executor id and before ``DBOS.launch()`` starts taking runs,
and gives it up when the worker is destroyed (``agent_fsm.dbos.liveness``).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from dbos import DBOS, DBOSConfig

from agent_fsm.dbos.liveness import WorkerLiveness
from agent_fsm.errors import ConfigError

__all__ = ["DBOSWorker", "too_many_clients"]

_OWN_KEYS = frozenset(
    {
        "name",
        "system_database_url",
        "system_database_engine",
        "sys_db_pool_size",
        "executor_id",
        "dbos_system_schema",
    }
)
_TOO_MANY = "53300"
"""SQLSTATE too_many_connections: the server's, a database's or a role's limit reached."""


def too_many_clients(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is PostgreSQL refusing a client
    because its connections are used up."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found = getattr(current, "sqlstate", None) or getattr(
            getattr(current, "orig", None), "sqlstate", None
        )
        text = str(current).lower()
        if found == _TOO_MANY or "too many clients" in text or "too many connections" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


class DBOSWorker:
    """One process of a DBOS fleet on PostgreSQL (see the module docstring).

    Args:
        name: the DBOS application's name, the same in every process of the fleet.
        database_url: the PostgreSQL database of DBOS's system tables
            (``postgresql://user:pw@host:5432/db``).
        liveness: this process's ``WorkerLiveness`` (on the ``PostgresStore`` the fleet
            shares, with its ``ttl_s``).
        executor_id: this process's DBOS executor id, unique in the fleet; a fresh one
            (host, pid and a random part) when None: the fleet recovers a gone process's
            runs, so a worker need not restart under its old id.
        pool_size: DBOS's connections to the system database (one more is its notification
            listener's): all opened at launch.
        dbos_schema: the schema of DBOS's system tables.
        synchronous_commit: whether DBOS's commits wait for the disk (see the module
            docstring: False needs the journal store on the same server).
        config: more DBOS settings (``DBOSConfig`` keys, such as ``log_level`` or
            ``application_version``); not the ones set from the arguments above.

    Construct every ``DBOSAgent`` before ``launch()`` (or ``with worker:``). ``launch``
    raises ``ConfigError`` when the server has no room for the worker's connections.
    """

    def __init__(
        self,
        name: str,
        database_url: str,
        *,
        liveness: WorkerLiveness,
        executor_id: str | None = None,
        pool_size: int = 8,
        dbos_schema: str = "dbos",
        synchronous_commit: bool = True,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"name must be a non-empty str, got {name!r}")
        if not isinstance(database_url, str) or not database_url.startswith("postgres"):
            raise ConfigError("database_url must be a postgresql:// URL (a fleet shares one)")
        if not isinstance(liveness, WorkerLiveness):
            raise ConfigError(f"liveness must be a WorkerLiveness, got {type(liveness).__name__}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigError(f"pool_size must be an int >= 1, got {pool_size!r}")
        if not isinstance(synchronous_commit, bool):
            raise ConfigError(f"synchronous_commit must be a bool, got {synchronous_commit!r}")
        extra = dict(config or {})
        if clash := sorted(_OWN_KEYS & set(extra)):
            raise ConfigError(f"config sets {clash}: give them as DBOSWorker's arguments")
        self.name = name
        self.pool_size = pool_size
        self.synchronous_commit = synchronous_commit
        self.liveness = liveness
        self.executor_id = executor_id or (f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}")
        self._url = sa.make_url(database_url).set(drivername="postgresql+psycopg")
        self._database_url = database_url
        self._schema = dbos_schema
        self._extra = extra
        self._engine: sa.Engine | None = None

    @property
    def connections(self) -> int:
        """The connections DBOS holds in this process: its pool and its listener's (the
        process's ``PostgresStore``s hold one each besides)."""
        return self.pool_size + 1

    def launch(self) -> None:
        """Open the connections, claim the liveness lease, and launch DBOS.

        Raises:
            ConfigError: the server refused a connection because its connections (or the
                database's or the role's) are used up.
            RunLeased: another live process has this executor id.
        """
        if self._engine is not None:
            return
        options = "-c idle_in_transaction_session_timeout=60000"
        if not self.synchronous_commit:
            options += " -c synchronous_commit=off"
        engine = sa.create_engine(
            self._url,
            pool_size=self.pool_size,
            max_overflow=0,
            pool_timeout=30,
            pool_pre_ping=False,  # DBOS retries a statement on a lost connection
            connect_args={
                "application_name": "dbos_transact",
                "connect_timeout": 10,
                "options": options,
            },
        )
        self._engine = engine
        try:
            held = [engine.connect() for _ in range(self.pool_size)]
            for connection in held:
                connection.close()  # back to the pool, which keeps it open
            config: DBOSConfig = {
                "name": self.name,
                "system_database_url": self._database_url,
                "system_database_engine": engine,
                "executor_id": self.executor_id,
                "dbos_system_schema": self._schema,
                **self._extra,  # type: ignore[typeddict-item]
            }
            DBOS(config=config)
            self.liveness.start()
            DBOS.launch()
        except BaseException as exc:
            self.destroy()
            if too_many_clients(exc):
                raise ConfigError(
                    f"PostgreSQL refused worker {self.executor_id!r} a connection: its"
                    f" connections are used up ({_first_line(exc)}). This worker holds"
                    f" {self.connections} (DBOSWorker(pool_size={self.pool_size}) + 1 for"
                    " DBOS's listener), plus one per PostgresStore: give the workers smaller"
                    " pools, run fewer, or raise the server's max_connections (or the"
                    " database's or role's CONNECTION LIMIT)"
                ) from exc
            raise

    def destroy(self) -> None:
        """Destroy DBOS (its runs stop), give the liveness lease up (the fleet recovers the
        runs left unfinished at once), and close the connections. Idempotent."""
        DBOS.destroy()
        self.liveness.stop()
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def __enter__(self) -> DBOSWorker:
        self.launch()
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


def _first_line(exc: BaseException) -> str:
    """The server's message, as short as it comes (the chain's innermost first line)."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
