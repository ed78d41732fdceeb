"""The chaos test's machinery (``tests/chaos.py``): its profiles, its own PostgreSQL cluster
(which it stops and starts), the worker processes in their slots, and the report.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from tests.chaos_checks import Tally

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "postgres.sh"
READY_BOUND_S = 120.0
"""How long a worker may take to start: a bound for a hang, not a measure."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """How big the fleet is and how hard it is attacked."""

    runs: int
    workers: int
    kills_in_tools: int
    kills_in_saves: int
    pg_restarts: int
    pg_down_s: float
    """How long PostgreSQL stays stopped: longer than a lease, so that every lease expires."""
    sigstops: int
    skews: tuple[float, ...]
    """The clock skew (seconds) of worker slots 1, 2, ...; slot 0 keeps the right time."""
    approval_every: int
    """Every n-th run (``pay-NNN``) pauses twice for approvals."""
    seed: int
    upper_bound_s: float
    """How long the whole run may take: a limit for a hung fleet, not a measure."""

    def __post_init__(self) -> None:
        if self.workers < 2 or self.workers <= len(self.skews):
            raise ValueError("at least 2 workers, and one more than the skewed slots")
        if self.runs < 1 or self.approval_every < 1:
            raise ValueError("at least one run, and approval_every >= 1")


CI = Profile(
    runs=24,
    workers=4,
    kills_in_tools=1,
    kills_in_saves=1,
    pg_restarts=1,
    pg_down_s=2.5,
    sigstops=1,
    skews=(-3600.0,),
    approval_every=4,
    seed=20260305,
    upper_bound_s=900.0,
)
"""The profile ``tests/test_chaos.py`` runs: every kind of fault once, few runs."""

FULL = Profile(
    runs=240,
    workers=5,
    kills_in_tools=8,
    kills_in_saves=8,
    pg_restarts=2,
    pg_down_s=4.0,
    sigstops=3,
    skews=(3600.0, -3600.0),
    approval_every=5,
    seed=20260306,
    upper_bound_s=3600.0,
)
"""``make chaos``'s profile (``scripts/chaos.py``)."""


# -- the cluster -----------------------------------------------------------------------------


class Cluster:
    """A PostgreSQL cluster of the chaos run's own (``scripts/postgres.sh``), which it
    stops and starts mid-run: never a shared one."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.url = (directory / "url").read_text().strip()
        self.bindir = (directory / "bindir").read_text().strip()
        self.port = urlsplit(self.url).port

    @classmethod
    @contextlib.contextmanager
    def started(cls, *, install: bool, watch: int | None = None) -> Iterator[Cluster]:
        """A new cluster, stopped and deleted afterwards (``watch``: also once that process
        has exited, however it ended). Raises ``RuntimeError`` saying why when it cannot
        start."""
        directory = Path(tempfile.mkdtemp(prefix="agent-fsm-chaos-pg."))
        command = ["bash", str(SCRIPT), "start", "--dir", str(directory)]
        if not install:
            command.append("--no-install")
        if watch is not None:
            command += ["--watch", str(watch)]
        started = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if started.returncode != 0:
            with contextlib.suppress(OSError):
                directory.rmdir()
            raise RuntimeError(f"{SCRIPT.name} start failed: {started.stderr.strip()[-500:]}")
        try:
            yield cls(directory)
        finally:
            subprocess.run(["bash", str(SCRIPT), "stop", str(directory)], timeout=120, check=False)

    def _pg_ctl(self, *args: str) -> None:
        command = [f"{self.bindir}/pg_ctl", "-D", str(self.directory / "data"), *args]
        if os.getuid() == 0:  # the server runs as its owner (scripts/postgres.sh)
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, timeout=120, stdout=subprocess.DEVNULL)

    def stop(self) -> None:
        """Stop the server: sessions are ended, transactions in flight rolled back."""
        self._pg_ctl("-m", "fast", "-w", "stop")

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.directory}"
        log = str(self.directory / "server.log")
        self._pg_ctl("-l", log, "-w", "-t", "60", "-o", options, "start")


# -- the fleet -------------------------------------------------------------------------------

LAUNCHER = """\
import runpy, sys, time
skew = float(sys.argv[6])
if skew:
    real, real_ns = time.time, time.time_ns
    time.time = lambda: real() + skew
    time.time_ns = lambda: real_ns() + int(skew * 1e9)
runpy.run_module("tests.chaos_worker", run_name="__main__")
"""
"""Starts a worker with its clock ``skew`` seconds off, patched before anything reads it."""


@dataclass
class Slot:
    """One place in the fleet: a worker process, replaced by a new one when it dies."""

    index: int
    skew_s: float
    incarnation: int = -1
    process: subprocess.Popen[str] | None = None
    started_at: float = 0.0
    lines: list[str] = field(default_factory=list)
    ready: threading.Event = field(default_factory=threading.Event)
    reader: threading.Thread | None = None
    """Reads the process's stdout until it ends (and closes it)."""
    stopped: bool = False
    """SIGSTOPped now."""
    armed: list[str] = field(default_factory=list)
    """The kills this slot's worker was told to die by and has not yet died by (``tool``,
    ``save``): a worker that dies by one loses the others, so its successor gets them."""

    @property
    def name(self) -> str:
        return f"w{self.index}.{self.incarnation}"


class Fleet:
    """The worker processes of one chaos run, in their slots (``note`` is told what
    happens to them)."""

    def __init__(
        self,
        mode: str,
        profile: Profile,
        args: list[str],
        note: Callable[[str], None],
    ) -> None:
        self.mode, self.profile, self.args, self.note = mode, profile, args, note
        self.logs = Path(tempfile.mkdtemp(prefix=f"agent-fsm-chaos-{mode}."))
        skews = (0.0, *profile.skews)
        self.slots = [Slot(n, skews[n] if n < len(skews) else 0.0) for n in range(profile.workers)]
        self.faults: collections.Counter[str] = collections.Counter()
        self.killed: set[str] = set()
        """The workers that died by a kill they were armed with."""
        self.crashed: list[str] = []
        self.quitting = False

    def start(self, slot: Slot, *, wait: bool = True) -> None:
        """Start a new worker in ``slot`` (``wait``: until it is ready)."""
        slot.incarnation += 1
        slot.lines, slot.ready = [], threading.Event()
        with (self.logs / f"{slot.name}.err").open("w") as stderr:
            slot.process = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    LAUNCHER,
                    self.mode,
                    *self.args,
                    slot.name,
                    str(slot.skew_s),
                    str(self.profile.seed),
                ],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
            )
        slot.started_at = time.monotonic()
        slot.reader = threading.Thread(target=_read, args=(slot, slot.process), daemon=True)
        slot.reader.start()
        for kind in slot.armed:  # read once it listens
            self.tell(slot, f"arm {kind}")
        if wait and not slot.ready.wait(READY_BOUND_S):
            raise RuntimeError(f"worker {slot.name} did not start: {self.tail(slot)}")

    def tail(self, slot: Slot) -> str:
        return (self.logs / f"{slot.name}.err").read_text(errors="replace")[-2000:]

    def live(self) -> list[Slot]:
        """The workers running now: started, ready, not frozen."""
        return [
            s
            for s in self.slots
            if s.process is not None
            and s.process.poll() is None
            and s.ready.is_set()
            and not s.stopped
        ]

    def tell(self, slot: Slot, command: str) -> None:
        assert slot.process is not None
        assert slot.process.stdin is not None
        with contextlib.suppress(OSError):
            slot.process.stdin.write(command + "\n")
            slot.process.stdin.flush()

    def arm(self, slot: Slot, kind: str) -> None:
        """Tell ``slot``'s worker to die inside its next ``kind`` (``tool``, ``save``)."""
        slot.armed.append(kind)
        self.tell(slot, f"arm {kind}")
        self.note(f"{slot.name} armed: kill in {kind}")

    def disarm(self, slot: Slot, kind: str) -> bool:
        """Take back the kill of ``kind`` armed in ``slot``'s worker; False when it could
        not be (the kill is under way, or the worker ended: ``replace_the_dead`` counts
        it). Waits for the worker's answer (a bound for a hang, not a measure)."""
        assert slot.process is not None
        seen = len(slot.lines)
        self.tell(slot, f"disarm {kind}")
        deadline = time.monotonic() + READY_BOUND_S
        while slot.process.poll() is None and time.monotonic() < deadline:
            answers = [line for line in slot.lines[seen:] if line.startswith(f"disarmed {kind} ")]
            if answers:
                if answers[0].endswith(" 1"):
                    slot.armed.remove(kind)
                    self.note(f"{slot.name} disarmed: kill in {kind}")
                    return True
                return False
            time.sleep(0.01)
        return False

    def replace_the_dead(self) -> None:
        """Count the workers that died (by a fault they were armed with, or otherwise) and
        start new ones in their places, without waiting for them."""
        for slot in self.slots:
            process = slot.process
            if process is None:
                continue
            if process.poll() is None:
                if not slot.ready.is_set() and time.monotonic() - slot.started_at > READY_BOUND_S:
                    self.crashed.append(f"{slot.name} did not start: {self.tail(slot)}")
                    process.kill()
                continue
            _retire(slot, process)  # the reader has the last lines
            faults = [line.split()[1:] for line in slot.lines if line.startswith("fault ")]
            if process.returncode == -signal.SIGKILL and faults:
                kind = faults[-1][0]
                detail = faults[-1][1] if kind == "kill-in-save" else faults[-1][-1]
                self.faults[kind] += 1
                self.faults[f"{kind} ({detail})"] += 1
                self.killed.add(slot.name)
                with contextlib.suppress(ValueError):
                    slot.armed.remove(kind.removeprefix("kill-in-"))
                self.note(f"{slot.name} killed: {' '.join(faults[-1])}")
            elif not slot.ready.is_set() and not self.quitting:
                # It could not start (PostgreSQL is away): as a supervisor would, start
                # another. Its stderr says why.
                self.faults["workers that could not start (PostgreSQL away)"] += 1
                self.note(f"{slot.name} could not start: exited {process.returncode}")
            elif not self.quitting:
                self.crashed.append(f"{slot.name} exited {process.returncode}: {self.tail(slot)}")
                self.note(f"{slot.name} exited {process.returncode}")
            slot.process = None
            if not self.quitting:
                self.start(slot, wait=False)
                self.note(f"{slot.name} starts" + (f", armed: {slot.armed}" if slot.armed else ""))

    def quit(self) -> None:
        """Tell every worker to quit, and wait for them."""
        self.quitting = True
        for slot in self.slots:
            if slot.process is not None and slot.process.poll() is None:
                if slot.stopped:
                    slot.process.send_signal(signal.SIGCONT)
                self.tell(slot, "quit")
        for slot in self.slots:
            if slot.process is None:
                continue
            try:
                slot.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                slot.process.kill()
                slot.process.wait()
                self.crashed.append(f"{slot.name} did not quit: {self.tail(slot)}")
        self.replace_the_dead()

    def kill_all(self) -> None:
        """Kill the workers still running (a test that failed midway), and close every
        pipe."""
        for slot in self.slots:
            if slot.process is not None:
                if slot.process.poll() is None:
                    slot.process.kill()
                _retire(slot, slot.process)
                slot.process = None

    def logged(self) -> Iterator[str]:
        """The stderr of every worker process that ran."""
        for slot in self.slots:
            for n in range(slot.incarnation + 1):
                yield (self.logs / f"w{slot.index}.{n}.err").read_text(errors="replace")


def _read(slot: Slot, process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    lines = slot.lines
    with process.stdout:
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line == "ready\n":
                slot.ready.set()


def _retire(slot: Slot, process: subprocess.Popen[str]) -> None:
    """Wait for a process that ended (or was killed), its reader to read its last lines,
    and close its pipes."""
    process.wait()
    if slot.reader is not None:
        slot.reader.join(timeout=30)
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()


# -- the report ------------------------------------------------------------------------------


@dataclass
class Report:
    """The figures of one chaos run, and every problem found."""

    mode: str
    profile: Profile
    logs: Path
    """Where the workers' stderr went (a file per worker process)."""
    workers_started: int = 0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    clicks: collections.Counter[str] = field(default_factory=collections.Counter)
    effects: int = 0
    tally: Tally = field(default_factory=Tally)
    finished: int = 0
    announced_again: int = 0
    worker_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    """What the workers' resumes and clicks raised besides RunLeased and ResumeError, by
    exception (the server away, mostly)."""
    wall_s: float = 0.0
    timeline: list[str] = field(default_factory=list)
    """What the test did and saw, when (seconds from the start, and the runs finished)."""

    @property
    def problems(self) -> list[str]:
        return self.tally.problems

    def summary(self) -> str:
        p, t = self.profile, self.tally

        def listed(counts: collections.Counter[str]) -> str:
            return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) or "none"

        lines = [
            f"chaos test, {self.mode}: {p.runs} runs on {p.workers} worker slots"
            f" ({self.workers_started} worker processes in all), seed {p.seed}",
            f"  runs finished: {self.finished}/{p.runs}",
            f"  faults injected: {listed(self.faults)}",
            f"  approvals clicked: {listed(self.clicks)}",
            f"  effects: {self.effects}, duplicated: {t.duplicates} (per call),"
            f" {t.step_duplicates} (per step)",
            f"  answers to non-idempotent calls: {listed(t.answers)}",
            *(f"    answered with an error: {text}" for text in t.strange[:5]),
            f"  invariant violations: {t.invariant_violations}",
            f"  ends announced again (DBOS replays): {self.announced_again}",
            f"  worker errors (a resume or click raised): {listed(self.worker_errors)}",
            f"  wall time: {self.wall_s:.1f} s",
            f"  problems: {len(self.problems)}",
        ]
        lines += [f"    {problem}" for problem in self.problems[:40]]
        return "\n".join(lines)
