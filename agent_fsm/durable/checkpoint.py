"""Checkpoint stores: the protocol, the in-process store and the checkpoint encoding.

After every transition the engine saves the run's ``RunState`` to a ``CheckpointStore``; a
crashed or paused run is resumed from the last save. A checkpoint is three parts:

- the *header*: every field of RunState except ``messages`` and ``trace``, as one JSON object
  written by ``RUN_STATE_ADAPTER`` (so fields added to RunState are stored with no change
  here), together with the ``CHECKPOINT_SCHEMA_VERSION`` that wrote it;
- the transcript, one encoded message per index;
- the trace, one ``(row, turn)`` pair per index.

``messages`` and ``trace`` are append-only, so a save writes only the entries beyond those
already stored (plus the small header): its cost does not grow with the transcript. A state
holding fewer entries than are stored (a run restored from an older checkpoint and continued)
first drops the extra stored ones; a state whose last already-stored entry differs from the
stored one (a different history under the same run id) is written out in full.

A header written by an older schema version is upgraded through ``MIGRATIONS`` (version n to
n + 1, over the decoded JSON object) or refused; one written by a newer agent_fsm is refused.
Nothing is ever read half-way: ``load`` either returns the whole state or raises
``CheckpointError``.

``SQLiteStore`` (the embedded default, one file shared safely by several processes) lives in
``durable.sqlite``, ``PostgresStore`` (many workers on many machines) in ``durable.postgres``.
Every store here also leases runs to workers (``durable.leases``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar, runtime_checkable

from pydantic import TypeAdapter, ValidationError

from agent_fsm.durable.journal import GuardedJournal, MemoryJournal, ToolJournal
from agent_fsm.durable.leases import Lease, MemoryLeases
from agent_fsm.errors import CheckpointError
from agent_fsm.messages import Message
from agent_fsm.state import RUN_STATE_ADAPTER, RunState
from agent_fsm.table import AgentState

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "MESSAGE_ADAPTER",
    "MIGRATIONS",
    "CheckpointStore",
    "MemoryStore",
    "Migration",
    "RunSummary",
    "decode_header",
    "encode_header",
    "summarize",
    "unknown_run",
]

CHECKPOINT_SCHEMA_VERSION: int = 3
"""The version of the checkpoint encoding this code writes. Raise it, and register a
migration from the previous version, whenever a change to RunState would make an older
header decode differently (a renamed field, a new required field, a changed meaning)."""

Migration = Callable[[dict[str, Any]], dict[str, Any]]
"""Upgrades a decoded header from version n to n + 1 (it may mutate and return its input)."""


def _decisions_with_their_calls(header: dict[str, Any]) -> dict[str, Any]:
    """Version 1 to 2: approval decisions (``approvals``, by call id) become ``decisions``
    that carry their calls, taken from the pending request. The stop reason is new in
    version 2 and absent here: a reopened run derives it from its trace."""
    if "approvals" not in header:
        return header
    approvals = header.pop("approvals") or {}
    control = header.get("control") or {}
    calls = {call.get("id"): call for call in control.get("pending_calls") or ()}
    header["decisions"] = [
        {"call": calls[call_id], "approval": approval}
        for call_id, approval in approvals.items()
        if call_id in calls
    ]
    return header


def _call_streaks_per_turn(header: dict[str, Any]) -> dict[str, Any]:
    """Version 2 to 3: loop detection counts repeats across turns, not calls within one reply:
    the one run of repeats it kept (``last_call``, ``call_repeats``) becomes a streak. The
    ring of recent signatures is kept: a turn of one call has the same signature as that
    call."""
    loop = header.get("loop")
    if not isinstance(loop, dict):
        return header
    last_call, repeats = loop.pop("last_call", None), loop.pop("call_repeats", 0)
    loop["call_streaks"] = {last_call: repeats} if last_call else {}
    return header


MIGRATIONS: dict[int, Migration] = {1: _decisions_with_their_calls, 2: _call_streaks_per_turn}
"""``MIGRATIONS[n]`` upgrades a header of version n to n + 1."""

MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)
"""Encodes and decodes one transcript message."""

_T = TypeVar("_T")

_HEADER_EXCLUDE = {"messages", "trace"}
"""RunState's append-only lists: stored entry by entry, not in the header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """One stored run, as ``agent-fsm runs`` lists it."""

    run_id: str
    state: AgentState | str
    """The state the run was in at its last save (a name, for a custom state)."""
    turns: int
    """Model calls made, retries included."""
    total_tokens: int
    """Input plus output tokens used."""
    messages: int
    """Transcript length."""
    last_row: int | None
    """Index into the machine table of the last transition; None before the first."""
    created_at: float
    """Unix time of the first save."""
    updated_at: float
    """Unix time of the last save."""
    output: str | None
    error: str | None


def summarize(state: RunState, *, created_at: float, updated_at: float) -> RunSummary:
    """The summary line of ``state``."""
    return RunSummary(
        run_id=state.run_id,
        state=state.state,
        turns=state.turns,
        total_tokens=state.usage.total_tokens,
        messages=len(state.messages),
        last_row=state.trace[-1][0] if state.trace else None,
        created_at=created_at,
        updated_at=updated_at,
        output=state.output,
        error=state.error,
    )


@runtime_checkable
class CheckpointStore(Protocol):
    """Where runs are saved after every transition and loaded to be resumed."""

    def save(self, state: RunState) -> None:
        """Save ``state`` as the run's checkpoint, atomically. Writes only what is new since
        the last save of the run, so the cost does not grow with the transcript."""
        ...

    def create(self, state: RunState) -> bool:
        """Save the first checkpoint of a new run, unless the store already holds a run with
        its id: then save nothing and return False. Atomic, so of two processes (or two
        tasks) starting runs under one id, exactly one gets True: the other must not run, or
        its tool calls would be answered from the first run's journal."""
        ...

    def load(self, run_id: str) -> RunState:
        """The last saved state of ``run_id``, equal to the one saved.

        Raises:
            CheckpointError: unknown run id, an unreadable checkpoint, or a schema version
                that can be neither read nor migrated.
        """
        ...

    def exists(self, run_id: str) -> bool:
        """True when ``run_id`` has a checkpoint."""
        ...

    def list_runs(self, limit: int | None = None) -> list[RunSummary]:
        """Summaries of the stored runs (at most ``limit``), most recently saved first."""
        ...

    def delete(self, run_id: str) -> None:
        """Remove the run's checkpoint and journal; an unknown id is not an error."""
        ...

    def journal(self, run_id: str) -> ToolJournal:
        """The run's tool journal, kept with its checkpoint."""
        ...

    def close(self) -> None:
        """Release the store's resources; the store cannot be used afterwards."""
        ...


def encode_header(state: RunState) -> tuple[int, bytes]:
    """The schema version and JSON header of ``state`` (everything but messages and trace)."""
    return CHECKPOINT_SCHEMA_VERSION, RUN_STATE_ADAPTER.dump_json(state, exclude=_HEADER_EXCLUDE)


def decode_header(run_id: str, version: int, header: str | bytes) -> RunState:
    """Decode a header written by schema ``version``, migrating it if it is older.

    Returns a RunState with empty ``messages`` and ``trace`` for the caller to fill.

    Raises:
        CheckpointError: the version is newer than this code, older with no migration path,
            or the header is not valid JSON for a RunState of ``run_id``.
    """
    current = CHECKPOINT_SCHEMA_VERSION
    if version > current:
        raise CheckpointError(
            f"checkpoint of run {run_id!r} was written by a newer agent_fsm (checkpoint schema "
            f"version {version}; this version reads {current} and older): upgrade agent_fsm"
        )
    try:
        if version < current:
            header = json.dumps(_migrate(run_id, version, json.loads(header)))
        state = RUN_STATE_ADAPTER.validate_json(header)
    except (ValueError, TypeError, KeyError) as exc:  # ValidationError is a ValueError
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise CheckpointError(f"checkpoint of run {run_id!r} is unreadable: {detail}") from exc
    if state.run_id != run_id:
        raise CheckpointError(
            f"checkpoint of run {run_id!r} is unreadable: its header is for run {state.run_id!r}"
        )
    return state


def _migrate(run_id: str, version: int, decoded: Any) -> dict[str, Any]:
    """Apply ``MIGRATIONS`` from ``version`` up to the current version."""
    if not isinstance(decoded, dict):
        raise CheckpointError(f"checkpoint of run {run_id!r} is unreadable: not a JSON object")
    header: dict[str, Any] = decoded
    for step in range(version, CHECKPOINT_SCHEMA_VERSION):
        migration = MIGRATIONS.get(step)
        if migration is None:
            raise CheckpointError(
                f"checkpoint of run {run_id!r} has schema version {version}, this agent_fsm "
                f"reads version {CHECKPOINT_SCHEMA_VERSION}, and there is no migration from "
                f"version {step} to {step + 1}: resume it with an older agent_fsm"
            )
        header = migration(header)
    return header


def unknown_run(run_id: str) -> CheckpointError:
    """The error for a run id with no checkpoint."""
    return CheckpointError(f"no checkpoint for run {run_id!r}")


@dataclass(slots=True, kw_only=True)
class _StoredRun:
    """One run in a MemoryStore: encoded header, immutable entries, timestamps."""

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
    (``LeaseStore``) between the runs of this process, by ``clock``.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._runs: dict[str, _StoredRun] = {}
        self._journals: dict[str, MemoryJournal] = {}
        self._clock = clock
        self._revision = 0
        self._leases = MemoryLeases(clock)

    def save(self, state: RunState, *, lease: Lease | None = None) -> None:
        self._leases.check_write(state.run_id, lease)
        version, header = encode_header(state)
        now = self._clock()
        stored = self._runs.get(state.run_id)
        if stored is None:
            stored = _StoredRun(
                version=version,
                header=header,
                messages=[],
                trace=[],
                summary=summarize(state, created_at=now, updated_at=now),
                revision=0,
            )
            self._runs[state.run_id] = stored
        _extend(stored.messages, state.messages)
        _extend(stored.trace, state.trace)  # (int, int) tuples: immutable, safe to share
        stored.version, stored.header = version, header
        stored.summary = summarize(state, created_at=stored.summary.created_at, updated_at=now)
        self._revision += 1
        stored.revision = self._revision

    def create(self, state: RunState, *, lease: Lease | None = None) -> bool:
        if state.run_id in self._runs:  # no await between the test and the save
            return False
        if lease is None:  # subclasses may override save(state) alone
            self.save(state)
        else:
            self.save(state, lease=lease)
        return True

    def load(self, run_id: str) -> RunState:
        stored = self._runs.get(run_id)
        if stored is None:
            raise unknown_run(run_id)
        state = decode_header(run_id, stored.version, stored.header)
        state.messages = list(stored.messages)
        state.trace = list(stored.trace)
        return state

    def exists(self, run_id: str) -> bool:
        return run_id in self._runs

    def list_runs(self, limit: int | None = None) -> list[RunSummary]:
        runs = sorted(self._runs.values(), key=lambda run: run.revision, reverse=True)
        return [run.summary for run in (runs if limit is None else runs[: max(limit, 0)])]

    def delete(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self._journals.pop(run_id, None)
        self._leases.forget(run_id)

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal:
        journal = self._journals.setdefault(run_id, MemoryJournal())
        return GuardedJournal(journal, lambda: self._leases.check_write(run_id, lease))

    def claim(self, run_id: str, owner: str, ttl_s: float) -> Lease:
        return self._leases.claim(run_id, owner, ttl_s)

    def renew(self, lease: Lease) -> Lease:
        return self._leases.renew(lease)

    def release(self, lease: Lease) -> None:
        self._leases.release(lease)

    def lease(self, run_id: str) -> Lease | None:
        return self._leases.lease(run_id)

    def close(self) -> None:
        """Nothing to release; present for the protocol."""


def _extend(stored: list[_T], live: list[_T]) -> None:
    """Bring ``stored`` level with the append-only ``live`` list, copying only what is new.

    ``live`` may hold fewer entries (restored from an older checkpoint and continued: the
    extra stored ones go) or a different history (its entry at the last stored index differs:
    everything is replaced). Comparing one entry keeps a save O(new entries).
    """
    if len(live) < len(stored):
        del stored[len(live) :]
    if stored and stored[-1] is not live[len(stored) - 1] and stored[-1] != live[len(stored) - 1]:
        stored.clear()
    stored.extend(live[len(stored) :])
