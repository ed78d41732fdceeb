"""Recovering the runs of DBOS workers that are gone, on the workers that live.

DBOS recovers a worker's unfinished workflows when that worker starts again (same executor
id), and otherwise only when asked to for a given executor. So every process that executes
workflows holds a *liveness lease* named after its executor id (``executor:<id>``) in a
``LeaseStore`` the fleet shares (``agent_fsm.dbos.liveness``), and a scan here hands the
unfinished (``PENDING``) workflows of the executors that are gone back to their queue, from
which exactly one live worker takes each and replays it (``agent_fsm.dbos.agent``).

**Which executors are gone.** Only those proven gone, never one merely not heard from:

- an executor whose liveness lease is live is alive;
- an executor that held its lease once (it *registered*: ``register``, when it first claimed
  it) and whose lease has expired is gone: it stopped renewing for ``ttl_s`` (it died, or
  stalled that long, and then it finds its lease taken over and claims a fresh one,
  ``agent_fsm.dbos.liveness``);
- an executor never seen (unfinished runs, no lease, never registered) is given a chance
  first: the first scan that meets it starts its *probation*, a lease ``executor-seen:<id>``
  of ``ttl_s`` the scan holds on its behalf; it is gone once the probation has run out and
  it still holds no lease. A process takes its lease before its runs make their first step,
  so an executor never seen is one that died in the instant between taking a run and
  claiming, or a process that keeps no liveness (an older agent_fsm): ``ttl_s`` is the time
  any process is given to show itself, the same measure as for silence.

The probation and the registration share one lease name: its fencing token says whether
anyone claimed it before. A scan claiming ``executor-seen:<id>`` gets token 1 only when the
executor never registered and no probation ran: the probation starts. A live probation
refuses the claim (``RunLeased``): wait. Any later token means registered, or probation
over: the executor is gone. Leases live in the store's clock alone, so the workers' clocks
never decide.

**Each run is recovered once.** The scan claims a gone executor's liveness lease before
handing its runs back (of two scans at once, one claims and the other skips it), and DBOS
hands a workflow back only while it is still marked as that executor's, so each workflow is
recovered once either way. The claim is released afterwards; the lease's token has moved
on, so the executor, if it was only stalled, cannot renew its old lease: it claims a fresh
one, and its executions that began under the old one stop before their next call.
"""

from __future__ import annotations

import contextlib

from dbos import DBOS

from agent_fsm.dbos.private import recover_executors
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.errors import AgentFSMError, RunLeased
from agent_fsm.logs import get_logger

__all__ = ["LEASE_PREFIX", "SEEN_PREFIX", "gone", "recover_gone", "register"]

LEASE_PREFIX = "executor:"
"""A process's liveness lease is named this followed by its DBOS executor id."""
SEEN_PREFIX = "executor-seen:"
"""The lease that records an executor's registration, or its probation (see above)."""

_PENDING = "PENDING"
_log = get_logger("agent_fsm.dbos")


def register(leases: LeaseStore, executor: str) -> None:
    """Record that ``executor`` held its liveness lease (claimed and given back at once). A
    probation running meanwhile refuses the claim, and is moot: the executor holds its
    lease, so scans find it alive."""
    with contextlib.suppress(RunLeased):
        leases.release(leases.claim(SEEN_PREFIX + executor, "registered", 1.0))


def gone(leases: LeaseStore, executor: str, scanner: str, ttl_s: float) -> bool:
    """Whether ``executor`` is proven gone (see the module docstring); a first meeting with
    one never seen starts its probation. Raises what the store raises."""
    if leases.lease(LEASE_PREFIX + executor) is not None:
        return False
    try:
        mark = leases.claim(SEEN_PREFIX + executor, f"probation:{scanner}", ttl_s)
    except RunLeased:
        return False  # its probation is running
    if mark.token == 1:
        _log.info("executor_probation_started", executor=executor, ttl_s=ttl_s)
        return False  # never registered: the probation runs from now
    leases.release(mark)  # only a test: registered before, or its probation ran out
    return True


def recover_gone(leases: LeaseStore, mine: str, ttl_s: float) -> list[str]:
    """One scan: hand the unfinished runs of every executor proven gone back to the queue;
    return their ids. Blocking (it reads DBOS's tables): call it from a thread."""
    pending = DBOS.list_workflows(
        status=_PENDING,
        app_version=DBOS.application_version,
        load_input=False,
        load_output=False,
    )
    executors = {s.executor_id for s in pending if s.executor_id and s.executor_id != mine}
    found: list[str] = []
    for executor in sorted(executors):
        if not gone(leases, executor, mine, ttl_s):
            continue
        try:
            claim = leases.claim(LEASE_PREFIX + executor, f"recovery:{mine}", ttl_s)
        except RunLeased:
            continue  # it came back, or another worker is recovering it now
        try:
            runs = recover_executors([executor])
        finally:
            with contextlib.suppress(AgentFSMError):
                leases.release(claim)
        found.extend(runs)
        _log.warning("dead_worker_recovered", executor=executor, runs=len(runs))
    return found
