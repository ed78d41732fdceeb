"""Recovery scans (agent_fsm.dbos.recovery), driven by hand: a gone executor's PENDING runs
are handed back and replayed once, by one live worker; a live executor's are left alone; an
executor never seen is given its chance (a probation of ``ttl_s``) before it counts as gone.
And this process losing its own lease (agent_fsm.dbos.liveness): an execution begun under
it stops before its next call.

Runs of this process are held inside their non-idempotent tool call, then recorded in DBOS's
tables as another executor's (``dead-1``, ``live-1``, ...): as if workers had died (or not)
mid-call. Their liveness leases live in a ``MemoryStore`` on a clock the test moves, and the
scans are called directly: nothing waits on real time but the runs themselves.
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

from agent_fsm import Agent, MemoryStore, StopReason, tool
from agent_fsm.dbos import WorkerLiveness
from agent_fsm.dbos.liveness import Admission, process_liveness
from agent_fsm.dbos.pausing import save_stop
from agent_fsm.dbos.private import recover_executors
from agent_fsm.dbos.recovery import LEASE_PREFIX, register
from agent_fsm.durable.journal import CallStatus
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage, UserMessage
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.dbos_worker import PROCESS_LEASES, launched
from tests.test_dbos import Tools, durable, step_names, two_turns

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out

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
    for executor in ("dead-1", "live-1"):  # as a WorkerLiveness does at its first claim
        register(leases, executor)
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


async def test_an_executor_never_seen_is_given_ttl_s_before_its_runs_are_recovered(
    journal: PostgresStore, dbos_schema: str, postgres_url: str
) -> None:
    """``ghost-1`` never held a lease: the first scan starts its probation, scans within
    ``ttl_s`` leave it alone, and the first scan after recovers its run. ``late-1``, never
    seen either, claims its lease during its probation: it is alive, and never recovered."""
    tools = Tools()
    tools.hold = asyncio.Event()
    agent = durable(journal, send_once, tools)
    for run_id in ("ghost-run", "late-run"):
        await agent.enqueue("Do it.", run_id=run_id)
    async with asyncio.timeout(UPPER_BOUND_S):
        while len(tools.sent) < 2:  # both inside send, which holds them
            await asyncio.sleep(0.01)
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        for run_id, executor in (("ghost-run", "ghost-1"), ("late-run", "late-1")):
            conn.execute(
                sql.SQL(
                    "UPDATE {}.workflow_status SET executor_id = %s WHERE workflow_uuid = %s"
                ).format(sql.Identifier(dbos_schema)),
                (executor, run_id),
            )

    clock = Clock()
    leases = MemoryStore(clock=clock)
    scanner = WorkerLiveness(leases, ttl_s=10.0)
    assert await asyncio.to_thread(scanner.recover_dead) == []  # both probations start
    clock.now += 9.0
    assert await asyncio.to_thread(scanner.recover_dead) == []  # within them
    late = leases.claim(LEASE_PREFIX + "late-1", "dbos", 10.0)  # late-1 shows itself
    register(leases, "late-1")
    clock.now += 2.0
    assert await asyncio.to_thread(scanner.recover_dead) == ["ghost-run"]
    leases.renew(late)
    clock.now += 30.0  # late-1 goes silent now: it was seen, so it is gone at once
    assert await asyncio.to_thread(scanner.recover_dead) == ["late-run"]

    tools.hold = None
    tools.release()
    for run_id in ("ghost-run", "late-run"):
        result = await (await agent.retrieve(run_id)).result()
        check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
        assert result.output == "done"
    assert tools.sent == [1, 1]  # the replays answered "outcome unknown": nothing twice


async def test_an_execution_whose_lease_was_lost_stops_before_its_next_call(
    journal: PostgresStore,
) -> None:
    """This process's lease is taken over while one of its runs is inside ``send`` (as after
    a stall past ``ttl_s``), and the process claims a fresh one. The execution begun under
    the lost lease records its ``send`` (its end, in the journal: it is made without a step)
    and stops before its next call (the model's): it is cancelled, and records nothing more.
    The run, handed back to the queue, is replayed here under the fresh lease, and
    ``DBOSAgent.run()``'s caller gets the replay's result."""
    tools = Tools()
    tools.hold = asyncio.Event()
    model = FunctionModel(two_turns)
    agent = durable(journal, model, tools)
    caller = asyncio.create_task(agent.run("Do it.", run_id="lost-1"))
    async with asyncio.timeout(UPPER_BOUND_S):
        while not tools.sent:
            await asyncio.sleep(0.01)
    name = LEASE_PREFIX + DBOS.executor_id
    held = PROCESS_LEASES.lease(name)
    assert held is not None
    PROCESS_LEASES.release(held)  # it expired: a worker recovering this process claims it
    taken = PROCESS_LEASES.claim(name, "recovery:elsewhere", 60.0)
    PROCESS_LEASES.release(taken)
    async with asyncio.timeout(UPPER_BOUND_S):  # this process claims a fresh lease
        while (fresh := PROCESS_LEASES.lease(name)) is None or fresh.token <= taken.token:
            await asyncio.sleep(0.01)
    calls = len(model.requests)

    tools.release()  # the stale execution's send returns and is recorded; then it stops
    tools.hold = None
    recorded = journal.journal("lost-1")
    async with asyncio.timeout(UPPER_BOUND_S):  # send's and lookup's ends, in the journal
        while any(
            (entry := recorded.lookup(f"call:{n}")) is None
            or entry.status is not CallStatus.FINISHED
            for n in range(2)
        ):
            await asyncio.sleep(0.01)
    assert await step_names("lost-1") == []  # no step: every call kept in the journal
    assert await asyncio.to_thread(recover_executors, [DBOS.executor_id]) == ["lost-1"]
    result = await caller
    check_invariants(result, limits=agent.agent.limits, bound=agent.agent.bound)
    assert (result.output, result.stop_reason) == ("done", StopReason.FINAL_ANSWER)
    assert tools.sent == [1, 2]  # each send once
    assert len(model.requests) == calls + 2  # the stale execution asked the model nothing


async def test_an_execution_whose_lease_was_lost_never_saves_its_stop(
    journal: PostgresStore,
) -> None:
    """Found by the chaos test (issue 34): a worker SIGSTOPped as its run stopped at an
    approval woke after the fleet had replayed the run, the approval had resumed it and it
    had finished; its late save of the old stop overwrote the finished checkpoint, which
    then showed the run waiting for an approval for ever. The save of a stop passes the
    fence first: an execution superseded meanwhile stops instead (and only this save is
    made; a fresh execution's saves)."""
    liveness = await asyncio.to_thread(process_liveness, journal)
    fresh = await liveness.admit()
    agent = Agent(model=FunctionModel(lambda request: reply("done")))
    state = agent.start("Pay Bob.", run_id="stale-stop").state
    stale = Admission(liveness, fresh.token - 1, None)  # admitted under a lease since lost
    with pytest.raises(asyncio.CancelledError):
        await save_stop(journal, state, stale)
    assert not journal.exists("stale-stop")
    await save_stop(journal, state, fresh)
    assert journal.load("stale-stop").messages == state.messages


async def test_a_replayed_save_of_an_old_stop_leaves_the_run_where_it_is(
    journal: PostgresStore,
) -> None:
    """Found by the chaos test's full profile (issue 34): a worker killed between saving a
    run's first stop and DBOS recording that step; the stop was approved and resumed to the
    end meanwhile; the fleet then replayed the first workflow, whose save step (unrecorded)
    ran again and put the old stop back over the finished checkpoint. A save of a stop
    behind the stored checkpoint is not made."""
    liveness = await asyncio.to_thread(process_liveness, journal)
    admission = await liveness.admit()
    agent = durable(journal, approve_then_answer, [transfer])
    paused = await agent.run("Pay Bob.", run_id="old-stop")
    assert paused.pending is not None
    first_stop = journal.load("old-stop")
    done = await agent.resume("old-stop", approvals=True, pause=paused.pending.pause)
    assert done.output == "done"
    await save_stop(journal, first_stop, admission)  # the replay's save
    assert journal.load("old-stop").messages == list(done.messages)
    await save_stop(journal, journal.load("old-stop"), admission)  # the same point: saved
    assert journal.load("old-stop").messages == list(done.messages)


@tool(requires_approval=True)
def transfer(amount: int) -> str:
    """Transfer money (a person approves each call)."""
    return f"sent {amount}"


def approve_then_answer(request: ModelRequest) -> ModelResponse:
    if any(isinstance(m, UserMessage) and "Decisions" in str(m.content) for m in request.messages):
        return reply("done")
    return reply("", call("transfer", amount=5))
