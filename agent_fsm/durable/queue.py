"""A fleet's work: runs queued for workers to take, and runs cancelled from outside.

Workers that share a store (``Agent(lease_s=...)``) need not scan every stored run to find
work: ``RunQueue.claim_next`` hands each the next runnable run under a fresh lease, in one
atomic step, and ``RunCancels.cancel`` asks whoever drives a run (or drives it next) to
stop it. The contract every store keeps that offers them (``agent_fsm.testing``'s
``CheckpointStoreContract`` checks it, ours included):

- **Runnable**: a run that has not stopped (its last save is in neither DONE nor ERROR) and
  on which no lease is live: queued by ``enqueue`` (or saved without a lease) and never
  leased since, or left mid-run by a worker whose lease expired (it died or stalled) or was
  released (it gave up). A run that stopped, even one that could be resumed (paused for an
  answer, aborted, timed out), is never taken: its stop waits for whoever has its answer
  (``Agent.resume``), and a cancelled run must not start again by itself.
- **Order**: the highest ``priority`` first (an int given to ``enqueue``; 0 for a run
  created otherwise), then the oldest (``created_at``, the time of its first save), then
  the run id.
- **The claim is the lease**: ``claim_next`` takes the run's lease as ``RunLeases.claim``
  does (the run's token goes up by one), atomically with choosing the run, so two workers
  never get the same run; ``None`` means nothing is runnable now.
- **Cancel**: ``cancel(run_id, reason)`` records the request on a run that has not stopped
  and returns True; on a run that stopped it records nothing and returns False (there is
  nothing to stop: a paused run is cancelled by not answering it). The request reaches the
  run's driver without a round trip of its own: every fenced write and renewal of the run
  (``LeasedWrites.save``, ``RunLeases.renew``) and every claim of it (``claim``,
  ``claim_next``) returns the lease with ``Lease.cancel_requested`` set, read in the same
  statement or transaction; the engine then aborts the run (``Run.abort``: ERROR
  ``aborted``, resumable). A save of a stop clears the request, so a cancelled run that is
  resumed later runs on. The first reason given stays until then.

``MemoryQueue`` keeps the priorities and requests of ``MemoryStore``'s runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agent_fsm.durable.leases import Lease
from agent_fsm.errors import ConfigError
from agent_fsm.messages import clean_text
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES

__all__ = [
    "MAX_PRIORITY",
    "STOPPED_SQL",
    "MemoryQueue",
    "RunCancels",
    "RunQueue",
    "check_priority",
    "check_reason",
]

MAX_PRIORITY = 2**31 - 1
"""Priorities are 32-bit signed integers (PostgreSQL's ``integer``), so every store orders
the same values the same way."""

STOPPED_SQL = "(" + ", ".join(f"'{state.value}'" for state in sorted(TERMINAL_STATES)) + ")"
"""The stopped states as an SQL list, ``('DONE', 'ERROR')``: a run whose ``state`` column is
not in it has not stopped. The stores' indexes of runnable runs are partial on that very
text, so the planner matches them to ``claim_next``'s query."""


@runtime_checkable
class RunQueue(Protocol):
    """What hands a fleet its work: a producer queues runs (``enqueue``) and each worker
    claims the next runnable one (``claim_next``), under a lease (see the module's
    contract)."""

    def enqueue(self, state: RunState, *, priority: int = 0) -> bool:
        """``RunOpener.create`` with a priority: save the first checkpoint of a new run, for
        a worker to take (``claim_next``), unless the store holds a run with its id (then
        save nothing and return False). Atomic, as ``create``.

        Raises:
            ConfigError: a priority that is not an int of 32 bits (``check_priority``).
            RunLeased: a lease on the id is live.
        """
        ...

    def claim_next(self, owner: str, ttl_s: float) -> Lease | None:
        """Claim, for worker ``owner``, the lease of the next runnable run (the module's
        contract says which and in what order), or return None when no run is runnable.
        The lease is ``claim``'s: for ``ttl_s`` seconds, the run's token one up, with
        ``cancel_requested`` when someone cancelled the run meanwhile.

        Raises:
            ConfigError: a bad worker id or ``ttl_s`` (``leases.check_id``, ``check_ttl``).
            CheckpointError: the store cannot be read or written.
        """
        ...


@runtime_checkable
class RunCancels(Protocol):
    """What stops a run from outside (``Agent.cancel``, ``agent-fsm cancel``, a UI): the
    request waits in the store for the run's driver, or whoever takes the run next."""

    def cancel(self, run_id: str, reason: str) -> bool:
        """Ask the run's driver to stop it at its next checkpoint or lease renewal, before
        another model or tool call starts (ERROR ``aborted``, resumable); True when the
        request was recorded, False when the run had stopped already (nothing is recorded
        then). See the module's contract.

        Raises:
            CheckpointError: no such run.
            ConfigError: a run id no store could keep, a reason that is not a str.
        """
        ...


def check_priority(priority: object) -> int:
    """``priority``, if it is an int every store keeps (32 bits, signed).

    Raises:
        ConfigError: not an int (a bool is not one), or out of range.
    """
    if (
        isinstance(priority, bool)
        or not isinstance(priority, int)
        or not -MAX_PRIORITY - 1 <= priority <= MAX_PRIORITY
    ):
        raise ConfigError(
            f"a run's priority must be an int from {-MAX_PRIORITY - 1} to {MAX_PRIORITY},"
            f" got {priority!r:.60}"
        )
    return priority


def check_reason(reason: object) -> str:
    """A cancel's ``reason`` as every store keeps it: a lone surrogate or a NUL (which no
    PostgreSQL text holds) made U+FFFD, at most 1,000 characters (it becomes the run's
    error, shown in listings).

    Raises:
        ConfigError: not a str.
    """
    if not isinstance(reason, str):
        raise ConfigError(f"a cancel's reason must be a str, got {type(reason).__name__}")
    return clean_text(reason[:1000]).replace("\x00", "\ufffd")


@dataclass(slots=True)
class _Queued:
    priority: int
    cancel: str | None = None


class MemoryQueue:
    """The priorities and cancel requests of a ``MemoryStore``'s runs (its rows are the
    store's; this keeps what the queue adds to them)."""

    __slots__ = ("_runs",)

    def __init__(self) -> None:
        self._runs: dict[str, _Queued] = {}

    def queued(self, run_id: str, priority: int) -> None:
        """A new run, with its priority."""
        self._runs[run_id] = _Queued(priority)

    def priority(self, run_id: str) -> int:
        queued = self._runs.get(run_id)
        return 0 if queued is None else queued.priority

    def request(self, run_id: str) -> str | None:
        """The run's pending cancel request."""
        queued = self._runs.get(run_id)
        return None if queued is None else queued.cancel

    def saved(self, run_id: str, stopped: bool) -> str | None:
        """The run was saved (``stopped``: in DONE or ERROR, which clears its request);
        return its pending request."""
        queued = self._runs.get(run_id)
        if queued is None:
            return None
        if stopped:
            queued.cancel = None
        return queued.cancel

    def cancel(self, run_id: str, reason: str) -> None:
        """Record a request (the first reason stays)."""
        queued = self._runs.setdefault(run_id, _Queued(0))
        if queued.cancel is None:
            queued.cancel = reason

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
