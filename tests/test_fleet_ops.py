"""What a fleet of workers does with a shared store (issue 34): take the next runnable run
(``Agent.take_next``, ``enqueue``) and stop a run from outside (``Agent.cancel``), on every
store, with two workers where it matters. Lease expiry is driven by the stores' clocks
(PostgreSQL's is the server's: a short lease, waited for), never by a timed assertion."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from agent_fsm import (
    Agent,
    AgentState,
    CheckpointError,
    CheckpointStore,
    ConfigError,
    MemoryStore,
    Run,
    RunLeased,
    RunStatus,
    StopReason,
    tool,
)
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage
from agent_fsm.state import RunResult, RunState
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import transcript_problems
from agent_fsm.testing.store_kit import ContractClock
from tests.conftest import limits
from tests.stores import Opener


@dataclass
class Fleet:
    """Workers' stores on one test's storage, and the time their leases live by."""

    opener: Opener
    clock: ContractClock | None
    """The stores' clock (memory, sqlite); None for PostgreSQL, whose leases are the
    server's."""
    first: CheckpointStore = field(init=False)

    def __post_init__(self) -> None:
        self.first = self.opener(clock=self.clock)

    @property
    def lease_s(self) -> float:
        """A lease the test lets expire: short only where expiry is on the wall clock."""
        return 30.0 if self.clock is not None else 0.3

    def another(self) -> CheckpointStore:
        """What another worker opens: the same storage (the same store, in memory)."""
        return self.first if self.opener.kind == "memory" else self.opener(clock=self.clock)

    def let_expire(self, run_id: str) -> None:
        """Let the lease on ``run_id`` run out: the clock moves, or the server's time."""
        if self.clock is not None:
            self.clock.advance(self.lease_s + 1)
            return
        store = self.first
        assert isinstance(store, LeaseStore)
        for _ in range(600):
            if store.lease(run_id) is None:
                return
            time.sleep(0.05)
        raise AssertionError(f"the lease of {run_id!r} never expired")


@pytest.fixture
def fleet(open_store: Opener) -> Fleet:
    clock = None if open_store.kind == "postgres" else ContractClock(time.time())
    return Fleet(open_store, clock)


Effects = list[tuple[str, str]]
"""The side effects of the non-idempotent tool: (run id, worker)."""


def worker(
    store: CheckpointStore,
    name: str,
    effects: Effects,
    *,
    lease_s: float = 30.0,
    first_turn: Callable[[ModelRequest], Awaitable[None]] | None = None,
) -> Agent:
    """A worker whose runs call ``record`` (not idempotent) until it answered, then answer
    naming the worker; ``first_turn`` is awaited in the first model call (to hold a run
    there)."""

    @tool
    def record(note: str) -> str:
        """Record a note (a side effect: not idempotent)."""
        effects.append((note, name))
        return f"recorded by {name}"

    async def model(request: ModelRequest) -> ModelResponse | str:
        await asyncio.sleep(0)  # the other worker's run goes on meanwhile
        if request.turn == 1 and first_turn is not None:
            await first_turn(request)
        if not any(isinstance(message, ToolMessage) for message in request.messages):
            return reply("", call("record", note=request.run_id))
        return f"done by {name}"

    return Agent(
        model=FunctionModel(model),
        tools=[record],
        limits=limits(),
        store=store,
        lease_s=lease_s,
        worker_id=name,
    )


async def drain(agent: Agent) -> list[RunResult]:
    """A worker's loop: take the next run and drive it, until none is runnable."""
    results = []
    while (run := agent.take_next()) is not None:
        results.append(await run.run())
    return results


def producer(store: CheckpointStore) -> Agent:
    """What queues the work: an agent of the same configuration, without a lease."""
    return Agent(model=FunctionModel(lambda request: "unused"), tools=[], store=store)


# -- taking the next run ---------------------------------------------------------------------


async def test_two_workers_taking_next_runs_never_take_the_same_one(fleet: Fleet) -> None:
    queue = producer(fleet.first)
    for n in range(8):
        queue.enqueue(f"ticket {n}", run_id=f"ticket-{n}", priority=n % 2)
    effects: Effects = []
    alice = worker(fleet.first, "alice", effects)
    bob = worker(fleet.another(), "bob", effects)
    if fleet.opener.kind == "memory":  # one process: two tasks
        by_alice, by_bob = await asyncio.gather(drain(alice), drain(bob))
    else:  # two threads, each its event loop and its store, as two processes

        def in_a_thread(agent: Agent) -> list[RunResult]:
            return asyncio.run(drain(agent))

        by_alice, by_bob = await asyncio.gather(
            asyncio.to_thread(in_a_thread, alice), asyncio.to_thread(in_a_thread, bob)
        )
    results = by_alice + by_bob
    assert sorted(result.run_id for result in results) == [f"ticket-{n}" for n in range(8)]
    assert sorted(note for note, _ in effects) == [f"ticket-{n}" for n in range(8)]  # once each
    for name, mine in (("alice", by_alice), ("bob", by_bob)):
        for result in mine:
            assert (result.status, result.output) == (RunStatus.COMPLETED, f"done by {name}")
            assert (result.run_id, name) in effects
            assert not transcript_problems(result.messages)
    assert alice.take_next() is None


async def test_the_next_run_is_the_highest_priority_then_the_oldest(fleet: Fleet) -> None:
    queue = producer(fleet.first)
    for run_id, priority in [("later", 0), ("urgent", 5), ("never-mind", -1), ("soon", 0)]:
        queue.enqueue("work", run_id=run_id, priority=priority)
        if fleet.clock is not None:
            fleet.clock.advance(1)
        else:
            time.sleep(0.01)  # created_at is the worker's clock: let it move
    results = await drain(worker(fleet.first, "alice", []))
    assert [result.run_id for result in results] == ["urgent", "later", "soon", "never-mind"]


async def test_a_dead_workers_run_is_taken_once_its_lease_expires(fleet: Fleet) -> None:
    effects: Effects = []
    dead = worker(fleet.first, "alice", effects, lease_s=fleet.lease_s)
    run = dead.start("go", run_id="r1")
    while run.state.state is not AgentState.ACT:
        await run.step()  # then alice dies: nobody renews her lease
    bob = worker(fleet.another(), "bob", effects)
    assert bob.take_next() is None  # her lease is live
    fleet.let_expire("r1")
    taken = bob.take_next()
    assert taken is not None
    assert taken.run_id == "r1"
    result = await taken.run()
    assert (result.output, effects) == ("done by bob", [("r1", "bob")])
    with pytest.raises(RunLeased, match="taken over by worker 'bob'"):
        await run.step()  # alice's Run, had she lived: refused before her tool call
    assert effects == [("r1", "bob")]
    assert not transcript_problems(result.messages)


async def test_a_run_another_agent_cannot_continue_is_set_aside(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of another table (a custom state this agent does not have) is claimed, found
    foreign and left to its lease: the worker takes the next one."""
    fleet.first.save(RunState(run_id="foreign", state="TRIAGE"))
    producer(fleet.first).enqueue("work", run_id="mine", priority=-1)
    alice = worker(fleet.first, "alice", [])
    results = await drain(alice)
    assert [result.run_id for result in results] == ["mine"]
    assert isinstance(fleet.first, LeaseStore)
    held = fleet.first.lease("foreign")
    assert held is not None
    assert held.owner == "alice"  # set aside, under her lease until it expires
    assert "run_set_aside" in capsys.readouterr().out


def test_the_queue_needs_a_store_and_taking_a_lease() -> None:
    model = FunctionModel(lambda request: "x")
    with pytest.raises(ConfigError, match="take_next hands a run to a worker under a lease"):
        Agent(model=model, store=MemoryStore()).take_next()
    with pytest.raises(ConfigError, match=r"enqueue queues runs .* got NoneType"):
        Agent(model=model).enqueue("work")
    store = MemoryStore()
    queue = Agent(model=model, store=store)
    with pytest.raises(ConfigError, match="priority must be an int"):
        queue.enqueue("work", priority=True)
    assert queue.enqueue("work", run_id="r") == "r"
    with pytest.raises(ConfigError, match="run id 'r' is taken"):
        queue.enqueue("again", run_id="r")
    assert store.list_runs()[0].priority == 0


# -- cancelling from outside -----------------------------------------------------------------


class Held:
    """A tool call that waits until released (or cancelled): a run held in ACT."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def __call__(self, request: ModelRequest) -> None:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def test_a_run_another_worker_drives_stops_aborted_and_resumes(fleet: Fleet) -> None:
    """Alice is in a long model call; bob, with a store of his own, cancels: the request
    reaches alice at her next lease renewal (the heartbeat, every lease_s / 3), her model
    call is cancelled and the run ends aborted, resumable with a valid transcript; bob
    resumes it to its end."""
    effects: Effects = []
    held = Held()
    alice = worker(fleet.first, "alice", effects, lease_s=0.6, first_turn=held)
    bob = worker(fleet.another(), "bob", effects)
    driving = asyncio.create_task(alice.run("go", run_id="r1"))
    await asyncio.wait_for(held.started.wait(), 60)
    assert bob.cancel("r1", "the customer withdrew") is True
    stopped = await asyncio.wait_for(driving, 60)
    assert (stopped.status, stopped.stop_reason) == (RunStatus.FAILED, StopReason.ABORTED)
    assert stopped.error == "the customer withdrew"
    assert held.cancelled
    assert effects == []
    assert not transcript_problems(stopped.messages)
    assert [run.cancel_requested for run in fleet.first.list_runs()] == [None]
    resumed = await bob.resume("r1")
    assert (resumed.status, resumed.output) == (RunStatus.COMPLETED, "done by bob")
    assert effects == [("r1", "bob")]
    assert not transcript_problems(resumed.messages)


async def test_a_cancelled_tool_call_in_flight_is_answered_and_not_run_again(
    fleet: Fleet,
) -> None:
    """The cancel comes while alice's tool call is in flight: the call is answered as
    cancelled; the resumed run goes on without calling it again by itself."""
    release = asyncio.Event()
    started = asyncio.Event()

    @tool
    async def slow() -> str:
        """Take a long time."""
        started.set()
        await release.wait()
        return "finished"

    def model(request: ModelRequest) -> ModelResponse | str:
        return reply("", call("slow")) if request.turn == 1 else "done"

    def make(store: CheckpointStore, name: str, lease_s: float) -> Agent:
        return Agent(
            model=FunctionModel(model),
            tools=[slow],
            limits=limits(),
            store=store,
            lease_s=lease_s,
            worker_id=name,
        )

    alice, bob = make(fleet.first, "alice", 0.6), make(fleet.another(), "bob", 30)
    driving = asyncio.create_task(alice.run("go", run_id="r1"))
    await asyncio.wait_for(started.wait(), 60)
    assert bob.cancel("r1") is True
    stopped = await asyncio.wait_for(driving, 60)
    assert (stopped.stop_reason, stopped.error) == (StopReason.ABORTED, "cancelled")
    answers = [m for m in stopped.messages if isinstance(m, ToolMessage)]
    assert len(answers) == 1
    assert "cancel" in answers[0].content
    assert not transcript_problems(stopped.messages)
    assert (await bob.resume("r1")).output == "done"


@pytest.mark.parametrize("from_a_thread", [False, True])
async def test_a_run_this_process_drives_is_aborted_at_once(
    store: CheckpointStore, from_a_thread: bool
) -> None:
    """Cancelled by its own agent (another task, or another thread): the run is aborted
    now, not at the next renewal (an hour away with this lease)."""
    held = Held()
    agent = worker(store, "alice", [], lease_s=3600, first_turn=held)
    driving = asyncio.create_task(agent.run("go", run_id="r1"))
    await asyncio.wait_for(held.started.wait(), 60)
    if from_a_thread:
        assert await asyncio.to_thread(agent.cancel, "r1", "from a thread") is True
    else:
        assert agent.cancel("r1", "from a thread") is True
    stopped = await asyncio.wait_for(driving, 60)
    assert (stopped.stop_reason, stopped.error) == (StopReason.ABORTED, "from a thread")
    assert held.cancelled


async def test_a_run_cancelled_while_nobody_drives_it_stops_when_taken(fleet: Fleet) -> None:
    """Queued runs, and one left mid-run by a dead worker: cancelled while they wait, each
    stops at once (no model call) when a worker takes it, or resumes it; then it can be
    resumed to its end."""
    effects: Effects = []
    queue = producer(fleet.first)
    queue.enqueue("work", run_id="queued", priority=1)
    dead = worker(fleet.first, "alice", effects, lease_s=fleet.lease_s)
    left = dead.start("go", run_id="left")
    while left.state.state is not AgentState.ACT:
        await left.step()
    bob = worker(fleet.another(), "bob", effects)
    assert bob.cancel("queued", "not needed") is True
    assert bob.cancel("left", "not needed either") is True
    taken = bob.take_next()
    assert taken is not None
    assert taken.run_id == "queued"
    stopped = await taken.run()
    assert (stopped.stop_reason, stopped.error, stopped.turns) == (
        StopReason.ABORTED,
        "not needed",
        0,
    )
    fleet.let_expire("left")
    stopped = await bob.resume("left")  # a named resume finds the request too
    assert (stopped.stop_reason, stopped.error) == (StopReason.ABORTED, "not needed either")
    assert effects == []
    assert not transcript_problems(stopped.messages)
    assert bob.take_next() is None  # stopped runs wait for a resume
    for run_id in ("queued", "left"):
        assert (await bob.resume(run_id)).output == "done by bob"
    # "left" was stopped in ACT: its call was answered as aborted, not run, and the model
    # went on from that answer
    assert effects == [("queued", "bob")]


async def test_a_run_that_stopped_is_not_cancelled(store: CheckpointStore) -> None:
    def model(request: ModelRequest) -> ModelResponse | str:
        return reply("", call("ask_user", question="which one?")) if request.turn == 1 else "ok"

    agent = Agent(model=FunctionModel(model), store=store, lease_s=30, worker_id="w")
    paused = await agent.run("go", run_id="paused")
    done = await agent.run("go", run_id="done")  # a second run: turn 1 asks too
    assert paused.stop_reason is StopReason.ASK_USER is done.stop_reason
    assert (await agent.resume("done", "that one")).output == "ok"
    assert agent.cancel("done") is False
    assert agent.cancel("paused") is False
    assert (await agent.resume("paused", "this one")).output == "ok"  # its pause is intact
    with pytest.raises(CheckpointError, match="'nope'"):
        agent.cancel("nope")
    with pytest.raises(ConfigError, match="reason must be a str"):
        agent.cancel("done", reason=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="run_id must be a non-empty str"):
        agent.cancel("")


# -- without leases: the runs this process drives ----------------------------------------------


async def test_an_agent_without_a_store_cancels_the_runs_it_holds() -> None:
    held = Held()
    agent = worker(MemoryStore(), "alice", [], first_turn=held).replace(store=None, lease_s=None)
    driving = asyncio.create_task(agent.run("go", run_id="running"))
    await asyncio.wait_for(held.started.wait(), 60)
    assert agent.cancel("running", "stop it") is True
    stopped = await asyncio.wait_for(driving, 60)
    assert (stopped.stop_reason, stopped.error) == (StopReason.ABORTED, "stop it")
    assert agent.cancel("running") is False  # aborted: a stop, kept for resume
    held.release.set()
    assert (await agent.resume("running")).output == "done by alice"
    assert agent.cancel("running") is False  # finished
    not_yet: Run = agent.start("go", run_id="not-yet")
    assert agent.cancel("not-yet", "before it began") is True
    stopped = await not_yet.run()
    assert (stopped.stop_reason, stopped.turns) == (StopReason.ABORTED, 0)
    reopened = agent.reopen("not-yet")
    assert agent.cancel("not-yet") is False  # at its stop until its first step
    assert (await reopened.run()).output == "done by alice"
    with pytest.raises(CheckpointError, match="'nope'"):
        agent.cancel("nope")


async def test_an_agent_with_a_store_and_no_lease_cancels_only_what_it_drives(
    store: CheckpointStore,
) -> None:
    held = Held()
    agent = worker(store, "alice", [], first_turn=held).replace(lease_s=None)
    driving = asyncio.create_task(agent.run("go", run_id="running"))
    await asyncio.wait_for(held.started.wait(), 60)
    assert agent.cancel("running") is True
    assert (await asyncio.wait_for(driving, 60)).stop_reason is StopReason.ABORTED
    assert agent.cancel("running") is False
    left = agent.start("go", run_id="left")
    del left  # started, never driven, let go: another process's, as far as this one knows
    gc.collect()
    with pytest.raises(ConfigError, match="Give the agents lease_s"):
        agent.cancel("left")
    with pytest.raises(CheckpointError, match="'nope'"):
        agent.cancel("nope")
