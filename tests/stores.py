"""Checkpoint stores for the tests: every kind behind one fixture, and PostgreSQL for them.

``store`` is a fresh store of each kind (memory, sqlite, postgres), for the suites that run
agents on every store (the stores' own contract is ``tests/test_store_contract.py``'s);
``open_store`` opens stores of one kind on one test's storage, another one as a second process
would (``open_shared_store``: sqlite and postgres). A test asks for ``postgres_url`` /
``postgres_schema`` for PostgreSQL itself.

Where PostgreSQL comes from, in this order:

1. ``AGENT_FSM_POSTGRES_URL``, when set (``.ci/run`` starts a cluster with
   ``scripts/postgres.sh`` and sets it before ``make test``);
2. otherwise a throwaway cluster that this test session starts through the same script the
   first time a test needs it, when PostgreSQL's server programs are installed. One per
   session: with pytest-xdist, the worker that first needs it starts it under a file lock
   and the others read its URL; the script's watcher stops it once the session's main
   process has exited (however it ended), so no cluster outlives the session;
3. otherwise the tests that need it are skipped, saying why, or fail when ``CI`` is set, so
   that CI can never pass by skipping them.

Every test gets a schema of its own (``postgres_schema``), dropped after it: workers and
tests share the server, never tables.
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent_fsm import CheckpointStore, MemoryStore, SQLiteStore

if TYPE_CHECKING:
    from agent_fsm.durable.postgres import PostgresStore

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "postgres.sh"
URL_VARIABLE = "AGENT_FSM_POSTGRES_URL"

STORES = ["memory", "sqlite", "postgres"]
SHARED = ["sqlite", "postgres"]
"""The stores several processes can open at once."""

Clock = Callable[[], float]


def _session_cluster() -> tuple[str | None, str]:
    """The URL of this session's cluster, started on first call; or None and why not."""
    if shutil.which("pg_ctl") is None and not glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"):
        return None, "PostgreSQL's server programs (pg_ctl, initdb) are not installed"
    main = os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()
    home = Path(tempfile.gettempdir()) / f"agent-fsm-pytest-pg-{main}"
    home.mkdir(exist_ok=True)
    with (home / "lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        url, failed = home / "url", home / "failed"
        if not url.exists() and not failed.exists():
            command = ["bash", str(SCRIPT), "start", "--no-install", "--dir", str(home)]
            started = subprocess.run(
                [*command, "--watch", str(main)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if started.returncode != 0:
                failed.write_text(f"{SCRIPT.name} start failed: {started.stderr.strip()[-500:]}")
        if failed.exists():
            return None, failed.read_text()
        return url.read_text().strip(), ""


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """A PostgreSQL database for the tests (see the module's docstring)."""
    url = os.environ.get(URL_VARIABLE)
    try:
        import psycopg  # noqa: F401  # the extra agent-fsm[postgres]
    except ImportError:
        url, reason = None, "psycopg is not installed (pip install -e '.[postgres]')"
    else:
        reason = ""
        if not url:
            url, reason = _session_cluster()
    if url:
        return url
    message = (
        f"PostgreSQL tests need a database: {reason}. Set {URL_VARIABLE} (eval"
        ' "$(scripts/postgres.sh start)"), or install PostgreSQL for the tests to start one'
    )
    if os.environ.get("CI"):
        pytest.fail(f"CI runs every store test. {message}", pytrace=False)
    pytest.skip(message)


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A schema name of this test's own, dropped (with what was made in it) afterwards."""
    import psycopg
    from psycopg import sql

    name = f"test_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


@pytest.fixture
def admin(postgres_url: str, postgres_schema: str) -> Iterator[Any]:
    """A connection of its own to the test's schema, as a database administrator has
    (autocommit: each statement it sends is committed at once)."""
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (postgres_schema,))
        yield conn


@pytest.fixture
def pg(postgres_url: str, postgres_schema: str) -> Iterator[PostgresStore]:
    """A ``PostgresStore`` on the test's schema, closed afterwards."""
    from agent_fsm.durable.postgres import PostgresStore

    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        yield store


def open_location(kind: str, *location: str, clock: Clock | None = None) -> CheckpointStore:
    """A store of ``kind`` on ``location`` (what ``Opener.location`` gives a process)."""
    extra = {} if clock is None else {"clock": clock}
    if kind == "memory":
        return MemoryStore(**extra)
    if kind == "sqlite":
        return SQLiteStore(location[0], **extra)
    from agent_fsm.durable.postgres import PostgresStore

    url, schema = location
    return PostgresStore(url, schema=schema, **extra)


class Opener:
    """Opens stores of one kind on one test's storage (``opener(clock=None)``), and closes
    them after the test; ``location`` is what another process needs to open it too."""

    def __init__(self, kind: str, location: tuple[str, ...]) -> None:
        self.kind = kind
        self.location = location
        self.opened: list[CheckpointStore] = []

    def __call__(self, clock: Clock | None = None) -> CheckpointStore:
        self.opened.append(open_location(self.kind, *self.location, clock=clock))
        return self.opened[-1]

    def close(self) -> None:
        for store in self.opened:
            store.close()


def _opener(kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    if kind == "postgres":
        location: tuple[str, ...] = (
            request.getfixturevalue("postgres_url"),
            request.getfixturevalue("postgres_schema"),
        )
    else:
        location = (str(tmp_path / "runs.sqlite3"),)
    opener = Opener(kind, location)
    yield opener
    opener.close()


@pytest.fixture(params=STORES)
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """Opens stores of one kind on this test's storage; each is closed after the test."""
    yield from _opener(request.param, request, tmp_path)


@pytest.fixture(params=SHARED)
def open_shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    """``open_store`` for the kinds several processes share (each store its own
    connection)."""
    yield from _opener(request.param, request, tmp_path)


@pytest.fixture
def store(open_store: Opener) -> CheckpointStore:
    """A fresh store of each kind."""
    return open_store()
