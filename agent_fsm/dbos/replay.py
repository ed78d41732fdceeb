"""What makes one run replay-safe under DBOS: its recorded clock, its deadline, its random
numbers, and the steps that record them.

DBOS recovers a workflow by calling its function again from the start: each step it reaches
returns the outcome recorded the first time (checked by the step's position and name), and
the first step with no record runs for real. So the engine must reach the same steps, in the
same order, with the same arguments, every time it is replayed. Its model and tool calls are
steps (``agent_fsm.dbos.steps``); what else it reads that could differ between two
executions is made a function of the recorded outcomes here:

- **the clock** (``RunConfig.clock``): seconds since the activation's recorded start, which
  its first model, tool or sleep step records with its own outcome (``RunTime.step``: no
  step of its own), advanced only by the end times that steps record (a step returns when
  it ended). It stands still between
  steps, so the engine's ``elapsed_s`` and the ``time_is_up`` guard read the same values on
  every execution. Every time recorded or compared is read on *one* clock, the fleet's
  (``liveness.WorkerLiveness.now``: the lease store's), never a worker's own time of day: a
  run started on a worker whose clock is an hour off and recovered on another one keeps
  its deadline;
- **the deadline** (``RunConfig.arm_deadline``): no real-time timer. Each step enforces the
  run's deadline itself (``remaining_s``), and a step cut by it records so; the clock then
  reads exactly ``Limits.timeout_s`` (``cut``), so the guard trips at the same point of
  every execution;
- **random numbers** (``RunConfig.random``): one generator per run, seeded with the run id,
  drawn only in the run's own task, in an order the recorded outcomes decide;
- **the backoff sleep** (``RunConfig.sleep``): a step that sleeps (cut at the deadline) and
  records when it woke. It waits with the agent's own ``sleep`` (``Agent(sleep=...)``), so a
  fake one keeps tests instant here too.

The run id is the workflow's argument, chosen before the workflow starts. A resumed run is a
workflow of its own per resume (``agent_fsm.dbos.pausing``), with a clock, a deadline and a
random generator of its own (seeded with the resume's workflow id), as ``Agent.resume``
gives each activation a fresh time budget. ``RunTime`` is the per-activation record of all
this; it is found through a context variable because the functions the
engine calls (a tool's function, the clock) are the agent's, shared by its runs, and get no
run to look in.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from dbos import DBOS, StepInfo, StepOptions

from agent_fsm.dbos.liveness import Admission
from agent_fsm.durable.journal import (
    FinishingLookup,
    FirstFinish,
    FirstFinishingLookup,
    JournalEntry,
    PairedLookup,
    StartingLookup,
    ToolJournal,
    start_fresh,
)
from agent_fsm.errors import ConfigError
from agent_fsm.messages import ToolCall, ToolMessage
from agent_fsm.models.base import ModelCallError
from agent_fsm.state import RunState

__all__ = [
    "CANCEL_CALL",
    "CANCEL_KEY",
    "MODEL_STEP",
    "REPLAY_FORMAT",
    "SLEEP_STEP",
    "TOOL_STEP",
    "RunTime",
    "Woke",
    "active",
    "interrupted",
    "options",
    "running",
    "sleep",
]

REPLAY_FORMAT = 3
"""What a replay of this release expects to meet, bumped whenever a release records other
steps or journal keys: 2 kept an activation's start in its first step (earlier releases
recorded an ``agent_fsm.start`` step), 3 makes a tool call without a step when the journal
can stand for one (journal keys ``call:N``; earlier, every call was a step keyed ``step:N``).
A replay of a run begun under another format could meet steps it does not expect, or miss
a call's journal entry and make the call again. DBOS's default application version is a hash
of the source of the registered workflows, so ``DBOSAgent``'s two workflows name this number
in their docstrings: a release of another format gets another version, and DBOS hands a
queued or recovered run only to workers of the version that started it."""

MODEL_STEP = "agent_fsm.model"
SLEEP_STEP = "agent_fsm.sleep"
TOOL_STEP = "agent_fsm.tool:"
"""Step names (a tool step's is followed by the tool's name): DBOS checks that a replay meets
the step it recorded at each position, so a run that diverges fails loudly."""


CANCEL_KEY = "cancel"
"""The journal key, after an activation's key prefix (``RunTime.key_prefix``), of a request
to cancel that activation (``agent_fsm.dbos.cancelling``); no tool step's key is one."""
CANCEL_CALL = "agent_fsm.cancel"
"""The name of the call a cancel request is recorded as, its arguments ``{"reason": ...}``."""


def options(name: str) -> StepOptions:
    """A step that DBOS never retries: the engine's own retry rows decide what is retried,
    and a retried step would be a second model or tool call the run never asked for."""
    return {"name": name, "retries_allowed": False}


class _Outcome(Protocol):
    """What a timed step records (``Replied``, ``Answered``, ``Woke``)."""

    @property
    def began_at(self) -> float | None: ...


_O = TypeVar("_O", bound=_Outcome)


class RunTime:
    """One activation's recorded time, deadline and random numbers (see the module
    docstring): the run's first workflow, or one of its resumes.

    Created in the workflow before its first step; read by the agent's clock, sleep,
    random source, model and tools through ``active()``. Its timed steps (model, tool,
    sleep) are made with ``step``, the first of which records the activation's start.
    """

    __slots__ = (
        "_calls",
        "_finish_and_read",
        "_first",
        "_pending",
        "_recorded",
        "_turns",
        "admission",
        "cancelled",
        "first_finish",
        "fresh",
        "heard",
        "journal",
        "key_prefix",
        "looked",
        "missed",
        "now",
        "pause",
        "random",
        "started_at",
        "state",
        "timeout_s",
    )

    def __init__(
        self,
        workflow_id: str,
        timeout_s: float,
        journal: ToolJournal,
        state: RunState,
        admission: Admission,
        *,
        key_prefix: str = "",
        pause: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.started_at: float | None = None
        """The activation's start on the fleet's clock, as its first step recorded it (None
        before: nothing reads it until a step has ended)."""
        self._pending: float | None = None
        """The start the first step's body is measuring from, before its outcome is in."""
        self._first = asyncio.Lock()
        """Held by the first step, so that it is the first one to begin on every execution."""
        self.admission = admission
        """This execution's admission: the fence its model and tool steps pass before a
        call, and the fleet's clock (``agent_fsm.dbos.liveness``)."""
        self.timeout_s = timeout_s
        self.now = 0.0
        """Seconds since ``started_at`` at the latest recorded step end (the clock)."""
        self.random = random.Random(workflow_id)
        self.journal = journal
        """Where tool calls are recorded (``agent_fsm.dbos.tool_calls``)."""
        self.first_finish = journal if isinstance(journal, FirstFinish) else None
        """The journal, when it keeps a first end: tool calls may then be made without a
        step (checked once: a Protocol's ``isinstance`` is slow)."""
        self._finish_and_read = journal if isinstance(journal, FirstFinishingLookup) else None
        """The journal, when it reads the cancel request with a first end
        (``finish_unstepped``)."""
        self.key_prefix = key_prefix
        """Put before a tool step's journal key: a resume's steps are numbered from 1
        again, in the same run's journal (``agent_fsm.dbos.pausing``)."""
        self.pause = pause
        """What the sleep step waits with: the agent's own ``sleep``."""
        self.state = state
        """The run's state (read only: which state is making a model call)."""
        self.cancelled: str | None = None
        """Why the activation was cancelled from outside, once a step's recorded outcome
        said so (the same on every execution): the steps after it make no call."""
        self.looked = False
        """Whether a tool step read the cancel request after its call since the latest
        model step (``saw_request``), and ``missed`` whether one did not: both from
        recorded outcomes (or a read made live, ``hear``), and each only ever set within a
        turn, so parallel tool steps ending in any order leave the same answer."""
        self.missed = False
        self.heard: str | None = None
        """The reason of a cancel request that a tool call made without a step read with its
        end, in this execution, since the latest model step (``finish_unstepped``): not
        recorded anywhere, so the model step after it records it as its own read."""
        self._calls = 0
        """The tool calls made so far (``next_call``)."""
        self._turns: dict[int, asyncio.Future[None]] = {}
        """The calls that may still take a step, by number (``wait_turn``)."""
        self.fresh = False
        """Whether this execution has run a step body of its own (not a recorded outcome):
        DBOS holds no record of any step after that one (``recorded_steps``)."""
        self._recorded: frozenset[str] | None = None

    def next_call(self) -> int:
        """Number the activation's next tool call (0, 1, ...): called in the workflow, in
        the order the engine starts the calls, which the recorded outcomes decide, so a
        replay gives each call the same number (its journal key: ``call_key``)."""
        number = self._calls
        self._calls = number + 1
        self._turns[number] = asyncio.get_running_loop().create_future()
        return number

    def call_key(self, number: int) -> str:
        """The journal key of tool call ``number`` of the activation."""
        return f"{self.key_prefix}call:{number}"

    async def wait_turn(self, number: int) -> None:
        """Return once every earlier call has taken its step or will take none
        (``turn_done``): tool calls take their steps in the order of their numbers, on every
        execution, whichever of them need one and whenever they find out (DBOS numbers the
        steps in the order they are taken, and a replay must meet each at its place)."""
        for earlier in sorted(n for n in self._turns if n < number):
            waiting = self._turns.get(earlier)
            if waiting is not None:
                await asyncio.shield(waiting)

    def turn_done(self, number: int) -> None:
        """Call ``number`` has taken its step (DBOS numbered it), or will take none."""
        waiting = self._turns.pop(number, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    async def recorded_steps(self) -> frozenset[str]:
        """The names of the steps DBOS holds a record of for this workflow; none once this
        execution has run a step body of its own (``fresh``: every step after that is new).
        Read once per execution: a replay's one extra round trip."""
        if self.fresh:
            return frozenset()
        if self._recorded is None:
            workflow_id = DBOS.workflow_id
            steps = [] if workflow_id is None else await _recorded_steps(workflow_id)
            self._recorded = frozenset(step["function_name"] for step in steps)
        return self._recorded

    def start_unstepped(
        self, key: str, call: ToolCall
    ) -> tuple[JournalEntry | None, str | None, bool]:
        """A tool call's start made without a step: ``start_and_request`` on a journal that
        starts in its read, else the request read and the call's first start
        (``journal.start_fresh``) when the key has no entry.

        Raises:
            as ``start_and_request``, or ``journal.NotStarted``.
        """
        if isinstance(self.journal, StartingLookup):
            return self.start_and_request(key, call)
        entry, reason = self.entry_and_request(key)
        if entry is not None or reason is not None:
            return entry, reason, False
        entry = start_fresh(self.journal, key, call)
        return entry, None, entry is None

    def finish_unstepped(
        self, key: str, result: ToolMessage
    ) -> tuple[JournalEntry | None, bool, str | None]:
        """A tool call made without a step records its end (``journal.FirstFinish``) and,
        in the same round trip where the journal offers it (``FirstFinishingLookup``), reads
        this activation's pending cancel request: (the entry after, whether the request was
        read, its reason). Called in the workflow, on the execution that made the call; the
        journal must keep a first end (``first_finish``).

        Raises:
            as ``FirstFinish.finish_first``.
        """
        reading = self._finish_and_read
        if reading is not None:
            entry, request = reading.finish_first_and_lookup(
                key, result, self.key_prefix + CANCEL_KEY
            )
            return entry, True, _reason(request)
        finishing = self.first_finish
        assert finishing is not None  # checked by the caller
        return finishing.finish_first(key, result), False, None

    def hear(self, reason: str | None) -> None:
        """A call made without a step read the cancel request with its end, live (not from a
        record): a request found is the model step's to record (``heard``); the read counts
        as one after the call (its answer says ``looked``)."""
        if reason is not None and self.heard is None:
            self.heard = reason

    def request_seen(self) -> bool:
        """Whether the cancel request was read after every call made so far (a tool step
        of the latest turn read it after its own call, and none failed to), as recorded or,
        for a call made without a step, live (``hear``): a model step then takes
        ``cancelled``, or else ``heard``, as that read, and reads nothing itself."""
        return self.looked and not self.missed

    def saw_request(self, looked: bool) -> None:
        """A tool step's recorded outcome says whether it read the request after its call."""
        if looked:
            self.looked = True
        else:
            self.missed = True

    def called_model(self) -> None:
        """A model step made (or recorded) its call: the request must be read again."""
        self.looked = self.missed = False
        self.heard = None

    def clock(self) -> float:
        return self.now

    def cancel_requested(self) -> str | None:
        """The reason of a request to cancel this activation, if one is pending in the
        run's journal (``agent_fsm.dbos.cancelling``). Read inside steps only, which record
        the answer. A look-up that fails counts as no request: a store that blinks must not
        abort every run it holds (the next step reads it again)."""
        try:
            return _reason(self.journal.lookup(self.key_prefix + CANCEL_KEY))
        except Exception:
            return None

    def entry_and_request(self, key: str) -> tuple[JournalEntry | None, str | None]:
        """The journal entry of ``key`` and this activation's pending cancel request
        (``cancel_requested``), in one read of a journal that offers it (``PairedLookup``:
        a tool step's one round trip before its call). Read inside steps only.

        Raises:
            as ``ToolJournal.lookup``, when the entry cannot be read (a request that
            cannot be read is None).
        """
        journal = self.journal
        if isinstance(journal, PairedLookup):
            entry, request = journal.lookup_pair(key, self.key_prefix + CANCEL_KEY)
            return entry, _reason(request)
        return journal.lookup(key), self.cancel_requested()

    def start_and_request(
        self, key: str, call: ToolCall
    ) -> tuple[JournalEntry | None, str | None, bool]:
        """``entry_and_request(key)`` and, when the entry is None and no request is pending,
        the call recorded as started in the same round trip where the journal offers it
        (``StartingLookup``): (the entry, the request's reason, whether ``call`` was
        recorded). Read inside steps only.

        Raises:
            as ``entry_and_request``, or ``ToolJournal.record_started``.
        """
        journal = self.journal
        if isinstance(journal, StartingLookup):
            entry, request, started = journal.start_unless_known(
                key, call, self.key_prefix + CANCEL_KEY
            )
            return entry, _reason(request), started
        entry, reason = self.entry_and_request(key)
        return entry, reason, False

    def finish_and_request(self, key: str, result: ToolMessage) -> tuple[bool, str | None]:
        """Record the call of ``key`` finished with ``result`` and, in the same round trip
        where the journal offers it (``FinishingLookup``), read this activation's pending
        cancel request: (whether it was read, its reason). Read inside steps only.

        Raises:
            as ``ToolJournal.record_finished``.
        """
        journal = self.journal
        if isinstance(journal, FinishingLookup):
            request = journal.finish_and_lookup(key, result, self.key_prefix + CANCEL_KEY)
            return True, _reason(request)
        journal.record_finished(key, result)
        return False, None

    async def step(self, name: str, body: Callable[[], Coroutine[Any, Any, _O]]) -> _O:
        """The DBOS step ``name`` (``options``) running ``body``, whose outcome (a dataclass
        with ``began_at``) is recorded. The activation's first step records its start too:
        the fleet's time when its body began, in its outcome's ``began_at``, where every
        execution finds it (one step fewer than a step of its own). That first step is the
        first caller on every execution: callers queue for it in the order they call, which
        the recorded outcomes decide, so parallel steps (a resume's approved calls) cannot
        take turns differently on a replay."""

        async def own() -> _O:
            self.fresh = True
            return await body()

        if self.started_at is not None:
            return await DBOS.run_step_async(options(name), own)
        async with self._first:
            if self.started_at is not None:  # began while this caller waited
                return await DBOS.run_step_async(options(name), own)

            async def first() -> _O:
                began = self._pending = self.admission.now()
                self.fresh = True
                outcome = await body()
                return cast(_O, dataclasses.replace(cast(Any, outcome), began_at=began))

            outcome = await DBOS.run_step_async(options(name), first)
            self.started_at = outcome.began_at
            return outcome

    def advance(self, ended_at: float) -> None:
        """A step recorded that it ended at unix time ``ended_at``. The clock never goes back
        (parallel tool steps end in any order), and never passes the deadline: time beyond
        it is only ever read as the deadline (``cut``)."""
        started_at = self.started_at
        if started_at is None:  # no step has recorded the start: none has ended either
            return
        self.now = max(self.now, min(ended_at - started_at, self.timeout_s))

    def cut(self) -> None:
        """A step was cut by the deadline: the clock reads the time limit exactly."""
        self.now = self.timeout_s

    def fleet_now(self) -> float:
        """The fleet's clock now (what steps record as their end). Read inside steps only."""
        return self.admission.now()

    def remaining_s(self) -> float:
        """Real seconds left before the deadline, on the fleet's clock. Read inside steps
        only: outside, its answer would differ between executions."""
        started_at = self.started_at if self.started_at is not None else self._pending
        assert started_at is not None  # in a step: the first one set ``_pending``
        return started_at + self.timeout_s - self.admission.now()


async def _recorded_steps(workflow_id: str) -> list[StepInfo]:
    """DBOS's records of the steps of ``workflow_id``, read outside the workflow's context:
    called in a workflow, ``DBOS.list_workflow_steps`` would be a step itself (and take a
    place a replay must meet). An executor's thread has no DBOS context (``run_in_executor``
    copies none)."""
    read = functools.partial(DBOS.list_workflow_steps, workflow_id, load_output=False)
    return await asyncio.get_running_loop().run_in_executor(None, read)


def _reason(entry: JournalEntry | None) -> str | None:
    """The reason a cancel request's journal entry gives; None for no request."""
    if entry is None or entry.call.name != CANCEL_CALL:
        return None
    try:
        reason = json.loads(entry.call.arguments).get("reason")
    except (ValueError, AttributeError):
        reason = None
    return reason if isinstance(reason, str) else "cancelled"


_ACTIVE: ContextVar[RunTime] = ContextVar("agent_fsm_dbos_run")


def active() -> RunTime:
    """The run being driven in this task.

    Raises:
        ConfigError: outside a run of a ``DBOSAgent`` (its model, tools or clock were used
            on their own).
    """
    try:
        return _ACTIVE.get()
    except LookupError:
        raise ConfigError(
            "this model, tool or clock belongs to a DBOSAgent's runs: it works only inside "
            "one (DBOSAgent.run / enqueue)"
        ) from None


@contextmanager
def running(run: RunTime) -> Iterator[RunTime]:
    """Make ``run`` the active run of this task (and of the tasks it starts)."""
    token = _ACTIVE.set(run)
    try:
        yield run
    finally:
        _ACTIVE.reset(token)


def interrupted(timeout_s: float) -> ModelCallError:
    """The failure of a model call the deadline cut: worded as the engine words a model call
    its deadline timer interrupts (``RunContext.why_stopped``), and permanent, so the THINK
    rows end the run with ``timeout``."""
    return ModelCallError(
        f"the model call was interrupted: the run's time limit of {timeout_s:g} s was reached",
        transient=False,
    )


@dataclass(frozen=True, slots=True)
class Woke:
    """A sleep step's outcome: when it ended, and whether the deadline cut it."""

    ended_at: float
    cut: bool
    began_at: float | None = None
    """The activation's start, when this was its first step (``RunTime.step``)."""


async def sleep(seconds: float) -> None:
    """The run's backoff sleep, as a step (``RunConfig.sleep``): a replay does not wait
    again. Cut at the deadline, it raises the model call's interruption, as the engine's
    deadline timer would have cancelled it.

    Raises:
        ModelCallError: the deadline came first.
    """
    run = active()

    async def wait() -> Woke:
        left = run.remaining_s()
        await run.pause(max(min(seconds, left), 0.0))
        return Woke(run.fleet_now(), cut=seconds >= left)

    woke = await run.step(SLEEP_STEP, wait)
    if woke.cut:
        run.cut()
        raise interrupted(run.timeout_s)
    run.advance(woke.ended_at)
