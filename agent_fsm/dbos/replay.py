"""What makes one run replay-safe under DBOS: its recorded clock, its deadline, its random
numbers, and the steps that record them.

DBOS recovers a workflow by calling its function again from the start: each step it reaches
returns the outcome recorded the first time (checked by the step's position and name), and
the first step with no record runs for real. So the engine must reach the same steps, in the
same order, with the same arguments, every time it is replayed. Its model and tool calls are
steps, or recorded in the run's journal where it can stand for a step
(``agent_fsm.dbos.steps``); what else it reads that could differ between two
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
import random
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from dbos import DBOS, StepInfo, StepOptions

from agent_fsm.dbos.liveness import Admission
from agent_fsm.dbos.requests import CANCEL_CALL, CANCEL_KEY, RunJournal
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.errors import ConfigError
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

REPLAY_FORMAT = 4
"""What a replay of this release expects to meet, bumped whenever a release records other
steps or journal keys: 2 kept an activation's start in its first step (earlier releases
recorded an ``agent_fsm.start`` step), 3 makes a tool call without a step when the journal
can stand for one (journal keys ``call:N``; earlier, every call was a step keyed ``step:N``),
4 makes a model call without a step when the journal keeps outcomes (journal keys
``model:N``, the activation's start in the first; a model call made as a step is named
``agent_fsm.model#N``; earlier, every model call was a step named ``agent_fsm.model``).
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


def options(name: str) -> StepOptions:
    """A step that DBOS never retries: the engine's own retry rows decide what is retried,
    and a retried step would be a second model or tool call the run never asked for."""
    return {"name": name, "retries_allowed": False}


class _Outcome(Protocol):
    """What a timed step records (``Replied``, ``Answered``, ``Woke``)."""

    @property
    def began_at(self) -> float | None: ...


_O = TypeVar("_O", bound=_Outcome)


class RunTime(RunJournal):
    """One activation's recorded time, deadline and random numbers (see the module
    docstring): the run's first workflow, or one of its resumes.

    Created in the workflow before its first step; read by the agent's clock, sleep,
    random source, model and tools through ``active()``. Its timed steps (model, tool,
    sleep) are made with ``step``, the first of which records the activation's start. Its
    tool journal and the reads of the cancel request are its base class's
    (``agent_fsm.dbos.requests.RunJournal``).
    """

    __slots__ = (
        "_calls",
        "_first",
        "_models",
        "_pending",
        "_recorded",
        "_turns",
        "admission",
        "fresh",
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
        super().__init__(journal, key_prefix)
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
        self.pause = pause
        """What the sleep step waits with: the agent's own ``sleep``."""
        self.state = state
        """The run's state (read only: which state is making a model call)."""
        self._calls = 0
        """The tool calls made so far (``next_call``)."""
        self._models = 0
        """The model calls made so far (``next_model``)."""
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

    def next_model(self) -> int:
        """Number the activation's next model call (0, 1, ...): called in the workflow, in
        the order the engine makes them (one at a time), so a replay gives each call the
        same number (its journal key, ``model_key``, and its step's name)."""
        number = self._models
        self._models = number + 1
        return number

    def begin(self) -> float | None:
        """For a model call made without a step (``agent_fsm.dbos.model_calls``): when no
        step or call has recorded the activation's start yet, the fleet's time now, which
        the call records with its outcome (``began_at``) and ``remaining_s`` counts from
        meanwhile; None when the start is recorded. Never called while a step runs (model
        calls are made one at a time, none alongside a tool call)."""
        if self.started_at is not None:
            return None
        began = self._pending = self.admission.now()
        return began

    def begun(self, began_at: float | None) -> None:
        """A recorded outcome said when the activation began (its first one does)."""
        if self.started_at is None and began_at is not None:
            self.started_at = began_at

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

    def clock(self) -> float:
        return self.now

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

    async def record_step(self, name: str, outcome: _O) -> _O:
        """The DBOS step ``name`` recording ``outcome``, that of a call made already whose
        outcome the journal could not keep (``agent_fsm.dbos.model_calls``); a replay gets
        the recorded one back. Its ``began_at``, if any, is the activation's start."""

        async def made() -> _O:
            self.fresh = True
            return outcome

        recorded = await DBOS.run_step_async(options(name), made)
        self.begun(recorded.began_at)
        return recorded

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
