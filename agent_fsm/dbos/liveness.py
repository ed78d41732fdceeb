"""A process's liveness in a DBOS fleet: the lease that tells the other workers it still
drives its runs, the fleet's clock read off that lease, and the fence every run's steps pass.

**One lease per process, from its first run on.** Every process that executes a
``DBOSAgent``'s workflows holds a lease named after its DBOS executor id
(``recovery.LEASE_PREFIX``) in a ``LeaseStore`` the fleet shares, renewed every ``ttl_s /
3`` by a daemon thread. It is taken before any run makes its first step: by ``DBOSWorker``
at launch, by ``WorkerLiveness.start()``, or else automatically by the first run the process
executes (on that agent's journal store, ``ttl_s`` 10). It lasts as long as the process's
DBOS: ``DBOS.destroy()`` stops it and gives the lease up, and the runs still unfinished are
then recovered at once. The same thread scans for gone executors (``agent_fsm.dbos.recovery``,
which says who is gone) every ``scan_s``, while its own lease is fresh.

**A lease lost is never taken back; a fresh one is claimed.** After a stall, a SIGSTOP or an
outage longer than ``ttl_s``, another worker may have claimed the lease and handed this
process's runs back to the queue. The renewal then fails (the lease's token has moved on), and
the process claims a *fresh* lease: a new token, a new fencing identity. Runs it takes from
then on are covered by it, so the fleet stops recovering them; and every execution that began
under the lost lease stops before its next model or tool call (``Admission.check``), since
its run now belongs to another execution. Nothing it had begun runs again here.

**The fence.** A run's workflow is *admitted* (``WorkerLiveness.admit``) before its first
step: once the lease is fresh, the execution checks that DBOS still counts it the owner of
its workflow (a recovery may have handed it on while it waited), and remembers the lease's
token. Before each model and tool call the execution checks, locally and without I/O, that
the lease it was admitted under is still this process's and *fresh*: its last renewal was
sent less than two thirds of ``ttl_s`` ago by this process's monotonic clock. A store that
granted the lease for ``ttl_s`` from a moment after that send cannot have seen it expire, so
no worker can have recovered the run: the call is safe to start. Otherwise the call waits for
the next renewal; if the lease was lost, the execution stops (its task is cancelled: nothing
more is recorded for it) and the run goes on where the fleet replays it.

**The fleet's clock** (``WorkerLiveness.now``) is the lease store's: each renewal returns
the lease's expiry, read on the store's clock, which dated it; the time in between is
measured with this process's monotonic clock. So every worker reads one clock, whatever its
own time of day says (``agent_fsm.dbos.replay`` keeps run deadlines on it).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

from dbos import DBOS

from agent_fsm.dbos.private import launched, owns_this_workflow, stop_with_dbos
from agent_fsm.dbos.recovery import LEASE_PREFIX, recover_gone, register
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.durable.leases import Lease, LeaseStore, check_ttl, default_worker_id
from agent_fsm.errors import AgentFSMError, ConfigError, RunLeased
from agent_fsm.logs import get_logger

__all__ = ["FRESH", "Admission", "WorkerLiveness", "process_liveness"]

FRESH = 2 / 3
"""A lease is fresh while its last renewal was sent less than this share of ``ttl_s`` ago."""
_POLL_S = 0.01
_log = get_logger("agent_fsm.dbos")


@dataclass(frozen=True, slots=True)
class _Held:
    """The lease as last confirmed, and when the confirming request was sent (monotonic)."""

    lease: Lease
    sent: float


class WorkerLiveness:
    """This process's liveness lease, its renewal, and scans for gone executors.

    Args:
        leases: the store every worker shares (``PostgresStore``).
        ttl_s: how long a process may go silent before its runs are recovered elsewhere.
        scan_s: how often to look for gone executors; ``ttl_s / 2`` when None.
        recover: whether to scan at all; by default, unless ``leases`` is a ``MemoryStore``
            (which cannot see other processes' leases).

    One per process. ``start()`` it after ``DBOS(config=...)`` and before
    ``DBOS.launch()`` (``DBOSWorker`` does), or let the first run start the default one.
    """

    def __init__(
        self,
        leases: LeaseStore,
        *,
        ttl_s: float = 10.0,
        scan_s: float | None = None,
        recover: bool | None = None,
    ) -> None:
        if not isinstance(leases, LeaseStore):
            raise ConfigError(
                f"leases must be a LeaseStore (PostgresStore), got {type(leases).__name__}"
            )
        self._leases = leases
        self.ttl_s = check_ttl(ttl_s)
        self.scan_s = self.ttl_s / 2 if scan_s is None else check_ttl(scan_s)
        self.recover = not isinstance(leases, MemoryStore) if recover is None else recover
        self.recovered: list[str] = []
        """The ids of the runs this process handed back to the queue, in order."""
        self.owner = f"worker:{default_worker_id()}"
        """The lease's owner: names this process in errors."""
        self._executor: str | None = None
        self._held: _Held | None = None
        self._offset: float | None = None
        """The store's clock minus this process's monotonic clock, at the last renewal;
        kept when the lease is lost, so the fleet's clock still reads in a step that ends."""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = _Signal(self._wake)
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def executor_id(self) -> str:
        """The executor id whose lease this is (DBOS's, read at ``start``)."""
        return self._executor if self._executor is not None else DBOS.executor_id

    def start(self) -> None:
        """Claim the lease now, and keep it (and scan) on a daemon thread. Idempotent.

        Raises:
            RunLeased: another live process holds this executor id (a process of it that
                died holds it at most ``ttl_s``: waited for).
            ConfigError: another ``WorkerLiveness`` keeps this process's liveness.
        """
        if self._thread is not None:
            return
        _check_vacant(self)
        self._stopped = False
        self._stop.clear()
        deadline = time.monotonic() + 2 * self.ttl_s
        while not self._keep(first=True):
            if time.monotonic() > deadline:
                name = LEASE_PREFIX + self.executor_id
                holder = self._leases.lease(name)
                raise RunLeased(
                    f"executor id {self.executor_id!r} is in use by a live process"
                    f" ({holder.owner if holder else 'unknown'}): give each process its own",
                    run_id=name,
                    holder=holder.owner if holder else "unknown",
                    expires_at=holder.expires_at if holder else 0.0,
                )
            time.sleep(self.ttl_s / 10)
        self._begin()

    def _begin(self) -> None:
        """Become the process's liveness and start the keeper thread (it claims the lease
        itself when it holds none yet)."""
        global _current
        with _registry:
            _check_vacant(self)
            _current = self
        self._executor = DBOS.executor_id
        self._thread = threading.Thread(
            target=self._keep_alive, name="agent_fsm-liveness", daemon=True
        )
        self._thread.start()
        stop_with_dbos(self._stop, self._thread)

    def stop(self) -> None:
        """Stop renewing and scanning, and give the lease up (the process is leaving: its
        unfinished runs are recovered by the fleet, and its executions stop at their next
        call). Idempotent."""
        global _current
        self._stopped = True
        self._stop.set()
        self._wake.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            held, self._held = self._held, None
        if held is not None:
            with contextlib.suppress(AgentFSMError):
                self._leases.release(held.lease)
        with _registry:
            if _current is self:
                _current = None

    def __enter__(self) -> WorkerLiveness:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def recover_dead(self) -> list[str]:
        """One scan: hand the unfinished runs of every gone executor back to the queue;
        return their ids (``agent_fsm.dbos.recovery``). Blocking: call it from a thread."""
        found = recover_gone(self._leases, self.executor_id, self.ttl_s)
        self.recovered.extend(found)
        return found

    def now(self) -> float:
        """The fleet's clock (unix seconds, the lease store's; see the module docstring).

        Raises:
            ConfigError: no lease was ever held (read it inside an admitted run only); one
                lost since still dates the clock.
        """
        offset = self._offset
        if offset is None:
            raise ConfigError("the fleet's clock is read off the liveness lease: none was held")
        return offset + time.monotonic()

    def _fresh(self) -> _Held | None:
        held = self._held
        if held is None or time.monotonic() - held.sent >= FRESH * self.ttl_s:
            return None
        return held

    async def admit(self) -> Admission:
        """Admit the running workflow's execution (see the module docstring); called in
        the workflow before its first step. Waits for a fresh lease (after a stall, an
        outage, or before the first claim). An execution whose workflow another execution
        owns by now, or of a process leaving, stops here (its task is cancelled)."""
        admission = Admission(self, 0, asyncio.current_task())
        while (held := self._fresh()) is None:
            if self._stopped:
                await admission.superseded()
            self._wake.set()
            await asyncio.sleep(_POLL_S)
        admission.token = held.lease.token
        if not await asyncio.to_thread(owns_this_workflow):
            await admission.superseded()
        return admission

    def _keep(self, *, first: bool = False) -> bool:
        """Renew the lease, or claim one (the first, or a fresh one after it was lost);
        whether one is held now. Never raises: a failure is logged and tried again."""
        held = self._held
        name = LEASE_PREFIX + self.executor_id
        sent = time.monotonic()
        try:
            if held is None:
                lease = self._leases.claim(name, self.owner, self.ttl_s)
            else:
                lease = self._leases.renew(held.lease)
        except RunLeased as refused:
            if held is not None:  # taken over: the fleet recovered what ran under it
                _log.warning("worker_liveness_lost", executor=self.executor_id)
                with self._lock:
                    if self._held is held:
                        self._held = None
                return self._keep(first=first)
            if not first:
                _log.warning("worker_liveness_refused", executor=self.executor_id, why=str(refused))
            return False
        except Exception:
            _log.exception("worker_liveness_failed", executor=self.executor_id)
            return held is not None
        got = time.monotonic()
        offset = lease.expires_at - lease.ttl_s - (sent + got) / 2
        with self._lock:
            if self._stopped:
                return False
            self._held = _Held(lease, sent)
            self._offset = offset
        if held is None or held.lease.token != lease.token:
            _log.info("worker_liveness_claimed", executor=self.executor_id, token=lease.token)
            with contextlib.suppress(Exception):
                register(self._leases, self.executor_id)
        return True

    def _keep_alive(self) -> None:
        """Keep the lease every ``ttl_s / 3`` (or when an execution asks), and scan every
        ``scan_s`` while the lease is fresh; stop when asked or when DBOS is destroyed."""
        tick = min(self.ttl_s / 3, self.scan_s)
        last_scan = time.monotonic()
        while not self._stop.is_set():
            self._keep()
            if self.recover and time.monotonic() - last_scan >= self.scan_s:
                last_scan = time.monotonic()
                if self._fresh() is not None and launched():
                    try:
                        self.recover_dead()
                    except Exception:
                        _log.exception("worker_recovery_failed", executor=self.executor_id)
            self._wake.wait(tick)
            self._wake.clear()
        self.stop()  # also when DBOS.destroy() stopped it: give the lease up


class Admission:
    """One execution of a run's workflow, admitted under one lease of its process (see the
    module docstring): the fence its steps pass, and the fleet's clock they read."""

    __slots__ = ("liveness", "task", "token")

    def __init__(
        self, liveness: WorkerLiveness, token: int, task: asyncio.Task[object] | None
    ) -> None:
        self.liveness = liveness
        self.token = token
        """The fencing token of the lease the execution was admitted under."""
        self.task = task
        """The workflow's task: cancelled to stop a superseded execution."""

    def now(self) -> float:
        """The fleet's clock."""
        return self.liveness.now()

    async def check(self) -> None:
        """Return when the execution may start a model or tool call: its lease is still
        this process's and fresh. Waits while it is not fresh; an execution whose lease was
        lost (or given up) stops (``superseded``)."""
        liveness = self.liveness
        while True:
            held = liveness._fresh()
            if held is not None and held.lease.token == self.token:
                return
            current = liveness._held
            if liveness._stopped or (current is not None and current.lease.token != self.token):
                await self.superseded()
            liveness._wake.set()
            await asyncio.sleep(_POLL_S)

    async def superseded(self) -> None:
        """Stop this execution: its run belongs to another one now. Its task is cancelled,
        so nothing more is recorded for it; the cancellation is raised here."""
        _log.warning("superseded_execution_stopped", workflow_id=DBOS.workflow_id)
        if self.task is not None:
            self.task.cancel()
        raise asyncio.CancelledError


class _Signal(threading.Event):
    """The keeper's stop event (``DBOS.destroy()`` sets it too): setting it also wakes the
    keeper, which waits on ``wake``."""

    def __init__(self, wake: threading.Event) -> None:
        super().__init__()
        self.wake = wake

    def set(self) -> None:
        super().set()
        self.wake.set()


_registry = threading.Lock()
_current: WorkerLiveness | None = None


def _check_vacant(liveness: WorkerLiveness) -> None:
    """Raise ConfigError when another liveness keeps this process's."""
    if _current is not None and _current is not liveness:
        raise ConfigError(
            "this process already keeps its liveness (a WorkerLiveness started before, or"
            " the default one its first run started): start yours before DBOS.launch(),"
            " or use DBOSWorker"
        )


def process_liveness(leases: LeaseStore) -> WorkerLiveness:
    """The process's liveness: the one started, or else a default one on ``leases`` started
    now (its thread claims the lease; ``admit`` waits for it)."""
    with _registry:
        current = _current
    if current is not None:
        return current
    default = WorkerLiveness(leases)
    try:
        default._begin()
    except ConfigError:  # another run started one just now
        with _registry:
            assert _current is not None
            return _current
    return default
