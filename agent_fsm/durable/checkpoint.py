"""Checkpoint stores: the protocols, split by who calls them, and the in-process store.

After every transition the engine saves the run's ``RunState`` to its store; a crashed or
paused run is reopened from the last save. Who calls what:

- ``RunSaver`` (``save``, ``journal``): what a *running* run needs, called by the engine
  after each step and around each tool call;
- ``RunOpener`` (``create``, ``load``, ``exists``, ``delete``): what starts, reopens and
  discards runs (``Agent.start``, ``resume``, ``reopen``; the engine when a run that was not
  to be kept ends);
- ``RunLister`` (``list_runs``): what lists them (``agent-fsm runs``, a UI);
- ``CheckpointStore``: all three and ``close``, what ``Agent(store=...)`` takes;
- a store that leases runs to workers is also a ``LeaseStore`` (``durable.leases``);
- ``ForwardSaves`` (``save_unless_behind``): a save that never takes a run back to an
  earlier point, the check and the write one atomic step (a DBOS run's stop, saved again by
  a replay after the run went on: ``dbos.pausing``).

The rules every store keeps (``agent_fsm.testing.CheckpointStoreContract`` checks them on
a store, ours included):

- ``load`` returns a state equal to the one last saved (custom states and ``notes``
  included), and a saved checkpoint never follows the live state as the run goes on.
- ``messages`` and ``trace`` are append-only, so a save writes only the entries beyond those
  already stored (plus the small header: ``durable.encoding``): its cost does not grow with
  the transcript. A state holding fewer entries than are stored (a run restored from an
  older checkpoint and continued) first drops the extra stored ones; a state whose entry at
  the last stored index of either list differs from the stored one (a different history
  under the same run id) is written out in full, both lists: they are one history, never a
  mix of two. Only that one entry of each list is compared, and a store that remembers what
  it wrote must still notice another writer's save (``SQLiteStore`` and ``PostgresStore``
  compare the run's revision).
- Nothing is ever read half-way: ``load`` returns the whole state or raises
  ``CheckpointError`` naming the run, as it does for an unknown run id, and whatever is
  wrong with what is stored (a schema version that is not an integer, a header whose fields
  have the wrong JSON type: ``encoding.decode_header``).
- Hostile input gets one answer from every store (``durable.encoding``'s "Hostile input"):
  an id some store could not keep is refused with ``ConfigError`` before the store touches
  its storage (``leases.check_id``); a lone surrogate in ``notes`` is saved as U+FFFD; a note
  that is not JSON is a ``CheckpointError`` naming it.
- ``list_runs`` never fails over one run: a run it cannot read (a damaged summary, a schema
  version this agent_fsm does not read) is listed with ``RunSummary.unreadable`` saying why
  (``encoding.read_summary``, ``listed``). It gives each run's last lease (holder, expiry, live) and
  flags the runs that are stuck: not stopped, and no live lease (their worker died or gave up
  mid-run); ``states=`` lists only the runs in the given states, ``stop_reasons=`` only the
  runs stopped for the given reasons.

``SQLiteStore`` (the embedded default, one file shared safely by several processes) lives in
``durable.sqlite``, ``PostgresStore`` (many workers on many machines) in ``durable.postgres``.
Every store here also leases runs to workers (``durable.leases``), queues them for workers to
take and takes cancel requests (``durable.queue``). How a store lists its runs
(``listed``, ``state_names``, ``stop_names``, ``stop_kept``) and names itself
(``redacted``) is ``durable.listing``'s, re-exported here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Protocol, Self, TypeVar, runtime_checkable

from agent_fsm.durable.encoding import (
    MESSAGE_ADAPTER,
    RunSummary,
    decode_header,
    encode_header,
    summarize,
    unknown_run,
)
from agent_fsm.durable.journal import GuardedJournal, MemoryJournal, ToolJournal
from agent_fsm.durable.leases import Lease, MemoryLeases, check_id, check_ttl
from agent_fsm.durable.listing import listed, redacted, state_names, stop_kept, stop_names
from agent_fsm.durable.queue import MemoryQueue, check_priority, check_reason
from agent_fsm.messages import Message
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, StopReason

__all__ = [
    "CheckpointStore",
    "ClosingStore",
    "ForwardSaves",
    "MemoryStore",
    "RunLister",
    "RunOpener",
    "RunSaver",
    "behind",
    "listed",
    "resumes_in",
    "redacted",
    "state_names",
    "stop_kept",
    "stop_names",
    # the encoding's names that callers have imported from here (``durable.encoding``)
    "MESSAGE_ADAPTER",
    "RunSummary",
]

_T = TypeVar("_T")


@runtime_checkable
class RunSaver(Protocol):
    """What a running run needs of its store: the engine saves after every transition (a
    turn's end that goes on with the next one: ``table.saved_with_next_step``), and
    ACT records each tool call in the run's journal around its execution."""

    def save(self, state: RunState) -> object:
        """Save ``state`` as the run's checkpoint, atomically (the run need not exist yet).
        Writes only what is new since the last save of the run, so the cost does not grow
        with the transcript (the module's rules). What it returns is not read here (a
        leased store's fenced save returns the renewed lease: ``LeasedWrites.save``).

        Raises:
            ConfigError: the run id is one no store could keep (``leases.check_id``).
            CheckpointError: a note is not a JSON value, or the storage failed.
        """
        ...

    def journal(self, run_id: str) -> ToolJournal:
        """The run's tool journal, kept with its checkpoint (``durable.journal``): one per
        run id, removed with the run by ``delete``."""
        ...


def behind(state: RunState, stored_resumes: int, stored_trace: int) -> bool:
    """Whether ``state`` is an earlier point of its run than the stored one, which was
    resumed ``stored_resumes`` times and has ``stored_trace`` transitions: a later
    activation (more resumes), or further along the same one."""
    return (stored_resumes, stored_trace) > (len(state.resumed_at), len(state.trace))


def resumes_in(header: str | bytes) -> int:
    """How often the run of a stored header (``encoding.encode_header``'s JSON) was
    resumed: its ``resumed_at`` entries."""
    found = json.loads(header).get("resumed_at")
    return len(found) if isinstance(found, list) else 0


@runtime_checkable
class ForwardSaves(Protocol):
    """A store whose save can refuse to take a run back (see ``save_unless_behind``)."""

    def save_unless_behind(self, state: RunState) -> bool:
        """``save(state)`` without a lease, unless the store holds a later point of the run
        (``behind``); True when it saved. The comparison and the write are one atomic step
        (one transaction, the run's row locked), so a later point saved by another writer
        at that very moment is never overwritten: either it was stored first, and this
        save is skipped, or it comes after, and overwrites this one.

        Raises:
            as ``RunSaver.save``; ``RunLeased`` when a lease on the run is live.
        """
        ...


@runtime_checkable
class RunOpener(Protocol):
    """What starts, reopens and discards runs: ``Agent.start``/``run`` create them,
    ``resume``/``reopen`` load them, and the engine deletes a run that was not to be kept."""

    def create(self, state: RunState) -> bool:
        """Save the first checkpoint of a new run, unless the store already holds a run with
        its id: then save nothing and return False. Atomic, so of two processes (or two
        tasks) starting runs under one id, exactly one gets True: the other must not run, or
        its tool calls would be answered from the first run's journal."""
        ...

    def load(self, run_id: str) -> RunState:
        """The last saved state of ``run_id``, equal to the one saved.

        Raises:
            CheckpointError: naming the run: unknown run id, an unreadable checkpoint (a
                header whose fields do not fit its version, whatever its migration raised),
                or a schema version that is not an integer, or can be neither read nor
                migrated.
            ConfigError: the run id is one no store could keep (``leases.check_id``).
        """
        ...

    def exists(self, run_id: str) -> bool:
        """True when ``run_id`` has a checkpoint."""
        ...

    def delete(self, run_id: str) -> None:
        """Remove the run's checkpoint, journal (and lease); an unknown id is not an error.
        The id may then be used again, for a new run."""
        ...


@runtime_checkable
class RunLister(Protocol):
    """What lists the stored runs (``agent-fsm runs``, a UI over the store)."""

    def list_runs(
        self,
        limit: int | None = None,
        *,
        states: str | Iterable[str] | None = None,
        stop_reasons: StopReason | str | Iterable[StopReason | str | None] | None = None,
    ) -> list[RunSummary]:
        """Summaries of the stored runs (at most ``limit``; none for 0 or less), most
        recently saved first, by the order of the saves even when the clock does not move;
        with ``states`` (one state or several, ``AgentState`` members or custom states'
        names), only the runs whose last save was in one of them; with ``stop_reasons``
        (one or several ``StopReason``s or their values), only the runs whose
        ``RunSummary.stop_reason`` is one of them, a None among them keeping the stopped runs
        that recorded none (``listing.stop_names``; a run still going is kept by none): a
        store that keeps the reason in a column filters there, so a rare reason costs no
        pass over the runs. Each is ``summarize`` of
        the run's last saved state, ``created_at`` the time of its first save and
        ``updated_at`` of its last, with its lease and ``stuck`` as ``listed`` gives them.

        Never raises for a stored run it cannot read: that run is listed with
        ``RunSummary.unreadable`` saying why, and the others as usual."""
        ...


@runtime_checkable
class CheckpointStore(RunSaver, RunOpener, RunLister, Protocol):
    """Where runs are saved as they step and loaded to be resumed: what
    ``Agent(store=...)`` takes. The three protocols it joins say who calls which method."""

    def close(self) -> None:
        """Release the store's resources; the store cannot be used afterwards. Idempotent."""
        ...


@dataclass(slots=True, kw_only=True)
class _StoredRun:
    """One run in a MemoryStore: encoded header, immutable entries, timestamps."""

    run_id: str
    version: int
    header: bytes
    messages: list[Message]
    """Frozen models, shared with the live state (they never change)."""
    trace: list[tuple[int, int]]
    summary: RunSummary
    revision: int
    """Store-wide save counter: orders list_runs even when the clock does not advance."""


class ClosingStore:
    """Makes a store a context manager that closes it on exit (the stores share this)."""

    __slots__ = ()

    def close(self) -> None:
        """Release what the store holds."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class MemoryStore(ClosingStore):
    """A checkpoint store in a dict: survives a resumed ``Run`` object, not a process.

    Stores the encoded header and immutable entries, never a reference to the live state's
    mutable parts, so a saved checkpoint does not change when the run goes on. Leases runs
    (``LeaseStore``) between the runs of this process, by ``clock``, queues them and takes
    cancel requests (``durable.queue``).
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._runs: dict[str, _StoredRun] = {}
        self._journals: dict[str, MemoryJournal] = {}
        self._clock = clock
        self._revision = 0
        self._leases = MemoryLeases(clock)
        self._queue = MemoryQueue()

    def save(self, state: RunState, *, lease: Lease | None = None) -> Lease | None:
        check_id(state.run_id)
        if lease is None:
            self._leases.check_write(state.run_id, None)
        else:
            lease = self._leases.renew(lease)
        self._write(state)
        request = self._queue.saved(state.run_id, state.state in TERMINAL_STATES)
        if lease is None or lease.cancel_requested == request:
            return lease
        return replace(lease, cancel_requested=request)

    def save_unless_behind(self, state: RunState) -> bool:
        check_id(state.run_id)
        stored = self._runs.get(state.run_id)  # no await between the test and the save
        if stored is not None and behind(state, resumes_in(stored.header), len(stored.trace)):
            return False
        self.save(state)
        return True

    def _write(self, state: RunState) -> None:
        version, header = encode_header(state)
        now = self._clock()
        stored = self._runs.get(state.run_id)
        if stored is None:
            stored = _StoredRun(
                run_id=state.run_id,
                version=version,
                header=header,
                messages=[],
                trace=[],
                summary=summarize(state, created_at=now, updated_at=now),
                revision=0,
            )
            self._runs[state.run_id] = stored
        _bring_level(stored, state)
        stored.version, stored.header = version, header
        stored.summary = summarize(state, created_at=stored.summary.created_at, updated_at=now)
        self._revision += 1
        stored.revision = self._revision

    def create(self, state: RunState, *, lease: Lease | None = None) -> bool:
        if check_id(state.run_id) in self._runs:  # no await between the test and the save
            return False
        if lease is None:  # subclasses may override save(state) alone
            self.save(state)
        else:
            self.save(state, lease=lease)
        return True

    def enqueue(self, state: RunState, *, priority: int = 0) -> bool:
        priority = check_priority(priority)
        if check_id(state.run_id) in self._runs:
            return False
        self._leases.check_write(state.run_id, None)
        self._queue.queued(state.run_id, priority)
        self._write(state)
        return True

    def claim_next(self, owner: str, ttl_s: float) -> Lease | None:
        check_id(owner, "worker id")
        check_ttl(ttl_s)
        queue, leases = self._queue, self._leases
        runnable = [
            run
            for run in self._runs.values()
            if run.summary.state not in TERMINAL_STATES and leases.lease(run.run_id) is None
        ]
        if not runnable:
            return None
        chosen = min(
            runnable,
            key=lambda run: (-queue.priority(run.run_id), run.summary.created_at, run.run_id),
        )
        return self.claim(chosen.run_id, owner, ttl_s)

    def cancel(self, run_id: str, reason: str) -> bool:
        reason = check_reason(reason)
        stored = self._runs.get(check_id(run_id))
        if stored is None:
            raise unknown_run(run_id)
        if stored.summary.state in TERMINAL_STATES:
            return False
        self._queue.cancel(run_id, reason)
        return True

    def load(self, run_id: str) -> RunState:
        stored = self._runs.get(check_id(run_id))
        if stored is None:
            raise unknown_run(run_id)
        state = decode_header(run_id, stored.version, stored.header)
        state.messages = list(stored.messages)
        state.trace = list(stored.trace)
        return state

    def exists(self, run_id: str) -> bool:
        return check_id(run_id) in self._runs

    def list_runs(
        self,
        limit: int | None = None,
        *,
        states: str | Iterable[str] | None = None,
        stop_reasons: StopReason | str | Iterable[StopReason | str | None] | None = None,
    ) -> list[RunSummary]:
        runs = sorted(self._runs.values(), key=lambda run: run.revision, reverse=True)
        names = state_names(states)
        if names is not None:
            runs = [run for run in runs if str(run.summary.state) in names]
        stops = stop_names(stop_reasons)
        if stops is not None:
            runs = [run for run in runs if stop_kept(run.summary, stops)]
        now, queue = self._clock(), self._queue
        return [
            listed(
                run.summary,
                version=run.version,
                lease=self._leases.latest(run.run_id),
                now=now,
                priority=queue.priority(run.run_id),
                cancel_requested=queue.request(run.run_id),
            )
            for run in (runs if limit is None else runs[: max(limit, 0)])
        ]

    def delete(self, run_id: str) -> None:
        self._runs.pop(check_id(run_id), None)
        self._journals.pop(run_id, None)
        self._leases.forget(run_id)
        self._queue.forget(run_id)

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal:
        journal = self._journals.setdefault(check_id(run_id), MemoryJournal())
        return GuardedJournal(journal, lambda: self._leases.check_write(run_id, lease))

    def claim(self, run_id: str, owner: str, ttl_s: float) -> Lease:
        lease = self._leases.claim(check_id(run_id), check_id(owner, "worker id"), ttl_s)
        return replace(lease, cancel_requested=self._queue.request(run_id))

    def renew(self, lease: Lease) -> Lease:
        check_id(lease.run_id)
        renewed = self._leases.renew(lease)
        return replace(renewed, cancel_requested=self._queue.request(lease.run_id))

    def release(self, lease: Lease) -> None:
        check_id(lease.run_id)
        self._leases.release(lease)

    def lease(self, run_id: str) -> Lease | None:
        return self._leases.lease(check_id(run_id))

    def close(self) -> None:
        """Nothing to release; present for the protocol."""


def _bring_level(stored: _StoredRun, state: RunState) -> None:
    """Bring the stored entries level with the append-only lists of ``state``, copying only
    what is new (the immutable messages and ``(int, int)`` pairs themselves, safe to share).

    The live lists may hold fewer entries (restored from an older checkpoint and continued:
    the extra stored ones go) or another history (an entry at the last stored index of
    either list differs: both are replaced). Comparing one entry of each keeps a save
    O(new entries).
    """
    messages, trace = stored.messages, stored.trace
    del messages[len(state.messages) :]
    del trace[len(state.trace) :]
    if not (_continues(messages, state.messages) and _continues(trace, state.trace)):
        messages.clear()
        trace.clear()
    messages.extend(state.messages[len(messages) :])
    trace.extend(state.trace[len(trace) :])


def _continues(stored: list[_T], live: list[_T]) -> bool:
    """Whether ``live``, at least as long, holds ``stored``'s last entry at its index."""
    if not stored:
        return True
    last = live[len(stored) - 1]
    return stored[-1] is last or stored[-1] == last
