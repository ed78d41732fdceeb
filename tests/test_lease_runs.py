"""Leased runs (``Agent(lease_s=...)``) on every store: one driver at a time, a takeover of
an expired lease through ``resume``, and a stale driver that stops without a second side
effect."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from agent_fsm import (
    Agent,
    AgentState,
    CheckpointStore,
    ConfigError,
    MemoryStore,
    ResumeError,
    RunLeased,
    RunStatus,
    tool,
)
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage
from agent_fsm.state import RunState
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import transcript_problems
from tests.conftest import limits


def sending_agent(
    store: CheckpointStore, sent: list[int], *, worker: str, lease_s: float = 30.0
) -> Agent:
    """An agent whose first turn calls the non-idempotent ``send``, then answers "done"."""

    @tool
    def send(n: int) -> str:
        """Send message n (not idempotent)."""
        sent.append(n)
        return f"sent {n}"

    def model(request: ModelRequest) -> ModelResponse | str:
        return reply("", call("send", n=1)) if request.turn == 1 else "done"

    return Agent(
        model=FunctionModel(model),
        tools=[send],
        limits=limits(),
        store=store,
        lease_s=lease_s,
        worker_id=worker,
    )


async def test_a_leased_run_completes_and_releases_its_lease(store: CheckpointStore) -> None:
    sent: list[int] = []
    result = await sending_agent(store, sent, worker="w1").run("go", run_id="r1")
    assert (result.status, result.output, sent) == (RunStatus.COMPLETED, "done", [1])
    assert isinstance(store, LeaseStore)
    assert store.lease("r1") is None


async def test_a_second_worker_is_refused_while_the_first_drives(store: CheckpointStore) -> None:
    sent: list[int] = []
    first = sending_agent(store, sent, worker="first")
    second = sending_agent(store, sent, worker="second")
    run = first.start("go", run_id="r1")
    await run.step()
    with pytest.raises(RunLeased, match="leased to worker 'first'") as refused:
        await second.resume("r1")
    assert refused.value.holder == "first"
    with pytest.raises(ConfigError, match="run id 'r1' is taken"):
        second.start("again", run_id="r1")
    result = await run.run()
    assert (result.output, sent) == ("done", [1])
    with pytest.raises(ResumeError, match="has finished"):
        await second.resume("r1")  # claimed, found finished, released again
    assert isinstance(store, LeaseStore)
    assert store.lease("r1") is None


async def test_a_driver_without_a_lease_cannot_write_a_leased_run(
    store: CheckpointStore,
) -> None:
    sent: list[int] = []
    run = sending_agent(store, sent, worker="first").start("go", run_id="r1")
    await run.step()
    leased = sending_agent(store, sent, worker="first")
    unleased = leased.replace(lease_s=None, worker_id=None)  # the same agent, no lease
    with pytest.raises(RunLeased, match="leased to worker 'first'"):
        await unleased.resume("r1")
    assert (await run.run()).output == "done"


async def test_an_expired_lease_is_taken_over_and_the_stale_driver_stops_without_acting(
    store: CheckpointStore,
) -> None:
    """The first driver stalls just before its tool call, past its lease; the second claims
    the run; the first one's next step is refused before its tool runs (the journal is
    fenced) and raises RunLeased when it would save; the second finishes the run from the
    last checkpoint, running the tool once."""
    sent: list[int] = []
    first = sending_agent(store, sent, worker="first", lease_s=0.2)
    second = sending_agent(store, sent, worker="second")
    stale = first.start("go", run_id="r1")
    while stale.state.state is not AgentState.ACT:
        await stale.step()
    await asyncio.sleep(0.4)  # stalled: not stepping, the heartbeat does not renew
    taking = second.reopen("r1")
    with pytest.raises(RunLeased, match=r"'first'.*taken over by worker 'second'"):
        await stale.step()
    assert sent == []  # the stale driver never ran the tool
    refused = [m for m in stale.state.messages if isinstance(m, ToolMessage)]
    assert "was not run: its call could not be recorded (RunLeased" in refused[-1].content
    taken = await taking.run()
    assert (taken.output, sent) == ("done", [1])
    assert not transcript_problems(taken.messages)
    stored = store.load("r1")
    assert (stored.state, stored.output) == (AgentState.DONE, "done")
    assert stored.messages == list(taken.messages)


async def test_a_stale_driver_that_acts_after_the_takeover_replays_the_journal(
    store: CheckpointStore,
) -> None:
    """When the new holder already ran the call, the stale driver's step finds its result in
    the journal instead of running it again, and stops at its save."""
    sent: list[int] = []
    first = sending_agent(store, sent, worker="first", lease_s=0.2)
    second = sending_agent(store, sent, worker="second")
    stale = first.start("go", run_id="r1")
    while stale.state.state is not AgentState.ACT:
        await stale.step()
    await asyncio.sleep(0.4)
    assert (await second.resume("r1")).output == "done"
    with pytest.raises(RunLeased, match="taken over by worker 'second'"):
        await stale.step()
    assert sent == [1]
    assert store.load("r1").output == "done"


async def test_the_heartbeat_keeps_the_lease_through_a_long_step(store: CheckpointStore) -> None:
    """A tool call much longer than the lease: the heartbeat renews it every lease_s / 3
    while the step is in flight, so another worker is refused all along."""
    lease_s = 1.5
    release = asyncio.Event()

    @tool
    async def slow() -> str:
        """Take a long time."""
        await release.wait()
        return "finally"

    def model(request: ModelRequest) -> ModelResponse | str:
        return reply("", call("slow")) if request.turn == 1 else "done"

    agent = Agent(
        model=FunctionModel(model),
        tools=[slow],
        limits=limits(),
        store=store,
        lease_s=lease_s,
        worker_id="busy",
    )
    other = Agent(model=FunctionModel(model), store=store, lease_s=30, worker_id="other")
    task = asyncio.create_task(agent.run("go", run_id="r1"))
    await asyncio.sleep(2 * lease_s)  # the tool call has run past the lease twice over
    with pytest.raises(RunLeased, match="leased to worker 'busy'"):
        other.reopen("r1")
    release.set()
    result = await asyncio.wait_for(task, 60)
    assert result.output == "done"


async def test_a_cancelled_run_releases_its_lease_at_once(store: CheckpointStore) -> None:
    started = asyncio.Event()

    async def slow(request: ModelRequest) -> str:
        started.set()
        await asyncio.sleep(60)
        return "late"

    agent = Agent(
        model=FunctionModel(slow), limits=limits(), store=store, lease_s=30, worker_id="w"
    )
    task = asyncio.create_task(agent.run("go", run_id="r1"))
    await asyncio.wait_for(started.wait(), 60)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert isinstance(store, LeaseStore)
    assert store.lease("r1") is None


class _NoLeases:
    """A CheckpointStore that cannot lease runs (a third party's, say)."""

    def __init__(self) -> None:
        self._inner = MemoryStore()

    def save(self, state: RunState) -> None:
        self._inner.save(state)

    def create(self, state: RunState) -> bool:
        return self._inner.create(state)

    def load(self, run_id: str) -> RunState:
        return self._inner.load(run_id)

    def exists(self, run_id: str) -> bool:
        return self._inner.exists(run_id)

    def list_runs(self, limit: int | None = None) -> list[object]:
        return list(self._inner.list_runs(limit))

    def delete(self, run_id: str) -> None:
        self._inner.delete(run_id)

    def journal(self, run_id: str) -> ToolJournal:
        return self._inner.journal(run_id)

    def close(self) -> None:
        self._inner.close()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lease_s": 30}, "lease_s needs a store .* got NoneType"),
        ({"lease_s": 30, "store": _NoLeases()}, "lease_s needs a store .* got _NoLeases"),
        ({"lease_s": 0, "store": MemoryStore()}, "ttl_s must be a positive number"),
        ({"lease_s": "30", "store": MemoryStore()}, "ttl_s must be a positive number"),
        ({"worker_id": "", "store": MemoryStore()}, "worker_id must be a non-empty str"),
        ({"worker_id": 7, "store": MemoryStore()}, "worker_id must be a non-empty str"),
    ],
)
def test_lease_options_are_checked_at_construction(options: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Agent(model=FunctionModel(lambda r: "x"), **options)  # type: ignore[arg-type]


def test_a_default_worker_id_names_the_host_and_process() -> None:
    import os
    import socket

    agent = Agent(model=FunctionModel(lambda r: "x"), store=MemoryStore(), lease_s=30)
    store = agent.checkpoints
    assert isinstance(store, LeaseStore)
    run = agent.start("go", run_id="r1")
    lease = store.lease(run.run_id)
    assert lease is not None
    assert lease.owner.startswith(f"{socket.gethostname()}:{os.getpid()}:")
    assert lease.expires_at > time.time()
