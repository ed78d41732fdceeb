"""The chaos test (issue 34): a fleet of worker processes (``tests/chaos_worker.py``) works
through a stream of runs on a PostgreSQL cluster of its own, leases-only or on DBOS, while
it is attacked; then every run is judged (``tests/chaos_checks.py``).

The runs are fed to the fleet a few at a time (at most ``WINDOW`` per worker unfinished), so
that work is in flight whenever an attack comes, however fast the fleet is. The attacks,
each at a moment drawn from the seed (a share of the runs finished), one at a time:

- **SIGKILLs inside tool calls**: a worker is told to die inside its next non-idempotent
  call, before or after the call's effect;
- **SIGKILLs inside saves**: ... inside its next checkpoint save or tool-journal write
  (leases-only), or while DBOS records a step's outcome, or a journal write (DBOS); a
  killed worker is replaced by a new process (a new worker id);
- **PostgreSQL stopped and started**: ``pg_ctl stop -m fast``, down for ``pg_down_s``
  (longer than a lease: every lease expires meanwhile), then started again;
- **a worker SIGSTOPped past its lease**: one that drives a run is frozen until another
  worker has taken that run over (its lease, or under DBOS its liveness lease, expired),
  then SIGCONTed;
- **skewed clocks**: the workers of some slots run an hour ahead or behind
  (``Profile.skews``; ``chaos_fleet.LAUNCHER`` patches ``time.time`` before anything is
  imported, and their stores and agent get clocks that read it);
- **double approvals**: every ``approval_every``-th run (``pay-NNN``) pauses twice for an
  approval; the test, as the person, clicks each pause when it sees it (every other pause
  twice at once: a double click) and once more, late, after the run has left it.

Every planned fault is carried out, whatever the machine's speed: the last runs of the
stream (``RESERVE``) are held back until none is left to come (due, armed and not fired,
or a worker frozen), and fed one at a time whenever the fleet runs out of work meanwhile,
so a fault due late, or one waiting for a worker that drives a run, always finds one; a
kill armed in a worker that drives no run any more (its run taken over, or finished) is
moved to one that does (``Fleet.disarm``).

``run_chaos`` returns a ``Report``: the figures (runs, workers, faults of each kind,
effects, duplicates, invariant violations, wall time) and every problem found. Timeouts are
upper bounds for a hung fleet, never measures.
"""

from __future__ import annotations

import functools
import random
import re
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent_fsm import RunResult
from agent_fsm.durable import RunSummary
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.table import TABLE, TERMINAL_STATES, StopReason
from tests.chaos_checks import Left, dbos_results, judge, leases_results
from tests.chaos_fleet import CI, FULL, Cluster, Fleet, Profile, Report, Slot
from tests.chaos_worker import (
    AGENT_NAME,
    APP_VERSION,
    LEASE_S,
    QUEUE_NAME,
    TABLES,
    TTL_S,
    Faults,
    Ledger,
    chaos_agent,
)

__all__ = ["CI", "FULL", "MODES", "Cluster", "Profile", "Report", "run_chaos"]

MODES = ("leases", "dbos")
WINDOW = 3
"""Runs fed to the fleet and not finished yet, at most, per worker."""
RESERVE = 0.25
"""The share of the runs held back at the end of the stream while a planned fault has not
been carried out (they are fed one at a time when the fleet has nothing else to do): the
faults are due by 75% of the runs finished (``_schedule``), so the others reach them all."""
IDLE_CHECKS = 5
"""How many looks in a row find a worker armed with a kill driving no run before its kill
is moved to one that drives a run."""
FREEZE_BOUND_S = 60.0 + 10 * max(LEASE_S, TTL_S)
"""How long a worker stays frozen when nobody takes its run over: a bound for a hang."""
_ERROR = re.compile(r"^\S+ error \S+ \S+(?: on \S+)?: (\w+):", re.MULTILINE)
"""A worker's log line of an exception its resume or click raised (``chaos_worker._log``)."""


@dataclass
class Frozen:
    """The worker SIGSTOPped now, the run it drove, and when that run was taken over."""

    victim: Slot
    run_id: str
    deadline: float
    taken_at: float | None = None


@dataclass
class Pause:
    """A pause the person clicked: where its run was then, and the calls it showed."""

    where: tuple[Any, ...]
    calls: tuple[str, ...]
    blanket: bool
    late_sent: bool = False


def _where(summary: RunSummary) -> tuple[Any, ...]:
    """Where a stored run is: its state, transcript length and last row (a lease taken or
    given back changes none of them), and the stop that row makes."""
    row = summary.last_row
    stop = TABLE[row].stop_reason if row is not None else None
    return (summary.state, summary.messages, summary.turns, row, stop)


def _ended(summary: RunSummary) -> bool:
    """Whether a stored run has ended: at a terminal state, not waiting for an approval."""
    return (
        summary.state in TERMINAL_STATES and _where(summary)[-1] is not StopReason.APPROVAL_REQUIRED
    )


def _schedule(profile: Profile) -> list[tuple[float, str]]:
    """When each fault comes: a share of the runs finished, drawn from the seed."""
    rng = random.Random(profile.seed)
    kinds = (
        ["kill-tool"] * profile.kills_in_tools
        + ["kill-save"] * profile.kills_in_saves
        + ["pg-restart"] * profile.pg_restarts
        + ["sigstop"] * profile.sigstops
    )
    return sorted((rng.uniform(0.05, 0.75), kind) for kind in kinds)


def _retrying(work: Callable[[], Any], bound_s: float = 180.0) -> Any:
    """``work()``, tried again while the server is away (an upper bound for a hang)."""
    deadline = time.monotonic() + bound_s
    while True:
        try:
            return work()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


class Chaos:
    """One chaos run (see the module docstring)."""

    def __init__(self, mode: str, profile: Profile, cluster: Cluster) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode, self.profile, self.cluster = mode, profile, cluster
        self.started = time.monotonic()
        self.progress = 0.0
        schema, dbos_schema = f"chaos_{uuid.uuid4().hex[:10]}", f"dbos_{uuid.uuid4().hex[:10]}"
        self.dbos_schema = dbos_schema
        self.rng = random.Random(profile.seed + 1)
        self.store = PostgresStore(cluster.url, schema=schema)
        self.ledger = Ledger(cluster.url, schema)
        self.ledger.execute(TABLES)
        self.fleet = Fleet(mode, profile, [cluster.url, schema, dbos_schema], self.note)
        self.report = Report(mode, profile, self.fleet.logs)
        self.agent = chaos_agent(self.ledger, Faults(random.Random(0)), "checker")
        self.producer = self.agent.replace(store=self.store)
        self.run_ids = [
            f"{'pay' if n % profile.approval_every == 0 else 'job'}-{n:03d}"
            for n in range(profile.runs)
        ]
        self.fed = 0
        self.schedule = _schedule(profile)
        """The faults still to inflict, each at a share of the runs finished."""
        self.idle_armed: dict[str, int] = {}
        """How many looks in a row found each worker armed with a kill driving no run."""
        self.client: Any = None
        self.frozen: Frozen | None = None
        self.waiting_to_freeze = False
        self.pauses: dict[tuple[str, str], Pause] = {}
        """Each pause clicked, by run and pause."""
        self.seen: dict[str, tuple[Any, ...]] = {}
        """Where each run was when its stored summary was last read for a pause."""

    def note(self, text: str) -> None:
        elapsed = time.monotonic() - self.started
        self.report.timeline.append(f"{elapsed:7.2f}s {self.progress:4.0%} {text}")

    # -- the whole run --

    def run(self) -> Report:
        report = self.report
        try:
            self._start()
            schedule = self.schedule
            deadline = self.started + self.profile.upper_bound_s
            while True:
                self.fleet.replace_the_dead()
                finished = _retrying(self._finished)
                self.progress = finished / len(self.run_ids)
                _retrying(functools.partial(self._feed, finished))
                self._thaw()
                _retrying(self._move_idle_kills)
                for fault in [fault for fault in schedule if fault[0] <= self.progress]:
                    if self._inject(fault[1]):  # one at a time; the others next time
                        schedule.remove(fault)
                        break
                _retrying(self._approve)
                if _retrying(self._all_done):
                    break
                if time.monotonic() > deadline:
                    report.tally.problems.append(
                        f"not done after {self.profile.upper_bound_s:.0f} s"
                    )
                    break
                time.sleep(0.05)
            if schedule:
                report.tally.problems.append(f"faults not injected: {[k for _, k in schedule]}")
            self.note("done: the workers quit")
            self.fleet.quit()
            report.wall_s = time.monotonic() - self.started
            self._judge()
        finally:
            self.fleet.kill_all()
            if self.client is not None:
                self.client.destroy()
            self.store.close()
            self.ledger.close()
        return report

    def _start(self) -> None:
        """The workers (the first alone first: under DBOS it lays the tables out)."""
        for slot in self.fleet.slots:
            self.fleet.start(slot)
        self.report.faults.update(
            {f"skewed clock ({s.skew_s:+.0f} s)": 1 for s in self.fleet.slots if s.skew_s}
        )
        if self.mode == "dbos":
            from dbos import DBOSClient

            self.client = DBOSClient(
                system_database_url=self.cluster.url, dbos_system_schema=self.dbos_schema
            )

    def _outstanding(self) -> bool:
        """Whether a planned fault is still to be carried out: due, armed and not fired, or
        a worker frozen."""
        return (
            bool(self.schedule) or self.frozen is not None or any(s.armed for s in self.fleet.slots)
        )

    def _feed_limit(self, finished: int) -> int:
        """How many runs may be fed by now: all of them once every fault was carried out;
        until then all but the last ``RESERVE``, and one more each time the fleet has
        finished every run fed to it."""
        reserve = int(len(self.run_ids) * RESERVE)
        if not self._outstanding():
            return len(self.run_ids)
        if self.fed < len(self.run_ids) - reserve:
            return len(self.run_ids) - reserve
        return self.fed + 1 if finished >= self.fed else self.fed

    def _feed(self, finished: int) -> None:
        """Queue runs until ``WINDOW`` per worker are unfinished (see ``_feed_limit``): a
        producer enqueues them, in the store for the workers' ``take_next`` (leases-only;
        the ``pay-`` runs first), or on DBOS's queue."""
        limit = min(len(self.run_ids), self._feed_limit(finished))
        while self.fed < limit and self.fed - finished < WINDOW * len(self.fleet.slots):
            run_id = self.run_ids[self.fed]
            if self.mode == "leases":
                # An enqueue whose commit went unanswered (the server stopped) is not made
                # again: the run is there.
                if not self.store.exists(run_id):
                    priority = 1 if run_id.startswith("pay-") else 0
                    self.producer.enqueue(
                        f"Do the steps of {run_id}.", run_id=run_id, priority=priority
                    )
            else:
                from agent_fsm.dbos.agent import WORKFLOW_PREFIX

                options = {
                    "queue_name": QUEUE_NAME,
                    "workflow_name": WORKFLOW_PREFIX + AGENT_NAME,
                    "workflow_id": run_id,
                    "app_version": APP_VERSION,
                }
                self.client.enqueue(options, f"Do the steps of {run_id}.", run_id)
            self.fed += 1

    # -- faults --

    def _inject(self, kind: str) -> bool:
        """Inflict one fault now; False when it cannot be yet: a kill while one is still
        to come (so that they spread over the work) or while no live worker drives a run
        (it is armed in one that does), a SIGSTOP while a worker is frozen or none that is
        not armed drives a run."""
        live = self.fleet.live()
        if kind in ("kill-tool", "kill-save"):
            if any(slot.armed for slot in self.fleet.slots):
                return False
            # A worker driving a run now: it has calls and saves to come.
            holders = _retrying(self._holders)
            candidates = [s for s in live if s.name in holders]
            if not candidates:
                return False
            self.fleet.arm(self.rng.choice(candidates), kind.split("-")[1])
            self.report.faults[f"{kind} armed"] += 1
            return True
        if kind == "pg-restart":
            self.note("PostgreSQL stops")
            self.cluster.stop()
            time.sleep(self.profile.pg_down_s)
            self.cluster.start()
            self.note("PostgreSQL started")
            self.report.faults["pg-restart"] += 1
            return True
        return self.frozen is None and self._freeze(live)

    def _move_idle_kills(self) -> None:
        """Move a kill armed in a worker that has driven no run for ``IDLE_CHECKS`` looks
        in a row (its run was taken over or ended) to one that drives a run: it has calls
        and saves to come."""
        armed = [s for s in self.fleet.live() if s.armed]
        if not armed:
            self.idle_armed.clear()
            return
        holders = self._holders()
        for slot in armed:
            idle = 0 if slot.name in holders else self.idle_armed.get(slot.name, 0) + 1
            self.idle_armed[slot.name] = idle
            drivers = [s for s in self.fleet.live() if s.name in holders and not s.armed]
            if idle < IDLE_CHECKS or not drivers:
                continue
            kind = slot.armed[0]
            if self.fleet.disarm(slot, kind):
                self.fleet.arm(self.rng.choice(drivers), kind)
                self.report.faults[f"kill-{kind} moved"] += 1
            self.idle_armed.pop(slot.name, None)

    def _holders(self) -> dict[str, str]:
        """Worker name -> a run it drives now."""
        if self.mode == "leases":
            runs = self.store.list_runs(states=["OBSERVE", "THINK", "ACT", "REFLECT"])
            return {r.lease_holder: r.run_id for r in runs if r.lease_live and r.lease_holder}
        pending = self.client.list_workflows(status="PENDING", load_input=False, load_output=False)
        return {w.executor_id: w.workflow_id for w in pending}

    def _taken_over(self, victim: Slot, run_id: str) -> bool:
        if self.mode == "leases":  # the run's lease, live or last, is another worker's
            summary = next(r for r in self.store.list_runs() if r.run_id == run_id)
            return summary.lease_holder != victim.name
        from agent_fsm.dbos.recovery import LEASE_PREFIX

        if self.store.lease(LEASE_PREFIX + victim.name) is not None:
            return False
        mine = self.client.list_workflows(
            status="PENDING", executor_id=victim.name, load_input=False, load_output=False
        )
        return not mine

    def _freeze(self, live: list[Slot]) -> bool:
        """SIGSTOP a worker that drives a run; ``_thaw`` continues it once another worker
        has taken the run over."""
        holders = _retrying(self._holders)
        # Not one armed with a kill: frozen, it could not die by it.
        candidates = [s for s in live if s.name in holders and not s.armed]
        if not candidates:
            if not self.waiting_to_freeze:
                self.note("SIGSTOP waits: no worker drives a run now")
            self.waiting_to_freeze = True
            return False
        self.waiting_to_freeze = False
        victim = self.rng.choice(candidates)
        assert victim.process is not None
        victim.process.send_signal(signal.SIGSTOP)
        victim.stopped = True
        run_id = holders[victim.name]
        self.note(f"{victim.name} stopped (SIGSTOP), driving {run_id}")
        self.frozen = Frozen(victim, run_id, time.monotonic() + FREEZE_BOUND_S)
        self.report.faults["sigstop"] += 1
        return True

    def _thaw(self) -> None:
        """SIGCONT the frozen worker a moment after its run was taken over (the new holder
        goes on a little while the old one is frozen), or after an upper bound."""
        frozen = self.frozen
        if frozen is None:
            return
        now = time.monotonic()
        if frozen.taken_at is None:
            if _retrying(lambda: self._taken_over(frozen.victim, frozen.run_id)):
                frozen.taken_at = now
                self.report.faults["sigstop (its run taken over meanwhile)"] += 1
            elif now < frozen.deadline:
                return
        if frozen.taken_at is not None and now < frozen.taken_at + 0.3:
            return
        victim = frozen.victim
        if victim.process is not None:
            victim.process.send_signal(signal.SIGCONT)
        victim.stopped = False
        self.frozen = None
        taken = frozen.taken_at is not None
        self.note(f"{victim.name} continued (SIGCONT); {frozen.run_id} taken over: {taken}")

    # -- the person who approves --

    def _click(
        self, run_id: str, pause: str, calls: tuple[str, ...], blanket: bool, kind: str
    ) -> None:
        self.ledger.execute(
            "INSERT INTO clicks (run_id, pause, calls, blanket, kind) VALUES (%s, %s, %s, %s, %s)",
            (run_id, pause, list(calls), blanket, kind),
        )
        self.report.clicks[kind] += 1

    def _approve(self) -> None:
        """Click every pause seen for the first time (a double click for every other one),
        and once more, late, every pause the run has left."""
        now = {s.run_id: _where(s) for s in self.store.list_runs()}
        for run_id, where in now.items():
            if where[-1] is not StopReason.APPROVAL_REQUIRED or self.seen.get(run_id) == where:
                continue
            self.seen[run_id] = where
            result = RunResult.from_state(self.store.load(run_id))
            if result.pending is None or (run_id, result.pending.pause) in self.pauses:
                continue
            pause = result.pending.pause
            calls = tuple(call.id for call in result.pending.pending_calls)
            blanket = len(self.pauses) % 2 == 0  # approvals=True, or one per call id
            self._click(run_id, pause, calls, blanket, "prompt")
            if len(self.pauses) % 4 in (1, 2):
                self._click(run_id, pause, calls, blanket, "double")
            self.pauses[(run_id, pause)] = Pause(where, calls, blanket)
        for (run_id, pause), seen in self.pauses.items():
            if not seen.late_sent and now.get(run_id) != seen.where:
                self._click(run_id, pause, seen.calls, seen.blanket, "late")
                seen.late_sent = True

    # -- progress --

    def _finished(self) -> int:
        """The runs finished: written down by the worker that finished them, or, leases-only,
        ended in the store (a worker killed in the save of a run's last checkpoint writes
        nothing down, and no worker drives that run again: counted from the ledger alone,
        the held-back runs would wait for it for ever)."""
        done = {run_id for (run_id,) in self.ledger.execute("SELECT run_id FROM finishes")}
        if self.mode == "leases":
            done.update(summary.run_id for summary in self.store.list_runs() if _ended(summary))
        return len(done)

    def _all_done(self) -> bool:
        if self.frozen is not None or self.fed < len(self.run_ids):
            return False
        if any(not seen.late_sent for seen in self.pauses.values()):
            return False
        if self.ledger.execute("SELECT 1 FROM clicks WHERE outcome IS NULL LIMIT 1"):
            return False
        if self.mode == "leases":
            runs = self.store.list_runs()
            return len(runs) == len(self.run_ids) and all(_ended(r) for r in runs)
        if self.client.list_workflows(
            status=["ENQUEUED", "PENDING"], load_input=False, load_output=False
        ):
            return False
        finished = {
            status.output.run_id
            for status in self.client.list_workflows(status="SUCCESS", load_input=False)
            if isinstance(status.output, RunResult) and status.output.status != "needs_input"
        }
        return len(finished) == len(self.run_ids)

    # -- the verdicts --

    def _judge(self) -> None:
        report, tally, fleet = self.report, self.report.tally, self.fleet
        report.faults.update(fleet.faults)
        report.workers_started = sum(slot.incarnation + 1 for slot in fleet.slots)
        for text in fleet.logged():
            report.worker_errors.update(_ERROR.findall(text))
        tally.problems.extend(f"worker crashed: {crash}" for crash in fleet.crashed)
        for kind in ("tool", "save"):
            armed, fired = report.faults[f"kill-{kind} armed"], report.faults[f"kill-in-{kind}"]
            if fired < armed:
                tally.problems.append(f"kills in a {kind}: armed {armed}, fired {fired}")
        left = Left.read(self.ledger)
        report.effects = sum(len(rows) for rows in left.effects.values())
        report.announced_again = sum(len(seen) > 1 for seen in left.finishes.values())
        if self.mode == "leases":
            results = leases_results(
                tally, self.store, left, self.agent, self.run_ids, fleet.killed
            )
        else:
            results = dbos_results(tally, self.client, self.store, self.run_ids)
        judge(tally, left, results, self.agent, self.run_ids)
        report.finished = len(results)


def run_chaos(mode: str, profile: Profile, cluster: Cluster) -> Report:
    """One chaos run of ``mode`` (``leases`` or ``dbos``) on ``cluster``."""
    return Chaos(mode, profile, cluster).run()
