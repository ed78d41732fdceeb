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
A leased residence also takes the next runnable run of the store (``take_next``: the store's
``RunQueue.claim_next``) and cancels any run of the store, wherever it is driven (``cancel``:
the store's ``RunCancels.cancel``, which the run's driver learns of from its next save or
renewal, and, for a run this process drives, its abort at once: ``run.live``).

``Stored`` cancels only the runs this process drives: without leases nothing tells another
process's driver, or whoever resumes a run next, that it was cancelled.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator

from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.journal import ToolJournal, settle
from agent_fsm.durable.leases import Lease, LeaseStore
from agent_fsm.durable.queue import RunCancels, RunQueue
from agent_fsm.errors import CheckpointError, ConfigError, ResumeError
from agent_fsm.logs import get_logger
from agent_fsm.run.leasing import RunLease
from agent_fsm.run.live import LiveRuns, RunStop
from agent_fsm.run.residence import RunKeeper, Timekeeping, taken
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, StopReason

__all__ = ["Leased", "Stored"]


class Stored:
    """The runs of an agent with a durable store, checkpointed after every transition."""

    __slots__ = ("live", "store", "time")

    def __init__(self, store: CheckpointStore, time: Timekeeping | None = None) -> None:
        self.store = store
        self.time = time or Timekeeping()
        self.live = LiveRuns()

    def holds(self, run_id: str) -> bool:
        return self.store.exists(run_id)

    def nested(self, time: Timekeeping) -> Stored:
        """Where the sub-agents of this residence's runs live: the same store, their own
        time (``run.delegation``)."""
        return Stored(self.store, time)

    def admit(self, state: RunState) -> RunKeeper:
        if not self.store.create(state):
            raise taken(state.run_id)
        return _StoredKeeper(self, state.run_id, RunStop())

    @contextlib.contextmanager
    def readmit(self, run_id: str) -> Iterator[tuple[RunState, RunKeeper]]:
        state = self.store.load(run_id)
        stop = RunStop(at_stop=state.state in TERMINAL_STATES)
        yield state, _StoredKeeper(self, run_id, stop)

    def how_it_ended(self, run_id: str) -> StopReason | None:
        return None  # a durable store keeps every run it was given

    def cancel(self, run_id: str, reason: str) -> bool:
        """A run this process drives is aborted at once; a run that stopped is not
        (False); any other run of the store is one this agent cannot reach (no lease tells
        its driver, or whoever resumes it next): ``ConfigError``."""
        if self.live.request(run_id, reason):
            return True
        if self.store.load(run_id).state in TERMINAL_STATES:
            return False
        raise ConfigError(
            f"run {run_id!r} has not stopped, and this process does not drive it: without"
            " leases nothing would tell its driver (or whoever resumes it) that it was"
            " cancelled. Give the agents lease_s (then cancel reaches every run of the"
            " store), or abort the run where it is driven (Run.abort)"
        )


class _StoredKeeper:
    """One run of a ``Stored`` residence."""

    __slots__ = ("_home", "_run_id", "_stop", "_store", "journal", "time")

    def __init__(self, home: Stored, run_id: str, stop: RunStop) -> None:
        self._home = home
        self._store = store = home.store
        self._run_id = run_id
        self._stop = stop
        self.time = home.time
        self.journal: ToolJournal | None = store.journal(run_id)
        home.live.add(run_id, stop)

    def activated(self, abort: Callable[[str], None]) -> None:
        self._stop.activated(abort)

    def claim_stop(self, state: RunState) -> None:
        _check_still_where_reopened(self._store, state)
        self._stop.left_stop()

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        return work

    def saved(self, state: RunState) -> None:
        self._store.save(state)

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        self._store.save(state)

    def release(self) -> None:
        settle(self.journal)  # what its journal held back for its next save
        self._home.live.remove(self._run_id, self._stop)


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

    __slots__ = ("_leases", "_ttl_s", "_worker_id", "live", "store", "time")

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
        self.live = LiveRuns()

    def holds(self, run_id: str) -> bool:
        return self.store.exists(run_id)

    def nested(self, time: Timekeeping) -> Leased:
        """Where the sub-agents of this residence's runs live: the same store, leased by
        the same worker, their own time (``run.delegation``)."""
        return Leased(self._leases, ttl_s=self._ttl_s, worker_id=self._worker_id, time=time)

    def admit(self, state: RunState) -> RunKeeper:
        with self._claimed(state.run_id) as lease:
            if not self._leases.create(state, lease=lease):
                raise taken(state.run_id)
            return self._keeper(state, lease)

    @contextlib.contextmanager
    def readmit(self, run_id: str) -> Iterator[tuple[RunState, RunKeeper]]:
        with self._claimed(run_id) as lease:
            state = self.store.load(run_id)
            yield state, self._keeper(state, lease)

    def how_it_ended(self, run_id: str) -> StopReason | None:
        return None

    def take_next(self) -> tuple[RunState, RunKeeper] | None:
        """The next runnable run of the store (``durable.queue``), claimed for this worker
        and loaded, with its keeper; None when no run is runnable. A run that cannot be
        loaded (``CheckpointError``) is logged and left to its lease: no worker takes it
        again before the lease expires, so one broken run cannot hold the queue up.

        Raises:
            ConfigError: the store queues no runs (it is no ``RunQueue``).
        """
        queue = self._leases
        if not isinstance(queue, RunQueue):
            raise ConfigError(
                f"take_next needs a store that queues runs (SQLiteStore, PostgresStore,"
                f" MemoryStore: durable.queue.RunQueue), got {type(queue).__name__}"
            )
        while (lease := queue.claim_next(self._worker_id, self._ttl_s)) is not None:
            try:
                state = self.store.load(lease.run_id)
            except CheckpointError as exc:
                self.set_aside(lease.run_id, exc)
                continue
            return state, self._keeper(state, lease)
        return None

    def set_aside(self, run_id: str, why: Exception) -> None:
        """A run taken (``take_next``) that this worker cannot continue: logged, and left
        to its lease (see ``take_next``)."""
        get_logger("agent_fsm").bind(run_id=run_id).warning(
            "run_set_aside", worker_id=self._worker_id, error=str(why)
        )

    def cancel(self, run_id: str, reason: str) -> bool:
        """The store records the request for the run's driver, wherever it runs, or whoever
        takes it next (``RunCancels``); a run this process drives is also aborted at once.
        A store that takes no requests reaches only the runs this process drives.

        Raises:
            ConfigError: the store takes no requests and this process does not drive the
                run.
        """
        store = self._leases
        if isinstance(store, RunCancels):
            if not store.cancel(run_id, reason):
                return False  # it stopped
            self.live.request(run_id, reason)  # driven here: abort it now
            return True
        if self.live.request(run_id, reason):
            return True
        raise ConfigError(
            f"run {run_id!r}: the store takes no cancel requests (durable.queue.RunCancels),"
            f" got {type(store).__name__}, and this process does not drive the run"
        )

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

    def _keeper(self, state: RunState, lease: Lease) -> RunKeeper:
        log = get_logger("agent_fsm").bind(run_id=state.run_id)
        stop = RunStop(at_stop=state.state in TERMINAL_STATES)
        return _LeasedKeeper(self, RunLease(self._leases, lease, log), state.run_id, stop)


class _LeasedKeeper:
    """One run of a ``Leased`` residence: saved and journalled under its lease."""

    __slots__ = ("_home", "_lease", "_run_id", "_stop", "_store", "journal", "time")

    def __init__(self, home: Leased, lease: RunLease, run_id: str, stop: RunStop) -> None:
        self._home = home
        self._store = home.store
        self._lease = lease
        self._run_id = run_id
        self._stop = stop
        self.time = home.time
        self.journal: ToolJournal | None = lease.journal(run_id)
        home.live.add(run_id, stop)

    def activated(self, abort: Callable[[str], None]) -> None:
        self._stop.activated(abort)
        self._lease.start(abort)

    def claim_stop(self, state: RunState) -> None:
        """As ``Stored``'s; but under a lease, a run found moved on was moved by the worker
        that took the lease over while this one stalled: that is ``RunLeased``, which a
        worker's loop expects, not a ``ResumeError``."""
        try:
            _check_still_where_reopened(self._store, state)
        except ResumeError:
            self._lease.confirm()  # raises RunLeased when taken over
            raise
        self._stop.left_stop()

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        return self._lease.during_step(work)

    def saved(self, state: RunState) -> None:
        self._lease.save(state)

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        self._lease.save(state)

    def release(self) -> None:
        settle(self.journal)  # before the lease goes: whoever takes the run over reads it
        self._lease.release()
        self._home.live.remove(self._run_id, self._stop)
