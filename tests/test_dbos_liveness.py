"""WorkerLiveness (agent_fsm.dbos.recovery), driven by hand: a dead executor's PENDING runs
are handed back and replayed once, by one live worker; a live executor's are left alone.

Two runs of this process are held inside their non-idempotent tool call, then recorded in
DBOS's tables as another executor's (``dead-1``, ``live-1``): as if two workers had died
(or not) mid-call. Their liveness leases live in a ``MemoryStore`` on a clock the test moves,
and the scans are called directly: nothing waits on real time but the runs themselves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

pytest.importorskip("psycopg")
pytest.importorskip("dbos")

import psycopg
from dbos import DBOS
from psycopg import sql

from agent_fsm import MemoryStore
from agent_fsm.dbos import WorkerLiveness
from agent_fsm.dbos.recovery import LEASE_PREFIX
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage
from agent_fsm.testing import call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import launched
from tests.test_dbos import Tools, durable

UPPER_BOUND_S = 120.0
"""How long the held runs may take to reach their tool call: a limit for a hung test."""


@pytest.fixture(scope="module")
def dbos_schema(postgres_url: str) -> Iterator[str]:
    with launched(postgres_url, "agent_fsm_liveness") as schema:
        yield schema


@pytest.fixture
def journal(dbos_schema: str, postgres_url: str, postgres_schema: str) -> Iterator[PostgresStore]:
    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        yield store


def send_once(request: ModelRequest) -> ModelResponse:
    if any(isinstance(m, ToolMessage) for m in request.messages):
        return reply("done")
    return reply("", call("send", step=1))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_a_dead_executors_runs_are_recovered_once_and_a_live_ones_left_alone(
    journal: PostgresStore, dbos_schema: str, postgres_url: str
) -> None:
    tools = Tools()
    tools.hold = asyncio.Event()
    agent = durable(journal, send_once, tools)
    for run_id in ("dead-run", "live-run"):
        await agent.enqueue("Do it.", run_id=run_id)
    async with asyncio.timeout(UPPER_BOUND_S):
        while len(tools.sent) < 2:  # both inside send, which holds them
            await asyncio.sleep(0.01)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for run_id, executor in (("dead-run", "dead-1"), ("live-run", "live-1")):
            conn.execute(
                sql.SQL(
                    "UPDATE {}.workflow_status SET executor_id = %s WHERE workflow_uuid = %s"
                ).format(sql.Identifier(dbos_schema)),
                (executor, run_id),
            )

    clock = Clock()
    leases = MemoryStore(clock=clock)
    dead = leases.claim(LEASE_PREFIX + "dead-1", "dbos", 10.0)
    live = leases.claim(LEASE_PREFIX + "live-1", "dbos", 10.0)
    clock.now += 8.0
    leases.renew(live)  # live-1 renews; dead-1 has stopped renewing
    clock.now += 4.0
    assert leases.lease(dead.run_id) is None
    assert leases.lease(live.run_id) is not None

    first, second = WorkerLiveness(leases, ttl_s=10.0), WorkerLiveness(leases, ttl_s=10.0)
    assert await asyncio.to_thread(first.recover_dead) == ["dead-run"]
    assert await asyncio.to_thread(second.recover_dead) == []  # nothing left to recover
    assert await asyncio.to_thread(first.recover_dead) == []
    assert (first.recovered, second.recovered) == (["dead-run"], [])

    # The dead run is replayed here: its send started (journal) and is not run again.
    recovered = await (await agent.retrieve("dead-run")).result()
    check_invariants(recovered, limits=agent.agent.limits, bound=agent.agent.bound)
    answer = next(m for m in recovered.messages if isinstance(m, ToolMessage))
    assert "outcome of this call to 'send' is unknown" in answer.content
    assert recovered.output == "done"
    # The live one is still its executor's, untouched.
    status = await DBOS.get_workflow_status_async("live-run")
    assert status is not None
    assert (status.status, status.executor_id) == ("PENDING", "live-1")
    assert tools.sent == [1, 1]

    tools.release()  # the held calls return: the live run ends; the dead one's stale
    # execution finds its run recovered, and adopts the outcome the replay recorded
    live_result = await (await agent.retrieve("live-run")).result()
    assert live_result.output == "done"
    assert (await (await agent.retrieve("dead-run")).result()).output == "done"
    assert tools.sent == [1, 1]
