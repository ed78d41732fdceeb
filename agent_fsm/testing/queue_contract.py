"""The fleet part of the lease contract (``durable.queue`` states it): the next runnable run
claimed by priority and age, never by two workers, and cancel requests carried to a run's
driver on its claims, saves and renewals. Run on a store that leases, queues and cancels
runs, skipped for one that does not. ``CheckpointStoreContract`` includes it; it is not meant
to be used alone."""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Protocol

import pytest

from agent_fsm.durable.queue import MAX_PRIORITY, RunCancels, RunQueue
from agent_fsm.errors import CheckpointError, ConfigError, RunLeased
from agent_fsm.messages import UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import AgentState
from agent_fsm.testing.store_kit import (
    BAD_ID_NAMES,
    BAD_IDS,
    LeasingStore,
    StoreContractBase,
    refuses,
)

__all__ = ["QueueContract"]


class FleetStore(LeasingStore, RunQueue, RunCancels, Protocol):
    """A store that leases, queues and cancels runs: what these tests run on."""


def queued(run_id: str, text: str = "work") -> RunState:
    """A run nobody has stepped: its input waits to be observed."""
    return RunState(run_id=run_id, pending_input=[text])


def moved(run_id: str, text: str) -> RunState:
    """A run some way in (not stopped), told apart by what it holds."""
    return RunState(run_id=run_id, messages=[UserMessage(content=text)], state=AgentState.THINK)


def stopped(run_id: str, state: AgentState = AgentState.DONE) -> RunState:
    return RunState(run_id=run_id, state=state, output="over")


class QueueContract(StoreContractBase):
    """``claim_next``, ``enqueue`` and ``cancel``."""

    def open_fleet(self, *, shared: bool = False) -> FleetStore:
        """A store that leases, queues and cancels runs; the test is skipped for one that
        does not."""
        store = self.open_leasing(shared=shared)
        if not (isinstance(store, RunQueue) and isinstance(store, RunCancels)):
            pytest.skip("the store does not queue and cancel runs (no RunQueue, RunCancels)")
        return store

    def take_all(self, store: FleetStore, owner: str = "w") -> list[str]:
        taken = []
        while (lease := store.claim_next(owner, 60)) is not None:
            assert lease.owner == owner
            taken.append(lease.run_id)
        return taken

    def test_the_next_run_is_the_highest_priority_then_the_oldest(self) -> None:
        store = self.open_fleet()
        assert store.claim_next("w", 60) is None  # an empty store
        for run_id, priority in [("low", -5), ("first", 0), ("urgent", 9), ("second", 0)]:
            assert store.enqueue(queued(run_id), priority=priority)
            self.clock.advance(1)
        store.save(moved("saved", "saved without a lease"))  # priority 0, the newest
        self.clock.advance(1)
        assert store.enqueue(queued("tied-b"), priority=3)
        assert store.enqueue(queued("tied-a"), priority=3)  # same time: by run id
        assert self.take_all(store) == [
            "urgent",
            "tied-a",
            "tied-b",
            "first",
            "second",
            "saved",
            "low",
        ]
        priorities = {run.run_id: run.priority for run in store.list_runs()}
        assert priorities == {
            "low": -5,
            "first": 0,
            "urgent": 9,
            "second": 0,
            "saved": 0,
            "tied-b": 3,
            "tied-a": 3,
        }

    def test_the_claim_is_the_runs_lease(self) -> None:
        store = self.open_fleet()
        store.enqueue(queued("r"))
        lease = store.claim_next("alice", 60)
        assert lease is not None
        assert (lease.run_id, lease.owner, lease.token, lease.ttl_s) == ("r", "alice", 1, 60.0)
        assert lease.cancel_requested is None
        live = store.lease("r")
        assert live is not None
        assert (live.owner, live.token) == ("alice", lease.token)
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            store.claim("r", "bob", 60)
        store.save(moved("r", "alice's"), lease=lease)
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            store.save(moved("r", "unleased"))
        assert store.claim_next("bob", 60) is None

    def test_a_run_left_mid_run_is_taken_again_and_its_old_driver_fenced(self) -> None:
        store = self.open_fleet()
        store.enqueue(queued("died"))
        store.enqueue(queued("gave-up"))
        dead = store.claim("died", "alice", self.expiring_ttl_s)
        store.save(moved("died", "alice's"), lease=dead)
        gave_up = store.claim("gave-up", "carol", 60)
        store.save(moved("gave-up", "carol's"), lease=gave_up)
        assert store.claim_next("bob", 60) is None  # both leases live
        store.release(gave_up)
        assert self.take_all(store, "bob") == ["gave-up"]
        self.let_expire(store, dead)
        taken = store.claim_next("bob", 60)
        assert taken is not None
        assert (taken.run_id, taken.token) == ("died", dead.token + 1)
        with pytest.raises(RunLeased, match="taken over by worker 'bob'"):
            store.save(moved("died", "stale"), lease=dead)
        assert store.load("died") == moved("died", "alice's")

    def test_a_stopped_run_is_never_taken(self) -> None:
        store = self.open_fleet()
        for run_id, state in [("done", AgentState.DONE), ("failed", AgentState.ERROR)]:
            lease = store.claim(run_id, "alice", 60)
            store.save(stopped(run_id, state), lease=lease)
            store.release(lease)
        store.save(stopped("never-leased", AgentState.ERROR))
        assert store.claim_next("bob", 60) is None

    def test_enqueue_creates_a_new_run_only(self) -> None:
        store = self.open_fleet()
        assert store.enqueue(queued("r", "first"), priority=2) is True
        assert store.enqueue(queued("r", "second"), priority=7) is False
        assert store.load("r") == queued("r", "first")
        assert [run.priority for run in store.list_runs()] == [2]
        store.claim("leased", "alice", 60)
        with pytest.raises(RunLeased, match="leased to worker 'alice'"):
            store.enqueue(queued("leased"))
        assert not store.exists("leased")
        store.delete("r")  # its priority goes with it
        assert store.enqueue(queued("r", "again")) is True
        assert [run.priority for run in store.list_runs()] == [0]

    @pytest.mark.parametrize("priority", [True, 1.5, "1", None, MAX_PRIORITY + 1, -(2**31) - 1])
    def test_a_priority_is_an_int_of_32_bits(self, priority: object) -> None:
        store = self.open_fleet()
        with pytest.raises(ConfigError, match="priority must be an int"):
            store.enqueue(queued("r"), priority=priority)  # type: ignore[arg-type]
        assert not store.exists("r")
        for extreme in (MAX_PRIORITY, -MAX_PRIORITY - 1):
            assert store.enqueue(queued(f"r{extreme}"), priority=extreme)

    def test_a_cancel_reaches_the_driver_on_its_next_save_and_renewal(self) -> None:
        store = self.open_fleet()
        lease = store.claim("r", "alice", 60)
        store.create(queued("r"), lease=lease)
        renewed = store.save(moved("r", "one"), lease=lease)
        assert renewed is None or renewed.cancel_requested is None
        assert store.renew(lease).cancel_requested is None
        assert store.cancel("r", "the user left") is True
        assert store.cancel("r", "a second reason") is True  # the first one stays
        assert store.renew(lease).cancel_requested == "the user left"
        renewed = store.save(moved("r", "two"), lease=lease)
        assert renewed is not None
        assert (renewed.run_id, renewed.token) == ("r", lease.token)
        assert renewed.cancel_requested == "the user left"
        assert [run.cancel_requested for run in store.list_runs()] == ["the user left"]
        renewed = store.save(stopped("r", AgentState.ERROR), lease=lease)  # aborted
        assert renewed is not None
        assert renewed.cancel_requested is None  # a stop clears the request
        assert [run.cancel_requested for run in store.list_runs()] == [None]
        assert store.renew(lease).cancel_requested is None
        assert store.cancel("r", "too late") is False
        assert store.renew(lease).cancel_requested is None

    def test_a_run_cancelled_while_nobody_drives_it_is_stopped_by_whoever_claims_it(
        self,
    ) -> None:
        store = self.open_fleet()
        store.enqueue(queued("next"))
        store.enqueue(queued("named"))
        assert store.cancel("next", "not wanted") is True
        assert store.cancel("named", "not wanted either") is True
        claimed = store.claim("named", "bob", 60)
        assert claimed.cancel_requested == "not wanted either"
        taken = store.claim_next("alice", 60)
        assert taken is not None
        assert (taken.run_id, taken.cancel_requested) == ("next", "not wanted")
        store.save(stopped("next", AgentState.ERROR), lease=taken)
        store.release(taken)
        assert store.claim("next", "carol", 60).cancel_requested is None

    def test_a_run_that_stopped_cannot_be_cancelled(self) -> None:
        store = self.open_fleet()
        store.save(stopped("done"))
        store.save(stopped("paused-for-an-answer", AgentState.DONE))
        assert store.cancel("done", "x") is False
        assert store.cancel("paused-for-an-answer", "x") is False
        assert [run.cancel_requested for run in store.list_runs()] == [None, None]
        with pytest.raises(CheckpointError, match="'nope'"):
            store.cancel("nope", "x")

    def test_a_cancels_reason_is_kept_as_text_every_store_holds(self) -> None:
        store = self.open_fleet()
        store.enqueue(queued("r"))
        assert store.cancel("r", "half \ud83d and nul\x00 " + "x" * 2000) is True
        lease = store.claim("r", "alice", 60)
        assert lease.cancel_requested == "half \ufffd and nul\ufffd " + "x" * 984
        with pytest.raises(ConfigError, match="reason must be a str"):
            store.cancel("r", 7)  # type: ignore[arg-type]

    @pytest.mark.parametrize("bad", BAD_IDS, ids=BAD_ID_NAMES)
    def test_an_id_some_store_could_not_keep_is_refused_by_the_queue(self, bad: str) -> None:
        store = self.open_fleet()
        store.enqueue(queued("r"))
        calls = {
            "enqueue": lambda: store.enqueue(queued(bad)),
            "claim_next(worker id)": lambda: store.claim_next(bad, 60),
            "cancel": lambda: store.cancel(bad, "x"),
        }
        assert [name for name, call in calls.items() if not refuses(call)] == []
        assert store.lease("r") is None
        with pytest.raises(ConfigError, match="ttl_s must be a positive number"):
            store.claim_next("alice", 0)
        assert store.lease("r") is None

    # -- several stores on one storage (shares_storage) ------------------------------------------

    def test_of_many_workers_taking_next_runs_no_two_take_the_same(self) -> None:
        first = self.open_fleet()
        stores = [first, *(self.open_fleet(shared=True) for _ in range(5))]
        for n in range(30):
            first.enqueue(queued(f"job-{n:02}"), priority=n % 3)
        barrier = threading.Barrier(len(stores))

        def work(store: FleetStore, n: int) -> list[str]:
            barrier.wait()
            return self.take_all(store, f"worker-{n}")

        with concurrent.futures.ThreadPoolExecutor(len(stores)) as pool:
            taken = list(pool.map(work, stores, range(len(stores))))
        every = [run_id for runs in taken for run_id in runs]
        assert sorted(every) == [f"job-{n:02}" for n in range(30)]  # each once
        for n, runs in enumerate(taken):
            for run_id in runs:
                lease = first.lease(run_id)
                assert lease is not None
                assert lease.owner == f"worker-{n}"

    def test_a_cancel_from_another_store_reaches_the_driver(self) -> None:
        first, second = self.open_fleet(), self.open_fleet(shared=True)
        first.enqueue(queued("r"))
        lease = first.claim_next("alice", 60)
        assert lease is not None
        first.save(moved("r", "alice's"), lease=lease)  # the store knows the run now
        assert second.cancel("r", "from elsewhere") is True
        renewed = first.save(moved("r", "alice's, later"), lease=lease)
        assert renewed is not None
        assert renewed.cancel_requested == "from elsewhere"
        # a store that never saw the run (a worker's new process) learns it too
        renewed = second.save(moved("r", "alice's, in a new process"), lease=lease)
        assert renewed is not None
        assert renewed.cancel_requested == "from elsewhere"
        assert second.renew(lease).cancel_requested == "from elsewhere"
