"""A leased run's side of its lease (``Agent(lease_s=...)``): saving and journalling under it,
the heartbeat that renews it while a step is in flight, and its release when the run stops.

The fence itself is the store's (``durable.leases``): every save and every tool-call start
carries the lease, and the store commits it only while the lease's token is the run's
latest, renewing it in the same transaction. Saves come at every transition, so a run that
moves renews its lease for free; the heartbeat covers a step that takes long (a slow model
or tool call), every ``ttl_s / 3`` seconds from a timer of the event loop, and only while a
step is in flight: a Run object abandoned between steps lets its lease expire.

A cancel from outside (``durable.queue``) reaches the driver on the lease the store returns
from the claim, from every save and from every renewal (``Lease.cancel_requested``): no
statement of its own, so a run nobody cancels pays nothing for it. The driver then aborts
the run (``abort``, given at ``start``): at once for a claim that found the request, at its
next transition for a save or a renewal that did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from agent_fsm.durable.journal import ToolJournal
from agent_fsm.durable.leases import Lease, LeaseStore
from agent_fsm.errors import CheckpointError, RunLeased
from agent_fsm.state import RunState

__all__ = ["RunLease"]


class RunLease:
    """The lease one Run holds on its run, from ``Agent.start``/``reopen`` until it stops."""

    __slots__ = ("_abort", "_heartbeat", "_lease", "_leases", "_log", "_stepping")

    def __init__(self, leases: LeaseStore, lease: Lease, log: Any) -> None:
        self._leases = leases
        self._lease: Lease | None = lease
        """None once released."""
        self._log = log
        self._heartbeat: asyncio.TimerHandle | None = None
        self._stepping = False
        self._abort: Callable[[str], None] | None = None

    def journal(self, run_id: str) -> ToolJournal:
        """The run's tool journal, whose ``record_started`` is fenced by the lease."""
        return self._leases.journal(run_id, lease=self._lease)

    def save(self, state: RunState) -> None:
        """Checkpoint ``state``, fenced by the lease, which the save renews; a cancel the
        save reports aborts the run.

        Raises:
            RunLeased: the lease was taken over; nothing was written.
        """
        self._heard(self._leases.save(state, lease=self._lease))

    def confirm(self) -> None:
        """Renew the lease now, to learn whether it still holds (a run found moved on under
        it was taken over: a store moves a leased run only for its holder).

        Raises:
            RunLeased: the lease was taken over.
            CheckpointError: the store cannot be reached.
        """
        lease = self._lease
        if lease is not None:
            self._heard(self._leases.renew(lease))

    def start(self, abort: Callable[[str], None]) -> None:
        """Start the heartbeat (call from the run's event loop); ``abort(reason)`` stops the
        run when a cancel is reported, now if the claim found one."""
        self._abort = abort
        lease = self._lease
        if lease is not None and self._heartbeat is None:
            self._schedule(lease)
            self._heard(lease)

    def _heard(self, renewed: Lease | None) -> None:
        """What a claim, save or renewal returned: abort the run if it was cancelled
        (``Run.abort`` does nothing to a run already aborting or stopped)."""
        if renewed is None or renewed.cancel_requested is None or self._abort is None:
            return
        self._log.info("cancel_requested", reason=renewed.cancel_requested)
        self._abort(renewed.cancel_requested)

    async def during_step(self, work: Awaitable[None]) -> None:
        """Await a step's work with the heartbeat renewing the lease meanwhile."""
        self._stepping = True
        try:
            await work
        finally:
            self._stepping = False

    def release(self) -> None:
        """Stop the heartbeat and give the lease up (the run stopped, or its driver gave up),
        so that another worker may take the run at once. A release that fails leaves the
        lease to expire; one taken over is left to its new holder."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None
        self._abort = None  # a bound method of the Run: kept, the finished run is a cycle
        lease, self._lease = self._lease, None
        if lease is None:
            return
        try:
            self._leases.release(lease)
        except CheckpointError as exc:
            self._log.warning("lease_release_failed", error=str(exc))

    def _schedule(self, lease: Lease) -> None:
        self._heartbeat = asyncio.get_running_loop().call_later(lease.ttl_s / 3, self._beat)

    def _beat(self) -> None:
        """Renew the lease if a step is in flight, then come back in ``ttl_s / 3``. A lease
        found taken over aborts the run here: what is in flight is cancelled (a sub-agent's
        run is aborted with it, so no child outlives its parent's lease), the next save
        raises ``RunLeased`` without writing, and the journal refuses calls this driver
        would start meanwhile."""
        self._heartbeat = None
        lease = self._lease
        if lease is None:
            return
        if self._stepping:
            try:
                self._heard(self._leases.renew(lease))
            except RunLeased as lost:
                self._log.warning("lease_lost", error=str(lost))
                if self._abort is not None:  # stop the step: its sub-agents and calls too
                    self._abort(f"the run's lease was lost: {lost}")
                return
            except CheckpointError as exc:  # the store is unreachable: try again later
                self._log.warning("lease_renewal_failed", error=str(exc))
        self._schedule(lease)
