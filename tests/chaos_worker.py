"""A worker process of the chaos test (``tests/chaos.py``), in either mode, and the agent
every run of it follows.

``python -m tests.chaos_worker MODE URL SCHEMA DBOS_SCHEMA WORKER SKEW_S SEED`` opens the
fleet's ``PostgresStore`` (in ``SCHEMA``, which also holds the ledger tables below) and
works until it reads ``quit`` on stdin:

- ``leases``: ``Agent(store=..., lease_s=LEASE_S, worker_id=WORKER)``, as the README's
  "Many workers" section builds it; it takes the next runnable run (``Agent.take_next``:
  one the producer enqueued, or one whose worker died or stalled past its lease) and drives
  it, up to ``CONCURRENCY`` at once;
- ``dbos``: a ``DBOSAgent`` on that store as its journal, launched by a ``DBOSWorker``
  (executor id ``WORKER``, system tables in ``DBOS_SCHEMA``, its ``WorkerLiveness`` held
  from launch); DBOS hands it runs from ``QUEUE``.

In both modes it also answers the approvals the test "clicks" (rows of ``clicks``): it takes
one, resumes the run with it (``approvals={call_id: True}`` or ``approvals=True``, with the
pause it names) and writes down whether it was applied or refused.

**The runs.** The model is a function of the transcript: ``STEPS`` tool turns of a primary
call and ``lookup`` (idempotent), then "done". The primary call is ``send`` (not idempotent);
in a run whose id starts with ``pay-`` steps 1 and 3 are ``transfer`` instead (not
idempotent, and each waits for an approval: two pauses per run). A careless model: told
that a ``send`` "was not run" (or skipped), it sends the step again, up to ``ATTEMPTS``
times, so a "not run" that was a lie shows as a step done twice. Call ids are the model's
own (``send-2-0``: step 2, attempt 0), and the tools write them with their effect.

**The ledger** (``TABLES``): ``effects`` gets a row per execution of ``send`` or
``transfer`` (run, call id, step, worker), written through outages exactly once per
execution (a per-execution uuid; an insert whose commit went unanswered is not made again);
``finishes`` gets one per run a worker saw end (leases: ``resume`` returned it; DBOS: the
``RunFinished`` event, which a replay announces again), with a digest of its transcript.

**Faults it inflicts on itself**, when the test arms them (``arm tool`` / ``arm save`` on
stdin): a SIGKILL inside the next ``send``/``transfer`` call (before or after its effect),
or inside the next save: a checkpoint save or a journal write (leases), DBOS recording a
step's outcome or a journal write (dbos); the kill comes from a timer started as the save
begins, within about one save's time. It prints ``fault KIND DETAIL`` first (the test
counts them). ``disarm tool`` / ``disarm save`` takes an armed kill back (the test moves it
to a worker that drives a run): answered ``disarmed KIND 1``, or ``disarmed KIND 0`` when
none is left to take back (the kill is under way). ``SKEW_S``: this process's clock is
that far off (the test's launcher patches ``time.time`` before anything is imported) and
its stores and agent are given clocks that read it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import os
import queue
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from agent_fsm import Agent, CheckpointError, Limits, ResumeError, Run, RunLeased, RunResult, tool
from agent_fsm.durable.journal import JournalEntry, ToolJournal
from agent_fsm.durable.leases import Lease
from agent_fsm.durable.postgres import PostgresStore
from agent_fsm.events import Event, RunFinished
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolMessage,
    ToolStatus,
)
from agent_fsm.state import RunState
from agent_fsm.testing import FunctionModel, reply

STEPS = 3
ATTEMPTS = 3
"""How many times the careless model sends one step's ``send`` when told it was not run."""
PRIMARY = ("send", "transfer")
LEASE_S = 1.5
"""The leases-only workers' ``lease_s``."""
TTL_S = 2.0
"""The DBOS workers' liveness ``ttl_s``."""
CONCURRENCY = 2
"""Runs a leases-only worker drives at once."""
PAUSE_S = 0.01
"""A model call's and a tool call's own time: widens the windows a kill lands in."""
RETRY_S = 180.0
"""How long a ledger write waits for the server to come back: a bound for a hang only."""
APP = "agent_fsm_chaos"
APP_VERSION = "chaos-test"
AGENT_NAME = "chaos"
QUEUE_NAME = "chaos_runs"
DBOS_SETTINGS: dict[str, Any] = {
    "application_version": APP_VERSION,
    "notification_listener_polling_interval_sec": 0.05,
    "log_level": "WARNING",
}
TABLES = """
CREATE TABLE effects (
    run_id text NOT NULL, call_id text NOT NULL, step integer NOT NULL, tool text NOT NULL,
    worker text NOT NULL, execution uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE finishes (
    run_id text NOT NULL, worker text NOT NULL, stop_reason text NOT NULL,
    output text, digest text, execution uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE clicks (
    id serial PRIMARY KEY, run_id text NOT NULL, pause text NOT NULL,
    calls text[] NOT NULL, blanket boolean NOT NULL, kind text NOT NULL,
    clicked_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    holder text, held_until timestamptz, holders text[] NOT NULL DEFAULT '{}',
    outcome text, handled_by text, detail text)
"""
"""The ledger, in the fleet's schema (made by the test before the workers start)."""
CLICK_HOLD_S = 10
"""How long a worker holds a click it took before another may take it (it died)."""


def plan(run_id: str) -> list[str]:
    """The primary tool of each step of ``run_id``."""
    if run_id.startswith("pay-"):
        return ["transfer", "send", "transfer"]
    return ["send"] * STEPS


def said_not_run(answer: ToolMessage) -> bool:
    """The answer says the call did not happen (not: its outcome is unknown, nor: it waits
    for an approval)."""
    runtime = answer.details.get("runtime") if isinstance(answer.details, dict) else None
    if isinstance(runtime, dict) and runtime.get("awaiting_approval"):
        return False
    return answer.status is ToolStatus.SKIPPED or "was not run" in answer.content


def _turn(run_id: str, step: int, attempt: int) -> ModelResponse:
    kind = plan(run_id)[step - 1]
    call_id = f"{kind}-{step}-{attempt}"
    arguments = json.dumps({"run": run_id, "step": step, "call": call_id})
    return reply(
        "",
        ToolCall(id=call_id, name=kind, arguments=arguments),
        ToolCall(id=f"lookup-{step}-{attempt}", name="lookup", arguments=json.dumps({"key": step})),
    )


async def model(request: ModelRequest) -> ModelResponse:
    """The careless model (see the module docstring)."""
    await asyncio.sleep(PAUSE_S)
    answers = {m.tool_call_id: m for m in request.messages if isinstance(m, ToolMessage)}
    primary = [
        c
        for m in request.messages
        if isinstance(m, AssistantMessage)
        for c in m.tool_calls
        if c.name in PRIMARY
    ]
    if not primary:
        return _turn(request.run_id, 1, 0)
    last = primary[-1]
    step = int(json.loads(last.arguments)["step"])
    attempt = int(last.id.rsplit("-", 1)[1])
    answer = answers.get(last.id)
    told_not_run = last.name == "send" and answer is not None and said_not_run(answer)
    if told_not_run and attempt + 1 < ATTEMPTS:
        return _turn(request.run_id, step, attempt + 1)
    if step >= len(plan(request.run_id)):
        return reply("done")
    return _turn(request.run_id, step + 1, 0)


LIMITS = Limits(
    max_turns=STEPS * ATTEMPTS + 3,
    max_consecutive_errors=STEPS * ATTEMPTS + 3,
    timeout_s=600.0,
    tool_timeout_s=RETRY_S + 60.0,
    loop_detection=False,
)
"""Far from every limit: a run of the chaos test ends "done", unless something broke. The
time limit (600 s) is far above a run's real time and far below the skewed clock's hour, so
a deadline read on two clocks shows."""


def digest(messages: list[Message]) -> str:
    """A digest of a transcript: the same run result reads the same."""
    dumped = json.dumps([m.model_dump(mode="json") for m in messages], sort_keys=True)
    return hashlib.sha256(dumped.encode()).hexdigest()[:16]


# -- the ledger -----------------------------------------------------------------------------


class Ledger:
    """This process's connection to the ledger tables, shared by its threads under a lock,
    made again when the server went away (a write waits for it, up to ``RETRY_S``)."""

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.schema = url, schema
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=5)
            conn.execute("SELECT set_config('search_path', quote_ident(%s), false)", (self.schema,))
            self._conn = conn
        return self._conn

    def execute(self, statement: str, params: Any = ()) -> list[tuple[Any, ...]]:
        """Run one statement (autocommit) and return its rows. A statement that fails for a
        lost connection is run again on a new one: it must be one that may (a write carries
        an ``execution`` id it checks first)."""
        deadline = time.monotonic() + RETRY_S
        while True:
            with self._lock:
                try:
                    cursor = self._connect().execute(statement, params)
                    return cursor.fetchall() if cursor.description is not None else []
                except (psycopg.OperationalError, psycopg.InterfaceError):
                    if self._conn is not None:
                        with contextlib.suppress(Exception):
                            self._conn.close()
                    self._conn = None
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.1)

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def record_effect(self, run: str, call: str, step: int, kind: str, worker: str) -> None:
        execution = uuid.uuid4()
        self.execute(
            "INSERT INTO effects (run_id, call_id, step, tool, worker, execution)"
            " SELECT %s, %s, %s, %s, %s, %s"
            " WHERE NOT EXISTS (SELECT 1 FROM effects WHERE execution = %s)",
            (run, call, step, kind, worker, execution, execution),
        )

    def record_finish(
        self, run_id: str, worker: str, stop_reason: str, output: str | None, text: str | None
    ) -> None:
        execution = uuid.uuid4()
        self.execute(
            "INSERT INTO finishes (run_id, worker, stop_reason, output, digest, execution)"
            " SELECT %s, %s, %s, %s, %s, %s"
            " WHERE NOT EXISTS (SELECT 1 FROM finishes WHERE execution = %s)",
            (run_id, worker, stop_reason, output, text, execution, execution),
        )

    def take_click(self, worker: str) -> Click | None:
        """A click nobody answered yet and no live worker holds, now held by ``worker``."""
        found = self.execute(
            "UPDATE clicks SET holder = %s, holders = holders || %s::text,"
            " held_until = clock_timestamp() + make_interval(secs => %s)"
            " WHERE id = (SELECT id FROM clicks WHERE outcome IS NULL"
            "   AND (held_until IS NULL OR held_until < clock_timestamp())"
            "   ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)"
            " RETURNING id, run_id, pause, calls, blanket",
            (worker, worker, CLICK_HOLD_S),
        )
        if not found:
            return None
        number, run_id, pause, calls, blanket = found[0]
        return Click(number, run_id, pause, tuple(calls), blanket)

    def answer_click(self, click: Click, worker: str, outcome: str, detail: str) -> None:
        """The click's outcome; the first one written stands."""
        self.execute(
            "UPDATE clicks SET outcome = %s, handled_by = %s, detail = %s"
            " WHERE id = %s AND outcome IS NULL",
            (outcome, worker, detail[:300], click.number),
        )

    def release_click(self, click: Click, worker: str) -> None:
        """Give the click back (the run was busy, or the server away): tried again later."""
        self.execute(
            "UPDATE clicks SET held_until = NULL WHERE id = %s AND holder = %s AND outcome IS NULL",
            (click.number, worker),
        )


@dataclass(frozen=True, slots=True)
class Click:
    """A person's approval of one pause: every call it showed (``blanket``: as one
    ``approvals=True``, with the pause)."""

    number: int
    run_id: str
    pause: str
    calls: tuple[str, ...]
    blanket: bool

    @property
    def decisions(self) -> bool | dict[str, bool]:
        return True if self.blanket else dict.fromkeys(self.calls, True)


# -- faults --------------------------------------------------------------------------------


@dataclass
class Faults:
    """The kills armed in this process (by the test, on stdin), each taken once."""

    rng: random.Random
    armed: collections.Counter[str] = field(default_factory=collections.Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def arm(self, kind: str) -> None:
        with self.lock:
            self.armed[kind] += 1

    def take(self, kind: str) -> bool:
        with self.lock:
            if self.armed[kind] > 0:
                self.armed[kind] -= 1
                return True
            return False

    def disarm(self, kind: str) -> bool:
        """Take back one kill of ``kind`` (``tool``, or ``save``: a save of any kind) not
        yet taken; False when none is left (the kill is under way)."""
        with self.lock:
            for armed in sorted(self.armed):
                if self.armed[armed] > 0 and armed.split(":")[0] == kind:
                    self.armed[armed] -= 1
                    return True
            return False

    def choose(self, *kinds: str) -> str:
        return self.rng.choice(kinds)

    @staticmethod
    def die(what: str) -> None:
        """SIGKILL this process now, saying why first."""
        print(f"fault {what}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # the signal is on its way

    def die_within(self, what: str, seconds: float) -> None:
        """SIGKILL this process from a timer within ``seconds`` (the save it is about to
        make is then under way, or just made), saying why first."""
        print(f"fault {what}", flush=True)
        delay = self.rng.uniform(0.0, seconds)

        def kill() -> None:
            time.sleep(delay)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=kill, daemon=True).start()

    @staticmethod
    def await_death() -> None:
        """Block until the armed timer's kill arrives (the save returned first)."""
        time.sleep(60)


class Timed:
    """A running mean of how long one kind of save takes: the window a kill is drawn in."""

    def __init__(self, first_s: float) -> None:
        self.mean_s = first_s

    def measure(self, work: Callable[[], Any]) -> Any:
        started = time.perf_counter()
        try:
            return work()
        finally:
            self.mean_s = 0.9 * self.mean_s + 0.1 * (time.perf_counter() - started)


class KillingJournal:
    """A run's tool journal whose next write dies when a journal kill is armed."""

    def __init__(self, inner: ToolJournal, faults: Faults, timed: Timed, run_id: str) -> None:
        self.inner, self.faults, self.timed, self.run_id = inner, faults, timed, run_id

    def lookup(self, key: str) -> JournalEntry | None:
        return self.inner.lookup(key)

    def record_started(self, key: str, call: ToolCall) -> None:
        self._write("record_started", key, lambda: self.inner.record_started(key, call))

    def record_finished(self, key: str, result: ToolMessage) -> None:
        self._write("record_finished", key, lambda: self.inner.record_finished(key, result))

    def finish_first(self, key: str, result: ToolMessage) -> JournalEntry | None:
        """A DBOS tool call made without a step records its end so (``FirstFinish``)."""
        found: list[JournalEntry | None] = []
        inner: Any = self.inner
        self._write("finish_first", key, lambda: found.append(inner.finish_first(key, result)))
        return found[-1]

    def _write(self, what: str, key: str, work: Callable[[], None]) -> None:
        if self.faults.take("save:journal"):
            self.faults.die_within(
                f"kill-in-save journal.{what} {self.run_id} {key}", 2 * self.timed.mean_s
            )
            work()
            self.faults.await_death()
        self.timed.measure(work)


class KillingStore(PostgresStore):
    """The fleet's store, whose next checkpoint save or journal write dies when a kill
    is armed."""

    def __init__(
        self, url: str, *, schema: str, faults: Faults, clock: Callable[[], float]
    ) -> None:
        super().__init__(url, schema=schema, clock=clock)
        self.faults = faults
        self.saves = Timed(0.002)
        self.journal_writes = Timed(0.002)

    def save(self, state: RunState, *, lease: Lease | None = None) -> Lease | None:
        if self.faults.take("save:checkpoint"):
            self.faults.die_within(
                f"kill-in-save checkpoint {state.run_id} {state.state}", 2 * self.saves.mean_s
            )
            super().save(state, lease=lease)
            self.faults.await_death()
        saved: Lease | None = self.saves.measure(
            lambda: super(KillingStore, self).save(state, lease=lease)
        )
        return saved

    def journal(self, run_id: str, *, lease: Lease | None = None) -> ToolJournal:
        inner = super().journal(run_id, lease=lease)
        return KillingJournal(inner, self.faults, self.journal_writes, run_id)  # type: ignore[return-value]


def kill_inside_step_records(faults: Faults) -> None:
    """DBOS: a step kill dies while DBOS writes a step's outcome (``operation_outputs``)."""
    import sqlalchemy as sa

    def before(
        conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
    ) -> None:
        if (
            "operation_outputs" in statement
            and statement.lstrip().upper().startswith("INSERT")
            and faults.take("save:step")
        ):
            workflow = params.get("workflow_uuid", "?") if isinstance(params, dict) else "?"
            faults.die_within(f"kill-in-save step {workflow}", 0.002)

    sa.event.listen(sa.engine.Engine, "before_cursor_execute", before)


# -- the agent -------------------------------------------------------------------------------


def chaos_agent(ledger: Ledger, faults: Faults, worker: str, **options: Any) -> Agent:
    """The agent every run follows (see the module docstring); ``options`` are more
    ``Agent`` settings."""

    def effect(kind: str, run: str, step: int, call: str) -> str:
        kill = faults.take("tool")
        where = faults.choose("before", "after") if kill else ""
        time.sleep(PAUSE_S)
        if where == "before":
            faults.die(f"kill-in-tool {run} {call} before-effect")
        ledger.record_effect(run, call, step, kind, worker)
        if where == "after":
            faults.die(f"kill-in-tool {run} {call} after-effect")
        time.sleep(PAUSE_S)
        return f"{kind} {step} done"

    @tool
    def send(run: str, step: int, call: str) -> str:
        """Send the message of one step (not idempotent)."""
        return effect("send", run, step, call)

    @tool(requires_approval=True)
    def transfer(run: str, step: int, call: str) -> str:
        """Move money (not idempotent; a person approves each call)."""
        return effect("transfer", run, step, call)

    @tool(idempotent=True)
    def lookup(key: int) -> int:
        """Look a value up."""
        time.sleep(PAUSE_S)
        return key * key

    return Agent(
        model=FunctionModel(model),
        tools=[send, transfer, lookup],
        limits=LIMITS,
        **options,
    )


# -- the two kinds of worker -----------------------------------------------------------------


class Control:
    """What the test says on stdin: faults to arm, and when to quit."""

    def __init__(self, faults: Faults, mode: str) -> None:
        self.faults = faults
        self.mode = mode
        self.quit = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            words = line.split()
            if words[:1] == ["quit"]:
                break
            if words[:2] == ["arm", "tool"]:
                self.faults.arm("tool")
            elif words[:2] == ["arm", "save"]:
                kinds = ("checkpoint", "checkpoint", "journal")
                if self.mode == "dbos":
                    kinds = ("step", "step", "journal")
                self.faults.arm("save:" + self.faults.choose(*kinds))
            elif words[:1] == ["disarm"] and len(words) == 2:
                print(f"disarmed {words[1]} {int(self.faults.disarm(words[1]))}", flush=True)
        self.quit.set()  # quit, or the test has gone


def _finished(result: RunResult) -> bool:
    return result.status != "needs_input"


class LeaseWorker:
    """Drives the runs that have not stopped, and answers clicks, under leases."""

    def __init__(
        self, agent: Agent, store: PostgresStore, ledger: Ledger, control: Control
    ) -> None:
        self.agent, self.store, self.ledger, self.control = agent, store, ledger, control
        self.worker = agent.worker_id or "?"
        self.driving: dict[str, asyncio.Task[None]] = {}

    async def work(self) -> None:
        while not self.control.quit.is_set():
            if len(self.driving) < CONCURRENCY:
                click = await asyncio.to_thread(self.ledger.take_click, self.worker)
                if click is not None:
                    self._spawn(f"click-{click.number}", self._click(click))
                    continue
                if (run := self._take_next()) is not None:
                    self._spawn(run.run_id, self._drive(run))
                    continue
            await asyncio.sleep(0.05)
        # The test says quit once every run stopped: let a finisher write it down.
        if self.driving:
            await asyncio.wait(list(self.driving.values()), timeout=RETRY_S)
        for task in list(self.driving.values()):
            task.cancel()

    def _spawn(self, name: str, work: Any) -> None:
        task = asyncio.create_task(work)
        self.driving[name] = task
        task.add_done_callback(lambda _: self.driving.pop(name, None))

    def _take_next(self) -> Run | None:
        """The next runnable run, claimed under this worker's lease (``Agent.take_next``:
        queued, or left by a worker that died or stalled), as the README's worker loop
        takes it; None when none is, or the server is away."""
        try:
            return self.agent.take_next()
        except CheckpointError as exc:
            _log(f"error take_next: {_named(exc)}")
            return None

    async def _drive(self, run: Run) -> None:
        try:
            result = await run.run()
        except RunLeased:
            return  # this worker stalled past its lease: another one carries the run on
        except Exception as exc:  # the server went away mid-run: its lease lapses
            _log(f"error run {run.run_id}: {_named(exc)}")
            return
        await self._record(result)

    async def _click(self, click: Click) -> None:
        try:
            result = await self.agent.resume(
                click.run_id, approvals=click.decisions, pause=click.pause
            )
        except Exception as exc:
            await answered(self.ledger, click, self.worker, exc)
            return
        await answered(self.ledger, click, self.worker, None)
        await self._record(result)

    async def _record(self, result: RunResult) -> None:
        if _finished(result):
            await asyncio.to_thread(
                self.ledger.record_finish,
                result.run_id,
                self.worker,
                result.stop_reason.value,
                result.output,
                digest(result.messages),
            )


async def answered(ledger: Ledger, click: Click, worker: str, failed: Exception | None) -> None:
    """Write down how a click went: applied (``failed`` is None), refused (a
    ``ResumeError``); otherwise (another worker holds the run, the server is away) give it
    back to be tried again."""
    if failed is None:
        await asyncio.to_thread(ledger.answer_click, click, worker, "applied", "")
    elif isinstance(failed, ResumeError):
        await asyncio.to_thread(ledger.answer_click, click, worker, "refused", str(failed))
    else:
        if not isinstance(failed, RunLeased):
            _log(f"error click {click.number} on {click.run_id}: {_named(failed)}")
        await asyncio.to_thread(ledger.release_click, click, worker)


def _named(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


def lease_main(url: str, schema: str, worker: str, skew_s: float, faults: Faults) -> None:
    ledger = Ledger(url, schema)
    control = Control(faults, "leases")
    store = KillingStore(url, schema=schema, faults=faults, clock=time.time)
    with store:
        agent = chaos_agent(
            ledger,
            faults,
            worker,
            store=store,
            lease_s=LEASE_S,
            worker_id=worker,
            clock=lambda: time.monotonic() + skew_s,
        )
        print("ready", flush=True)
        asyncio.run(LeaseWorker(agent, store, ledger, control).work())


class Announcements:
    """DBOS: every ``RunFinished`` of a finished run, written to ``finishes`` by a thread of
    its own (an event handler runs on the run's event loop, which must not wait for the
    server)."""

    def __init__(self, ledger: Ledger, worker: str) -> None:
        self.ledger, self.worker = ledger, worker
        self.queue: queue.Queue[RunFinished] = queue.Queue()
        threading.Thread(target=self._write, daemon=True).start()

    def __call__(self, event: Event) -> None:
        if isinstance(event, RunFinished) and event.status != "needs_input":
            self.queue.put(event)

    def _write(self) -> None:
        while True:
            event = self.queue.get()
            self.ledger.record_finish(
                event.run_id, self.worker, event.stop_reason.value, event.output, None
            )


class DBOSClicks:
    """DBOS: answers clicks, half through ``resume`` (awaited here), half through
    ``enqueue_resume``."""

    def __init__(self, agent: Any, ledger: Ledger, control: Control, worker: str) -> None:
        self.agent, self.ledger, self.control, self.worker = agent, ledger, control, worker
        self.tasks: set[asyncio.Task[None]] = set()

    async def work(self) -> None:
        while not self.control.quit.is_set():
            click = await asyncio.to_thread(self.ledger.take_click, self.worker)
            if click is None:
                await asyncio.sleep(0.05)
                continue
            task = asyncio.create_task(self._click(click))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    async def _click(self, click: Click) -> None:
        try:
            if click.number % 2:
                await self.agent.enqueue_resume(
                    click.run_id, approvals=click.decisions, pause=click.pause
                )
            else:
                await self.agent.resume(click.run_id, approvals=click.decisions, pause=click.pause)
        except Exception as exc:
            await answered(self.ledger, click, self.worker, exc)
            return
        await answered(self.ledger, click, self.worker, None)


def dbos_main(
    url: str, schema: str, dbos_schema: str, worker: str, skew_s: float, faults: Faults
) -> None:
    from agent_fsm.dbos import DBOSAgent, DBOSWorker, RunQueue, WorkerLiveness

    ledger = Ledger(url, schema)
    control = Control(faults, "dbos")
    kill_inside_step_records(faults)
    queue_ = RunQueue(name=QUEUE_NAME, worker_concurrency=4, polling_interval_s=0.05)
    with KillingStore(url, schema=schema, faults=faults, clock=time.time) as journal:
        agent = chaos_agent(
            ledger,
            faults,
            worker,
            handlers=[Announcements(ledger, worker)],
            clock=lambda: time.monotonic() + skew_s,
        )
        durable = DBOSAgent(agent, journal=journal, name=AGENT_NAME, queue=queue_)
        liveness = WorkerLiveness(journal, ttl_s=TTL_S)
        with DBOSWorker(
            APP,
            url,
            liveness=liveness,
            executor_id=worker,
            pool_size=6,
            dbos_schema=dbos_schema,
            config=DBOS_SETTINGS,
        ):
            asyncio.run(queue_.register())
            print("ready", flush=True)
            asyncio.run(DBOSClicks(durable, ledger, control, worker).work())
        print(f"recovered {','.join(liveness.recovered)}", flush=True)


def main(
    mode: str, url: str, schema: str, dbos_schema: str, worker: str, skew_s: str, seed: str
) -> int:
    faults = Faults(random.Random(f"{seed}/{worker}"))
    random.seed(f"{seed}/{worker}/runs")
    if mode == "leases":
        lease_main(url, schema, worker, float(skew_s), faults)
    else:
        dbos_main(url, schema, dbos_schema, worker, float(skew_s), faults)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:8]))
