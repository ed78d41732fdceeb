"""A DBOS worker's connections (issue 34, point 6): ``DBOSWorker(pool_size=...)`` is what it
holds, all opened at launch, and a server with no room left for them is a clear
``ConfigError`` at launch, not a worker stalling later on "too many clients".

The server's limit is played by a role of the test's own with a ``CONNECTION LIMIT`` (the
same refusal, SQLSTATE 53300, as a full ``max_connections``; superusers are exempt from
both, so the test's usual role cannot be limited), owning a database of its own; both are
dropped afterwards. DBOS runs in this process (one per process), launched by each test.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from agent_fsm import Agent, ConfigError
from agent_fsm.dbos import DBOSAgent, DBOSWorker, WorkerLiveness
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.testing import FunctionModel, reply

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out

LIMIT = 6
"""The role's connections: a store's 1, and DBOS's ``pool_size + 1``."""


@pytest.fixture
def limited_url(postgres_url: str) -> Iterator[str]:
    """A database owned by a role that may hold ``LIMIT`` connections: its URL."""
    name = f"pool_{uuid.uuid4().hex[:12]}"
    password = secrets.token_hex(12)
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} CONNECTION LIMIT {}").format(
                sql.Identifier(name), sql.Literal(password), sql.Literal(LIMIT)
            )
        )
        admin.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(*[sql.Identifier(name)] * 2))
        try:
            server = conninfo_to_dict(postgres_url)
            host, port = server.get("host", "127.0.0.1"), server.get("port", 5432)
            yield f"postgresql://{name}:{password}@{host}:{port}/{name}"
        finally:
            admin.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def connections_of(url: str, admin_url: str) -> int:
    """The connections ``url``'s role holds, counted by the test's own (unlimited) role."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE usename = %s",
            (conninfo_to_dict(url)["user"],),
        ).fetchone()
    return int(found[0]) if found else 0


def connections_once_settled(url: str, admin_url: str, expected: int) -> int:
    """The connections ``url``'s role holds once its closed ones are gone from the server.

    A client closes a connection without waiting for its server process to exit, and
    ``pg_stat_activity`` lists the process until it has: a count read just after a close may
    still include it. So the count is read again (for up to 30 s, far beyond a backend's
    exit) until it is ``expected``; a connection truly left open still fails the test.
    """
    deadline = time.monotonic() + 30.0
    while (count := connections_of(url, admin_url)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return count


def agent_on(store: PostgresStore) -> DBOSAgent:
    agent = Agent(model=FunctionModel(lambda request: reply(f"hello from {request.run_id}")))
    return DBOSAgent(agent, journal=store, name=f"pools_{uuid.uuid4().hex[:8]}")


def test_a_worker_holds_its_pool_and_its_listener_and_nothing_more(
    limited_url: str, postgres_url: str
) -> None:
    with PostgresStore(limited_url, schema="agent_fsm") as store:
        agent = agent_on(store)
        worker = DBOSWorker(
            "pools", limited_url, liveness=WorkerLiveness(store, ttl_s=5.0), pool_size=LIMIT - 2
        )
        assert worker.connections == LIMIT - 1
        with worker:
            result = asyncio.run(agent.run("Hello.", run_id="pooled-1"))
            assert result.output == "hello from pooled-1"
            assert connections_of(limited_url, postgres_url) <= 1 + worker.connections
        assert connections_once_settled(limited_url, postgres_url, 1) == 1  # the store's


def test_a_worker_that_does_not_fit_is_refused_at_launch_with_what_to_change(
    limited_url: str, postgres_url: str
) -> None:
    with PostgresStore(limited_url, schema="agent_fsm") as store:
        agent_on(store)
        worker = DBOSWorker(
            "pools", limited_url, liveness=WorkerLiveness(store, ttl_s=5.0), pool_size=8
        )
        with pytest.raises(ConfigError, match=r"connections are used up") as refused:
            worker.launch()
        message = str(refused.value)
        assert "too many connections" in message  # the server's own words
        assert "DBOSWorker(pool_size=8)" in message
        assert "max_connections" in message
        assert (
            connections_once_settled(limited_url, postgres_url, 1) == 1
        )  # it let go of what it had opened
        assert store.lease("executor:" + worker.executor_id) is None


def test_a_worker_commits_without_waiting_for_the_disk_only_when_asked(
    limited_url: str, postgres_url: str
) -> None:
    """``DBOSWorker(synchronous_commit=False)``: DBOS's connections commit without waiting
    for the disk; by default they wait (the server's setting). Runs go on either way, and the
    journal's start of a call still waits for the disk (``PostgresStore`` asks for it)."""
    with PostgresStore(limited_url, schema="agent_fsm") as store:
        agent = agent_on(store)
        for wait, setting in ((True, "on"), (False, "off")):
            worker = DBOSWorker(
                "pools",
                limited_url,
                liveness=WorkerLiveness(store, ttl_s=5.0),
                pool_size=LIMIT - 2,
                synchronous_commit=wait,
            )
            with worker:
                run_id = f"commits-{setting}"
                assert asyncio.run(agent.run("Hello.", run_id=run_id)).output == (
                    f"hello from {run_id}"
                )
                assert worker._engine is not None  # the engine DBOS was given
                with worker._engine.connect() as conn:
                    shown = conn.exec_driver_sql("SHOW synchronous_commit").scalar()
                assert shown == setting
        with pytest.raises(ConfigError, match="synchronous_commit must be a bool"):
            DBOSWorker(
                "pools",
                limited_url,
                liveness=WorkerLiveness(store),
                synchronous_commit="off",  # type: ignore[arg-type]
            )


def test_a_worker_pings_no_connection_and_outlives_the_loss_of_them_all(
    limited_url: str, postgres_url: str
) -> None:
    """A ``DBOSWorker``'s pool does not ping a connection before each use (two round trips
    per step saved): a run makes no ping, and once the server has closed every connection
    DBOS holds, the next run still ends (DBOS runs the failed statement again on a fresh
    connection)."""
    with PostgresStore(limited_url, schema="agent_fsm") as store:
        agent = agent_on(store)
        worker = DBOSWorker(
            "pools", limited_url, liveness=WorkerLiveness(store, ttl_s=5.0), pool_size=LIMIT - 2
        )
        with worker:
            assert worker._engine is not None  # the engine DBOS was given
            dialect = worker._engine.dialect
            pings: list[object] = []
            ping = dialect.do_ping

            def counted(connection: object) -> bool:
                pings.append(connection)
                return ping(connection)

            dialect.do_ping = counted  # type: ignore[method-assign]
            assert asyncio.run(agent.run("Hello.", run_id="unpinged-1")).output == (
                "hello from unpinged-1"
            )
            assert pings == []
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                closed = admin.execute(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE usename = %s AND application_name = 'dbos_transact'",
                    (conninfo_to_dict(limited_url)["user"],),
                ).fetchone()
            assert closed is not None
            assert closed[0] >= LIMIT - 2
            assert asyncio.run(agent.run("Hello.", run_id="unpinged-2")).output == (
                "hello from unpinged-2"
            )
            assert pings == []
