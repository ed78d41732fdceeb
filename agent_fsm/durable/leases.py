"""Run leases: only one worker drives a run at a time, and a dead worker's runs are taken over.

A lease is a claim on one run: its holder (``owner``, a worker id), a *fencing token* and an
expiry. The contract every ``LeaseStore`` keeps:

- ``claim`` takes the lease when no live one exists (never claimed, released, or expired by
  the store's clock) and raises the run's token by one; otherwise it raises ``RunLeased``
  naming the holder and the expiry. Of two workers claiming at once, exactly one wins.
- A driver passes its lease to every write of the run: ``save(state, lease=...)``,
  ``create(state, lease=...)`` and the ``record_started`` of ``journal(run_id, lease=...)``.
  Such a write is *fenced*: it commits only if the lease's token is still the run's latest,
  checked in the write's own transaction, which also renews the lease, so leases cost no
  extra round trip per transition. A write without a lease is refused while a lease on the
  run is live.
- Expiry decides only when another worker *may* take over (liveness); the token decides whose
  writes count (safety). So clock skew cannot make two drivers: ``PostgresStore`` reads the
  time on the server alone, the SQLite and memory stores on the one machine they live on. A
  lease that expired but was not taken over is still its holder's: the next fenced write
  renews it.
- A driver whose lease was taken over finds out at its next save or tool start, which raise
  ``RunLeased`` and write nothing: it stops there, and the new holder continues from the last
  checkpoint (``Agent.resume``, the crash-resume path). A tool call the old driver had
  journalled before the takeover may still be running: the new holder finds it started and,
  for a non-idempotent tool, tells the model its outcome is unknown instead of running it
  again (an idempotent one runs again). So no non-idempotent side effect happens twice; a
  model call may be repeated, which costs tokens and has no side effect.
  ``record_finished`` is not fenced: it records what really happened to a call started under
  a valid lease, which the new holder may then replay instead of calling it unknown.
- The engine renews at every save and, while a step is in flight (a long model or tool
  call), every ``ttl_s / 3`` seconds from the event loop, and releases the lease when the run
  stops. Choose ``ttl_s`` well above the longest stall of the event loop: a run of a worker
  that died can be taken over ``ttl_s`` after its last renewal.

- Ids: every store method refuses, with ``ConfigError`` and before touching its storage, a
  run id or worker id that some store could not keep (``check_id``): so the same id gets
  the same answer from every store, and an id's trouble never surfaces as a driver's error
  (``UnicodeEncodeError``, a database error) half-way through a run.

- A store that also queues runs and takes cancel requests (``durable.queue``) hands the
  next runnable run to a worker as a claim (``claim_next``), and reports a pending cancel
  on the lease every claim, fenced save and renewal returns (``Lease.cancel_requested``).

``LeaseStore`` joins the two sides of that contract, split by who calls them: the fenced
writes of a leased run (``LeasedWrites``) and the leases themselves (``RunLeases``).
``MemoryLeases`` is the in-process implementation (``MemoryStore`` uses it).
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

from agent_fsm.durable.journal import ToolJournal
from agent_fsm.errors import ConfigError, RunLeased
from agent_fsm.state import RunState

__all__ = [
    "MAX_ID_BYTES",
    "Lease",
    "LeaseStore",
    "LeasedWrites",
    "MemoryLeases",
    "RunLeases",
    "check_id",
    "check_ttl",
    "default_worker_id",
    "leased_error",
    "lost_error",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Lease:
    """One worker's claim on one run, as the store granted (or last renewed) it."""

    run_id: str
    owner: str
    """The worker id of the holder (names it in errors; not part of the fence)."""
    token: int
    """The fencing token: raised by one at every claim of the run, so a write carrying an
    older token is refused."""
    ttl_s: float
    """How long each renewal keeps the lease."""
    expires_at: float
    """Unix time the lease runs out unless renewed, by the store's clock."""
    cancel_requested: str | None = None
    """Why the run was cancelled (``durable.queue.RunCancels.cancel``), when someone asked
    its driver to stop it and it has not stopped since: set on the lease a claim, a fenced
    save or a renewal returns, read in the same statement, so a driver learns of a cancel
    with no round trip of its own. None from a store that keeps no requests."""


@runtime_checkable
class LeasedWrites(Protocol):
    """The writes of a run driven under a lease: a ``CheckpointStore``'s, each fenced by the
    writer's lease (see the module's contract). The engine makes them while it drives a
    leased run; ``lease=None`` is the unleased write, refused while a lease is live."""

    def save(self, state: RunState, *, lease: Lease | None = None) -> Lease | None:
        """``CheckpointStore.save``, fenced by ``lease`` (which it renews).

        Returns:
            ``lease`` as renewed (its new expiry, and ``cancel_requested`` when the run was
            cancelled and this save did not stop it); None without a lease, or from a store
            that does not say.

        Raises:
            RunLeased: ``lease`` was taken over, or (no lease given) a lease is live.
        """
        ...

    def create(self, state: RunState, *, lease: Lease | None = None) -> bool:
        """``CheckpointStore.create``, fenced by ``lease`` like ``save``."""
        ...

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal:
        """``CheckpointStore.journal``, whose ``record_started`` is fenced by ``lease``
        (``record_finished`` is not: it records what a started call really did)."""
        ...


@runtime_checkable
class RunLeases(Protocol):
    """What hands runs to workers: a worker claims a run before driving it, renews the lease
    while a step is in flight and releases it when the run stops (``run.leasing``);
    ``dbos.recovery`` leases workers' liveness the same way."""

    def claim(self, run_id: str, owner: str, ttl_s: float) -> Lease:
        """Take ``run_id``'s lease for ``ttl_s`` seconds; the run need not exist yet. The
        run's token goes up by one; the lease carries the run's pending cancel request.

        Raises:
            RunLeased: another lease on the run is live (the same owner's too).
            ConfigError: ``ttl_s`` is not a positive, finite number (``check_ttl``).
            CheckpointError: the store cannot be read or written.
        """
        ...

    def renew(self, lease: Lease) -> Lease:
        """Extend a held lease by its ``ttl_s`` from now (also after it expired, as long as
        nobody took it over); the lease returned carries the run's pending cancel request
        (``Lease.cancel_requested``).

        Raises:
            RunLeased: the lease was taken over.
        """
        ...

    def release(self, lease: Lease) -> None:
        """Give the lease up so another worker may claim the run at once; a lease that was
        taken over meanwhile is left to its new holder."""
        ...

    def lease(self, run_id: str) -> Lease | None:
        """The live lease on ``run_id`` (anyone's), or None."""
        ...


@runtime_checkable
class LeaseStore(LeasedWrites, RunLeases, Protocol):
    """A checkpoint store that can lease runs to workers (see the module's contract): its
    writes take the writer's lease (``LeasedWrites``), and it claims, renews and releases
    leases (``RunLeases``)."""


MAX_ID_BYTES = 1024
"""The longest run id or worker id a store keeps, in bytes of UTF-8. PostgreSQL cannot index
a key much past 2,700 bytes (the journal's key is a run id and a call's key together), and no
store accepts an id another would refuse (``check_id``)."""


def check_id(value: object, what: str = "run id") -> str:
    """``value``, if every store can keep it as a run id (``what`` says which id: a worker
    id too). Stores call it before touching their storage, so that all refuse the same ids
    with the same error (no ``UnicodeEncodeError`` from one, a database error from another).

    Raises:
        ConfigError: not a str; holds a lone surrogate (half a UTF-16 pair: ``os.listdir``
            returns them for names in another encoding; UTF-8 cannot encode one), or a NUL
            (PostgreSQL's text refuses it); longer than ``MAX_ID_BYTES`` as UTF-8.
    """
    if (  # the usual id: a pass or two in C, no copy
        isinstance(value, str)
        and value.isascii()
        and len(value) <= MAX_ID_BYTES
        and "\x00" not in value
    ):
        return value
    if not isinstance(value, str):
        raise ConfigError(f"a {what} must be a str, got {type(value).__name__}")
    shown = repr(value[:60]) + (f"... ({len(value):,} characters)" if len(value) > 60 else "")
    try:
        size = len(value.encode())
    except UnicodeEncodeError as exc:
        raise ConfigError(
            f"{what} {shown} is not valid text: it holds a lone surrogate"
            f" ({value[exc.start]!r} at index {exc.start}), which UTF-8 cannot encode; clean"
            " it first (agent_fsm.messages.clean_text makes it U+FFFD)"
        ) from None
    if "\x00" in value:
        raise ConfigError(
            f"{what} {shown} holds a NUL character (at index {value.index(chr(0))}), which"
            " PostgreSQL cannot store"
        )
    if size > MAX_ID_BYTES:
        raise ConfigError(
            f"{what} {shown} is {size:,} bytes long as UTF-8: ids are at most {MAX_ID_BYTES:,}"
            " (PostgreSQL cannot index longer keys); use a shorter id, or a digest of this one"
        )
    return value


def check_ttl(ttl_s: object) -> float:
    """``ttl_s`` as a float, or ConfigError: a positive, finite number of seconds."""
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not 0 < ttl_s < 1e9:
        raise ConfigError(f"a lease's ttl_s must be a positive number of seconds, got {ttl_s!r}")
    return float(ttl_s)


def default_worker_id() -> str:
    """A worker id naming this process: ``host:pid:random`` (random, so that two processes
    with reused pids, or two agents in one process, are told apart in errors)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def leased_error(run_id: str, holder: str, expires_at: float, now: float) -> RunLeased:
    """The error for claiming (or writing) a run that another worker's live lease holds."""
    return RunLeased(
        f"run {run_id!r} is leased to worker {holder!r} for {max(expires_at - now, 0.0):.1f}"
        " s more: another worker is driving it. Try again after the lease expires (its holder"
        " renews it while it drives the run, and releases it when the run stops)",
        run_id=run_id,
        holder=holder,
        expires_at=expires_at,
    )


def lost_error(lease: Lease, holder: str, expires_at: float) -> RunLeased:
    """The error for a write under a lease that was taken over."""
    return RunLeased(
        f"run {lease.run_id!r}: the lease of worker {lease.owner!r} (token {lease.token}) was"
        f" taken over by worker {holder!r} after it expired; this driver stops here without"
        " writing, and the new holder continues the run from its last checkpoint",
        run_id=lease.run_id,
        holder=holder,
        expires_at=expires_at,
    )


@dataclass(slots=True)
class _Row:
    owner: str
    token: int
    expires_at: float


class MemoryLeases:
    """Leases in a dict, for ``MemoryStore``: exact between the runs of one process."""

    __slots__ = ("_clock", "_rows")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._rows: dict[str, _Row] = {}

    def claim(self, run_id: str, owner: str, ttl_s: float) -> Lease:
        ttl_s, now = check_ttl(ttl_s), self._clock()
        row = self._rows.get(run_id)
        if row is not None and row.expires_at > now:
            raise leased_error(run_id, row.owner, row.expires_at, now)
        token = row.token + 1 if row is not None else 1
        self._rows[run_id] = _Row(owner, token, now + ttl_s)
        return Lease(run_id=run_id, owner=owner, token=token, ttl_s=ttl_s, expires_at=now + ttl_s)

    def renew(self, lease: Lease) -> Lease:
        row = self._rows.get(lease.run_id)
        if row is None or row.token != lease.token:
            holder, expires = (row.owner, row.expires_at) if row else ("nobody", 0.0)
            raise lost_error(lease, holder, expires)
        row.expires_at = self._clock() + lease.ttl_s
        return replace(lease, expires_at=row.expires_at)

    def release(self, lease: Lease) -> None:
        row = self._rows.get(lease.run_id)
        if row is not None and row.token == lease.token:
            row.expires_at = 0.0

    def lease(self, run_id: str) -> Lease | None:
        row = self._rows.get(run_id)
        if row is None or row.expires_at <= self._clock():
            return None
        return Lease(
            run_id=run_id, owner=row.owner, token=row.token, ttl_s=0.0, expires_at=row.expires_at
        )

    def latest(self, run_id: str) -> tuple[str, float] | None:
        """The holder and expiry of the run's last lease, live or not (``list_runs`` shows
        them); None for a run never leased."""
        row = self._rows.get(run_id)
        return None if row is None else (row.owner, row.expires_at)

    def check_write(self, run_id: str, lease: Lease | None) -> None:
        """Fence a write of ``run_id`` (see the module's contract), renewing ``lease``.

        Raises:
            RunLeased: ``lease`` was taken over, or (none given) a lease is live.
        """
        if lease is not None:
            self.renew(lease)
            return
        row = self._rows.get(run_id)
        if row is None:  # never leased: no need to read the clock
            return
        now = self._clock()
        if row.expires_at > now:
            raise leased_error(run_id, row.owner, row.expires_at, now)

    def forget(self, run_id: str) -> None:
        """The run was deleted: its lease goes too."""
        self._rows.pop(run_id, None)
