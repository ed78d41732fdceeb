"""Where a run lives, behind one seam: the engine never asks which kind it has.

The engine (``run.engine``) asks one ``RunKeeper`` per run for what it needs of the place the
run lives: its time (``Timekeeping``: the clock, the backoff sleep, the random numbers, the
deadline timer) and its tool journal; and it tells the keeper when the run is activated,
when a stop is about to be left, when a step is in flight, after each step (``saved``), when
the run stopped and when its driver lets go. Saving a checkpoint is what a keeper does after a
step, at one place, as Burr's persisters and LangGraph's checkpointers are called by the loop.
The agent asks its ``Residence`` for a keeper: for a new run (``admit``) and for a run it
reopens (``readmit``), and asks it to stop a run from outside (``cancel``: the runs it holds
in this process through ``run.live``, and for a leased residence every run of the store).

The kinds:

- ``InProcess`` (an agent without a store): runs live in this process. A run that stops
  resumable (paused, aborted, timed out) is kept in a memory store so that ``Agent.resume``
  works; one that cannot be resumed is dropped, and only how it ended is remembered. A
  cancel reaches the runs it holds (started or reopened, not yet let go).
- ``Stored`` and ``Leased`` (``run.stored``): every transition is checkpointed in a durable
  store and every tool call journalled, under a lease several workers share for ``Leased``.
- ``agent_fsm.dbos``'s keeper: the run is a DBOS workflow whose steps DBOS records; its time
  is the workflow's recorded time.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
from agent_fsm.durable.encoding import unknown_run
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.errors import CheckpointError, ConfigError, ResumeError
from agent_fsm.run.live import LiveRuns, RunStop
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, StopReason
from agent_fsm.watchdog import watchdog_for

__all__ = [
    "ArmDeadline",
    "InProcess",
    "InProcessRuns",
    "Residence",
    "RunKeeper",
    "Cancellable",
    "Timekeeping",
    "finished",
    "loop_deadline",
    "taken",
]


class Cancellable(Protocol):
    """A deadline timer as ``Timekeeping.arm_deadline`` returns it (an ``asyncio.TimerHandle``
    is one)."""

    def cancel(self) -> object: ...


ArmDeadline = Callable[[float, Callable[[], None]], Cancellable | None]
"""Starts a run's deadline timer: ``arm(seconds, time_up)`` (``Timekeeping.arm_deadline``)."""


class _LoopDeadline:
    """A run's deadline on its event loop's watchdog (``agent_fsm.watchdog``)."""

    __slots__ = ("_time_up", "_watchdog", "when")

    def __init__(self, seconds: float, time_up: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        self.when = loop.time() + seconds
        self._time_up = time_up
        self._watchdog = watchdog = watchdog_for(loop)
        watchdog.watch(self, loop)

    def expire(self) -> None:
        self._time_up()

    def cancel(self) -> None:
        self._watchdog.forget(self)


def loop_deadline(seconds: float, time_up: Callable[[], None]) -> Cancellable:
    """The default deadline timer: ``time_up`` is called from the running event loop once
    ``seconds`` have passed, unless cancelled first. One timer per loop serves every run's
    deadline and every tool call's (``agent_fsm.watchdog``): a run holds no timer handle and
    no copied context while it runs, and leaves no cancelled timer in the loop's heap when
    it ends before its deadline."""
    return _LoopDeadline(seconds, time_up)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timekeeping:
    """The time of the place a run lives in."""

    clock: Callable[[], float] = time.monotonic
    """The run's clock: its elapsed time, and the ``time_is_up`` guard, read it."""
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    """Awaited for the backoff before a model retry."""
    random: Callable[[], float] = random.random
    """The jitter of the model-retry backoff (``run.thinking.backoff_s``): one number in
    [0, 1) per retry, drawn in the run's task. A run that is replayed needs the same numbers
    again (``agent_fsm.dbos`` seeds one generator per run)."""
    arm_deadline: ArmDeadline = loop_deadline
    """Starts the run's deadline timer, once per activation: ``arm_deadline(seconds,
    time_up)`` must call ``time_up`` from the run's event loop once ``seconds`` have passed,
    and return a handle whose ``cancel()`` stops it, or None when there is nothing to stop.
    ``time_up`` marks the run timed out and cancels the work in flight. A keeper that keeps
    the deadline on a clock of its own returns None and never calls it (``agent_fsm.dbos``
    enforces it inside each step against the run's recorded clock)."""


@runtime_checkable
class RunKeeper(Protocol):
    """Where one run lives, as its engine sees it (one keeper per ``Run``)."""

    time: Timekeeping
    journal: ToolJournal | None
    """Records every tool call before and after it runs, so that a run continued after a
    crash does not run a side effect twice; None where nothing outlives the process."""

    def activated(self, abort: Callable[[str], None]) -> None:
        """The run's first step of this activation is about to be taken. ``abort(reason)``
        stops the run as ``Run.abort`` does (at its next transition, ``aborted``, resumable):
        a keeper that learns the run was asked to stop from outside (another process, a
        person) calls it, from the run's event loop."""
        ...

    def claim_stop(self, state: RunState) -> None:
        """A reopened run is about to take its resume row: only one copy of one reopening
        may (a double-clicked Approve must not carry a pause out twice).

        Raises:
            ResumeError: another copy took it first.
        """
        ...

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        """``work``, one state's work, as it must be awaited here (a leased run renews its
        lease meanwhile)."""
        ...

    def saved(self, state: RunState) -> None:
        """The run took a transition that did not stop it: keep it as it now is.

        Raises:
            RunLeased: the run's lease was taken over; nothing was written.
        """
        ...

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        """The run stopped with ``stop_reason`` (``resumable``: some resume row of its table
        may leave that stop)."""
        ...

    def release(self) -> None:
        """The run's driver lets go of it (it stopped, or gave up); never raises."""
        ...


@runtime_checkable
class Residence(Protocol):
    """Where the runs of one agent live, as the agent sees it."""

    time: Timekeeping
    store: CheckpointStore
    """Where the agent's runs can be read (``Agent.checkpoints``)."""

    def holds(self, run_id: str) -> bool:
        """The id names a run this residence holds (or is resuming): not free for a new
        run."""
        ...

    def admit(self, state: RunState) -> RunKeeper:
        """Take in a new run that has not taken a step: its id is claimed here, so that a
        second start under it, in this process or another, is refused.

        Raises:
            ConfigError: the id is taken (``taken``).
            RunLeased: another worker leased the id first.
        """
        ...

    def readmit(self, run_id: str) -> contextlib.AbstractContextManager[tuple[RunState, RunKeeper]]:
        """``with residence.readmit(run_id) as (state, keeper):`` the run, loaded to be
        continued, and its keeper; what the block raises lets the run go again.

        Raises:
            CheckpointError: no such run.
            ResumeError: the run finished and was not kept, or is being resumed.
            RunLeased: another worker holds the run.
        """
        ...

    def how_it_ended(self, run_id: str) -> StopReason | None:
        """How a run that is no longer held ended, where that is remembered."""
        ...

    def cancel(self, run_id: str, reason: str) -> bool:
        """Ask whoever drives ``run_id`` to stop it at its next transition, as ``Run.abort``
        does (ERROR ``aborted``, resumable), or whoever takes it next to stop it at once;
        True when asked, False when the run has stopped (nothing is done then).

        Raises:
            CheckpointError: no such run.
            ConfigError: the run is one this residence cannot reach (``Stored``: a run this
                process does not drive).
        """
        ...


def taken(run_id: str) -> ConfigError:
    """The error for a new run under an id a run already has."""
    return ConfigError(
        f"run id {run_id!r} is taken: the store holds that run. Resume it (agent.resume), "
        "delete it (agent.checkpoints.delete), or choose a new id"
    )


def finished(run_id: str, how: str) -> ResumeError:
    """The error for resuming a run that ended for good (``how``: its stop reason)."""
    return ResumeError(
        f"run {run_id} has finished ({how}); only a run that paused (ask_user, approvals), was "
        "aborted, timed out, stopped on a transient model error or was interrupted can be "
        "resumed"
    )


class InProcessRuns:
    """What an in-process residence cannot say about the runs it does not hold.

    A run resumed from the in-process store leaves it until it stops again (so a second
    resume of the same pause, a double-clicked Approve, finds nothing to carry out twice).
    This remembers how the latest dropped runs ended, and which runs are out being resumed,
    so that ``resume`` says "it finished" or "it is being resumed" (``ResumeError``) instead
    of "no such run". Bounded: past ``keep`` ended ids the oldest are forgotten.
    """

    __slots__ = ("_ended", "_keep", "_resuming")

    def __init__(self, keep: int = 10_000) -> None:
        self._keep = keep
        self._ended: OrderedDict[str, StopReason] = OrderedDict()
        self._resuming: set[str] = set()

    def ended(self, run_id: str, stop_reason: StopReason) -> None:
        self._resuming.discard(run_id)
        self._ended[run_id] = stop_reason
        self._ended.move_to_end(run_id)
        if len(self._ended) > self._keep:
            self._ended.popitem(last=False)

    def how_it_ended(self, run_id: str) -> StopReason | None:
        return self._ended.get(run_id)

    def resuming(self, run_id: str) -> None:
        self._resuming.add(run_id)

    def stopped(self, run_id: str) -> None:
        """The run stopped again (and is back in the store, if it can be resumed)."""
        self._resuming.discard(run_id)

    def is_resuming(self, run_id: str) -> bool:
        return run_id in self._resuming


class InProcess:
    """The runs of an agent without a store: they live in this process; the ones that stop
    resumable wait in a memory store for ``Agent.resume``."""

    __slots__ = ("live", "runs", "store", "time")

    def __init__(self, time: Timekeeping | None = None) -> None:
        self.time = time or Timekeeping()
        self.store: CheckpointStore = MemoryStore()
        self.runs = InProcessRuns()
        self.live = LiveRuns()

    def holds(self, run_id: str) -> bool:
        return self.store.exists(run_id) or self.runs.is_resuming(run_id)

    def admit(self, state: RunState) -> RunKeeper:
        if self.holds(state.run_id):
            raise taken(state.run_id)
        return _InProcessKeeper(self, state.run_id)

    def cancel(self, run_id: str, reason: str) -> bool:
        """A run held here (started or reopened, and not let go) is aborted at once; a run
        waiting at a stop, or that ended, is not (False); an id never seen is no run."""
        if self.live.request(run_id, reason):
            return True
        if self.store.exists(run_id) or self.runs.how_it_ended(run_id) is not None:
            return False
        raise unknown_run(run_id)

    @contextlib.contextmanager
    def readmit(self, run_id: str) -> Iterator[tuple[RunState, RunKeeper]]:
        try:
            state = self.store.load(run_id)
        except CheckpointError:
            if self.runs.is_resuming(run_id):
                raise ResumeError(f"run {run_id} is already being resumed") from None
            ended = self.runs.how_it_ended(run_id)
            if ended is None:
                raise
            raise finished(run_id, ended.value) from None
        yield state, _InProcessKeeper(self, run_id, at_stop=state.state in TERMINAL_STATES)

    def how_it_ended(self, run_id: str) -> StopReason | None:
        return self.runs.how_it_ended(run_id)


class _InProcessKeeper:
    """One run of an ``InProcess`` residence: nothing is saved while it runs; a stop it can
    be resumed from is kept in the residence's store, and taken out again when a resume
    takes its resume row."""

    __slots__ = ("_home", "_run_id", "_stop", "journal", "time")

    def __init__(self, home: InProcess, run_id: str, *, at_stop: bool = False) -> None:
        self._home = home
        self._run_id = run_id
        self.time = home.time
        self.journal: ToolJournal | None = None
        self._stop = RunStop(at_stop=at_stop)
        home.live.add(run_id, self._stop)

    def activated(self, abort: Callable[[str], None]) -> None:
        self._stop.activated(abort)

    def claim_stop(self, state: RunState) -> None:
        """The stop leaves the store as its resume row is taken, until the run stops again,
        so a second resume of it finds nothing."""
        store, run_id = self._home.store, self._run_id
        if not store.exists(run_id):
            raise ResumeError(f"run {run_id} is already being resumed")
        if len(store.load(run_id).trace) != len(state.trace):
            raise ResumeError(f"run {run_id} has moved on since it was reopened: reopen it again")
        store.delete(run_id)
        self._home.runs.resuming(run_id)
        self._stop.left_stop()

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        return work

    def saved(self, state: RunState) -> None:
        return None

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        store, runs = self._home.store, self._home.runs
        if resumable:
            store.save(state)
            runs.stopped(state.run_id)
            return
        if store.exists(state.run_id):
            store.delete(state.run_id)
        runs.ended(state.run_id, stop_reason)

    def release(self) -> None:
        self._home.live.remove(self._run_id, self._stop)
