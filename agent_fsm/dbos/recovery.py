"""Recovering the runs of a DBOS worker that died, on the workers that live.

DBOS recovers a worker's unfinished workflows when that worker starts again (same executor
id), and otherwise only when asked to for a given executor. So every worker says it is alive
the way runs do (``durable.leases``): it holds a lease named after its DBOS executor id
(``executor:<id>``) in a ``LeaseStore`` all workers share, and renews it every ``ttl_s / 3``.
Every ``scan_s`` it looks at the executors that hold unfinished (``PENDING``) workflows of
this application version (the only ones DBOS's recovery hands back); one whose lease it can
claim has died (a claim succeeds only when no live lease exists), and its workflows go back
to DBOS's queue (DBOS's own recovery, for that executor id), from which exactly one live
worker takes each and replays it (``agent_fsm.dbos.agent``). The claim is released once
they are handed back, so a worker restarting under that id can take its lease again.

Of two workers scanning at once, one claims a dead executor's lease and the other skips it;
and DBOS hands a workflow back only while it is still marked as the dead executor's, so
each workflow is recovered once either way.

The contract: a worker that stalls longer than ``ttl_s`` (its renewals cannot reach the
store) is taken for dead, and its runs may then be replayed elsewhere while it still drives
them: choose ``ttl_s`` well above any stall, as for run leases. Executor ids must be unique
per worker process: a second worker claiming a live one's id is refused (``RunLeased``).
"""

from __future__ import annotations

import contextlib
import threading

from dbos import DBOS

from agent_fsm.durable.leases import Lease, LeaseStore, check_ttl
from agent_fsm.errors import AgentFSMError, ConfigError, RunLeased
from agent_fsm.logs import get_logger

__all__ = ["LEASE_PREFIX", "WorkerLiveness"]

LEASE_PREFIX = "executor:"
"""A worker's liveness lease is named this followed by its DBOS executor id."""

_PENDING = "PENDING"


class WorkerLiveness:
    """Keeps this worker's liveness lease, and recovers the runs of workers without one.

    Args:
        leases: the store every worker shares (``PostgresStore``).
        ttl_s: how long a worker may go silent before its runs are recovered elsewhere.
        scan_s: how often to look for dead workers; ``ttl_s / 2`` when None.

    Use it after ``DBOS.launch()`` (it reads DBOS's executor id then): ``start()``, and
    ``stop()`` before ``DBOS.destroy()``; or ``with WorkerLiveness(store):``.
    """

    def __init__(self, leases: LeaseStore, *, ttl_s: float = 10.0, scan_s: float | None = None):
        if not isinstance(leases, LeaseStore):
            raise ConfigError(
                f"leases must be a LeaseStore (PostgresStore), got {type(leases).__name__}"
            )
        self._leases = leases
        self.ttl_s = check_ttl(ttl_s)
        self.scan_s = self.ttl_s / 2 if scan_s is None else check_ttl(scan_s)
        self.recovered: list[str] = []
        """The ids of the runs this worker handed back to the queue, in order."""
        self._lease: Lease | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._log = get_logger("agent_fsm.dbos")

    @property
    def executor_id(self) -> str:
        return DBOS.executor_id

    def start(self) -> None:
        """Claim this worker's lease and start renewing it and scanning, on a daemon thread.

        Raises:
            RunLeased: a live worker has this executor id.
        """
        self._lease = self._leases.claim(LEASE_PREFIX + self.executor_id, "dbos", self.ttl_s)
        self._thread = threading.Thread(
            target=self._keep_alive, name="agent_fsm-liveness", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing and scanning, and release the lease (the worker is leaving)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._lease is not None:
            with contextlib.suppress(AgentFSMError):
                self._leases.release(self._lease)
            self._lease = None

    def __enter__(self) -> WorkerLiveness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def recover_dead(self) -> list[str]:
        """One scan: hand the unfinished runs of every executor without a live lease back
        to the queue; return their ids. Blocking (it reads DBOS's tables): call it from a
        thread, as the scanning thread does, not from an event loop."""
        mine = self.executor_id
        pending = DBOS.list_workflows(
            status=_PENDING,
            app_version=DBOS.application_version,
            load_input=False,
            load_output=False,
        )
        executors = {s.executor_id for s in pending if s.executor_id and s.executor_id != mine}
        found: list[str] = []
        for executor in sorted(executors):
            try:
                claim = self._leases.claim(LEASE_PREFIX + executor, f"recovery:{mine}", self.ttl_s)
            except RunLeased:
                continue  # alive, or another worker is recovering it now
            try:
                handles = DBOS._recover_pending_workflows([executor])
            finally:
                with contextlib.suppress(AgentFSMError):
                    self._leases.release(claim)
            found.extend(handle.workflow_id for handle in handles)
            self._log.warning("dead_worker_recovered", executor=executor, runs=len(handles))
        self.recovered.extend(found)
        return found

    def _keep_alive(self) -> None:
        """Renew every ``ttl_s / 3`` and scan every ``scan_s``; a failure is logged and
        tried again at the next tick (a store that is down comes back)."""
        tick = min(self.ttl_s / 3, self.scan_s)
        since_scan = 0.0
        while not self._stop.wait(tick):
            since_scan += tick
            try:
                assert self._lease is not None
                self._lease = self._leases.renew(self._lease)
                if since_scan >= self.scan_s:
                    since_scan = 0.0
                    self.recover_dead()
            except Exception:
                self._log.exception("worker_liveness_failed", executor=self.executor_id)
