"""Runs that live in a durable store (``Agent(store=...)``), leased or not.

``Stored``: every transition is checkpointed (``CheckpointStore.save``, which writes only what
is new) and every tool call journalled, so that a run whose process died is continued from
its last checkpoint without running a side effect twice. A new run is created atomically
(``CheckpointStore.create``): of two starts under one id, exactly one gets it.

``Leased`` (``Agent(lease_s=...)``): the same, under a lease, so that several workers can share
the store. A run is claimed before it is created or loaded, so what is loaded is the last
checkpoint, which the previous holder can no longer change; every save and every tool-call
start is fenced by the lease (``durable.leases``), a heartbeat renews it while a step is in
flight (``run.leasing``), and it is released when the run stops or its driver gives up.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import Lease, LeaseStore
from agent_fsm.errors import CheckpointError, ResumeError
from agent_fsm.logs import get_logger
from agent_fsm.run.leasing import RunLease
from agent_fsm.run.residence import RunKeeper, Timekeeping, taken
from agent_fsm.state import RunState
from agent_fsm.table import StopReason

__all__ = ["Leased", "Stored"]


class Stored:
    """The runs of an agent with a durable store, checkpointed after every transition."""

    __slots__ = ("store", "time")

    def __init__(self, store: CheckpointStore, time: Timekeeping | None = None) -> None:
        self.store = store
        self.time = time or Timekeeping()

    def holds(self, run_id: str) -> bool:
        return self.store.exists(run_id)

    def admit(self, state: RunState) -> RunKeeper:
        if not self.store.create(state):
            raise taken(state.run_id)
        return _StoredKeeper(self.store, self.time, state.run_id)

    @contextlib.contextmanager
    def readmit(self, run_id: str) -> Iterator[tuple[RunState, RunKeeper]]:
        yield self.store.load(run_id), _StoredKeeper(self.store, self.time, run_id)

    def how_it_ended(self, run_id: str) -> StopReason | None:
        return None  # a durable store keeps every run it was given


class _StoredKeeper:
    """One run of a ``Stored`` residence."""

    __slots__ = ("_run_id", "_store", "journal", "time")

    def __init__(self, store: CheckpointStore, time: Timekeeping, run_id: str) -> None:
        self._store = store
        self._run_id = run_id
        self.time = time
        self.journal: ToolJournal | None = store.journal(run_id)

    def activated(self, abort: Callable[[str], None]) -> None:
        return None

    def claim_stop(self, state: RunState) -> None:
        _check_still_where_reopened(self._store, state)

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        return work

    def saved(self, state: RunState) -> None:
        self._store.save(state)

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        self._store.save(state)

    def release(self) -> None:
        return None


def _check_still_where_reopened(store: CheckpointStore, state: RunState) -> None:
    """The stored checkpoint must still be the one this copy was reopened from: another copy
    of the same reopening (a double-clicked Approve) that took its resume row first has saved
    past it. Checked and then saved with no await between, so of two copies in one process
    exactly one goes on; across processes, a run lease is what makes it exact.

    Raises:
        ResumeError: the stored run has moved on since this copy was reopened.
    """
    run_id = state.run_id
    if len(store.load(run_id).trace) != len(state.trace):
        raise ResumeError(f"run {run_id} has moved on since it was reopened: reopen it again")


class Leased:
    """The runs of an agent whose workers share a store and lease its runs."""

    __slots__ = ("_leases", "_ttl_s", "_worker_id", "store", "time")

    def __init__(
        self,
        store: LeaseStore,
        *,
        ttl_s: float,
        worker_id: str,
        time: Timekeeping | None = None,
    ) -> None:
        assert isinstance(store, CheckpointStore)  # the agent checked it leases and stores
        self.store: CheckpointStore = store
        self._leases = store
        self._ttl_s = ttl_s
        self._worker_id = worker_id
        self.time = time or Timekeeping()

    def holds(self, run_id: str) -> bool:
        return self.store.exists(run_id)

    def admit(self, state: RunState) -> RunKeeper:
        with self._claimed(state.run_id) as lease:
            if not self._leases.create(state, lease=lease):
                raise taken(state.run_id)
            return self._keeper(state.run_id, lease)

    @contextlib.contextmanager
    def readmit(self, run_id: str) -> Iterator[tuple[RunState, RunKeeper]]:
        with self._claimed(run_id) as lease:
            yield self.store.load(run_id), self._keeper(run_id, lease)

    def how_it_ended(self, run_id: str) -> StopReason | None:
        return None

    @contextlib.contextmanager
    def _claimed(self, run_id: str) -> Iterator[Lease]:
        """Claim ``run_id``'s lease for the run about to be made from the store; release it
        when that fails."""
        lease = self._leases.claim(run_id, self._worker_id, self._ttl_s)
        try:
            yield lease
        except BaseException:
            with contextlib.suppress(CheckpointError):
                self._leases.release(lease)
            raise

    def _keeper(self, run_id: str, lease: Lease) -> RunKeeper:
        log = get_logger("agent_fsm").bind(run_id=run_id)
        return _LeasedKeeper(self.store, RunLease(self._leases, lease, log), self.time, run_id)


class _LeasedKeeper:
    """One run of a ``Leased`` residence: saved and journalled under its lease."""

    __slots__ = ("_lease", "_store", "journal", "time")

    def __init__(
        self, store: CheckpointStore, lease: RunLease, time: Timekeeping, run_id: str
    ) -> None:
        self._store = store
        self._lease = lease
        self.time = time
        self.journal: ToolJournal | None = lease.journal(run_id)

    def activated(self, abort: Callable[[str], None]) -> None:
        self._lease.start()

    def claim_stop(self, state: RunState) -> None:
        _check_still_where_reopened(self._store, state)

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        return self._lease.during_step(work)

    def saved(self, state: RunState) -> None:
        self._lease.save(state)

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        self._lease.save(state)

    def release(self) -> None:
        self._lease.release()
