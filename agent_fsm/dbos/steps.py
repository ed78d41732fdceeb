"""Model calls and tool calls as DBOS steps.

**A model call** goes through ``StepModel``, a model wrapping the agent's: each ``request``
is one step whose recorded outcome is the reply, or the failure (as the engine classifies it:
``run.thinking.failure_from``), or the deadline's cut. A replay gets the recorded outcome back
and raises or returns exactly as the first execution did.

**A tool call** is one step around the whole call: its timeout, its retries with their
backoff, and the tool journal (``durable.journal``), kept *inside* the step:

1. the step looks its own entry up in the run's journal (keyed by the step's position in the
   workflow, which a replay reproduces): a finished entry is answered from the journal; a
   started one means an earlier execution of this very step died mid-call, so a tool that is
   not idempotent is answered "outcome unknown" instead of running twice (an idempotent one
   runs again);
2. otherwise it records the call as started (durably), runs it (``tools.execution.execute``),
   and records the answer.

The run's cancel request (``agent_fsm.dbos.cancelling``) is read in the statements of 1 and
of the answer's record; a model step reads it itself only when the latest call was not
followed by such a read (``replay.RunTime.request_seen``).

DBOS records the step's outcome after that; a step with a record is never run again. So a
non-idempotent call runs at most once, whichever worker replays the run.

**A journal that fails** (the connection dropped) is tried once more (the store connects
again), and then the step answers as the journal will answer any later execution of it, so
that every execution agrees whichever one DBOS records: a look-up that fails may hide a call
an earlier execution started, so a non-idempotent call is answered "outcome unknown" (never
"not run"); a start that cannot be recorded is answered "not run" (the call was not made);
an end that cannot be recorded leaves the journal saying "started", so a non-idempotent call
is answered "outcome unknown" (never "failed": its effect happened). An idempotent call's
answer is its own: running it again is allowed.

``durable_config`` is the agent's run configuration with these steps in place, and
``ReplayedKeeper`` is where such a run lives: the clock, sleep, random numbers and deadline of
``agent_fsm.dbos.replay``, and nothing saved by the engine (DBOS records the steps).

The engine's own execution runs a *stand-in* for each tool (``stepped``): the same name,
schema, approval and flags, whose function is the step and whose own timeout and retries are
off (the step has the real ones). The stand-in returns the step's answer as a ``ToolResult``,
which the engine takes as it is.

Both kinds of step enforce the run's deadline (``replay.RunTime.remaining_s``) and record
when they ended, which is what the run's clock reads (``agent_fsm.dbos.replay``); the
activation's first step records when it began too, the activation's start
(``replay.RunTime.step``). Before a
call, both pass the execution's fence (``liveness.Admission.check``): a call starts only
while this process's liveness lease, the one the execution was admitted under, is fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from dbos import DBOS

from agent_fsm.compaction import ContextPolicy
from agent_fsm.dbos.replay import (
    MODEL_STEP,
    TOOL_STEP,
    RunTime,
    active,
    interrupted,
    sleep,
)
from agent_fsm.durable.journal import (
    CallStatus,
    JournalEntry,
    NotStarted,
    ToolJournal,
    start_fresh,
)
from agent_fsm.errors import ConfigError
from agent_fsm.failures import describe, is_own_failure
from agent_fsm.limits import Limits
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage, ToolStatus
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.run.context import RunConfig
from agent_fsm.run.residence import Timekeeping
from agent_fsm.run.thinking import failure_from
from agent_fsm.state import ModelFailure, RunState
from agent_fsm.table import LAST_CALL_STATE, StopReason
from agent_fsm.tools.execution import ABANDONED_NOTE, execute
from agent_fsm.tools.results import ToolResult, error_result, skipped_result
from agent_fsm.tools.tool import PreparedCall, Tool, ToolRegistry

__all__ = [
    "REPLAYED_TIME",
    "Answered",
    "ReplayedKeeper",
    "Replied",
    "StepModel",
    "durable_config",
    "outcome_unknown",
    "stepped",
]

STAND_IN_TIMEOUT_S = 10.0**9
"""The stand-in tool's own timeout: never reached (the step inside has the real one, and
the run's deadline), because a real-time timeout outside the step would cancel it at a
different point of a replay."""


@dataclass(frozen=True, slots=True)
class Replied:
    """A model step's outcome: the reply, or the failure, or the deadline's cut."""

    ended_at: float
    response: ModelResponse | None = None
    failure: ModelFailure | None = None
    cut: bool = False
    cancelled: str | None = None
    """Why no call was made: the run was cancelled from outside (the request's reason)."""
    began_at: float | None = None
    """The activation's start, when this was its first step (``RunTime.step``)."""


class StepModel:
    """The agent's model, each of whose calls is a DBOS step (see the module docstring).

    Everything else (``name``, ``context_window``, ``count_tokens``, ...) is the wrapped
    model's. A call made outside a run of a ``DBOSAgent`` raises ``ConfigError``.
    """

    def __init__(self, model: Model) -> None:
        self.model = model
        self.name = model.name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)

    async def request(self, request: ModelRequest) -> ModelResponse:
        """The reply, or the failure the step recorded, raised as a ``ModelCallError``.

        The last answer (``Limits.last_answer``) has its own time limit, which the engine
        keeps with a real-time timeout around this call; the step absorbs its cancellation
        and records it as a cut, which is raised as ``TimeoutError`` on every execution.
        """
        run = active()
        if run.cancelled is not None:  # an earlier step found the request: no step now
            raise _not_made(run.cancelled)
        last = run.state.state == LAST_CALL_STATE
        look = not run.request_seen()  # a tool step read it after the latest call: not again

        async def call() -> Replied:
            return await _call(self.model, request, run, last, look)

        replied = await run.step(MODEL_STEP, call)
        run.called_model()
        if replied.cancelled is not None:
            run.advance(replied.ended_at)
            run.cancelled = replied.cancelled
            raise _not_made(replied.cancelled)
        if replied.cut:
            if last:
                raise TimeoutError("the last answer took longer than its time limit")
            run.cut()
            raise interrupted(run.timeout_s)
        run.advance(replied.ended_at)
        if replied.failure is not None:
            failure = replied.failure
            raise ModelCallError(
                failure.message,
                transient=not failure.permanent,
                retry_after_s=failure.retry_after_s,
            )
        assert replied.response is not None
        return replied.response


def _not_made(reason: str) -> ModelCallError:
    """The failure of a model call a cancel request stopped before it was made: permanent,
    and the run is aborted once the state's work ends (``ReplayedKeeper.during``), so the
    abort row is the one taken."""
    return ModelCallError(
        f"the model call was not made: the run was cancelled ({reason})", transient=False
    )


async def _call(
    model: Model, request: ModelRequest, run: RunTime, last: bool, look: bool
) -> Replied:
    """The body of a model step: ``look`` says whether to read the cancel request first (it
    was not read since the latest call). Must not raise for anything the model does."""
    await run.admission.check()
    reason = run.cancel_requested() if look else None
    if reason is not None:
        return Replied(run.fleet_now(), cancelled=reason)
    # The last answer's own limit is the engine's (see StepModel.request); others have the
    # run's deadline.
    left = 10.0**9 if last else run.remaining_s()
    if left <= 0:
        return Replied(run.fleet_now(), cut=True)
    limit = asyncio.timeout(left)
    try:
        async with limit:
            response: object = await model.request(request)
    except BaseException as exc:
        if limit.expired() or (last and isinstance(exc, asyncio.CancelledError)):
            return Replied(run.fleet_now(), cut=True)
        if not is_own_failure(exc):
            raise
        return Replied(run.fleet_now(), failure=failure_from(exc))
    if not isinstance(response, ModelResponse):  # recorded as the engine would word it
        message = f"the model returned {type(response).__name__}, not a ModelResponse"
        return Replied(run.fleet_now(), failure=ModelFailure(message=message, permanent=False))
    return Replied(run.fleet_now(), response=response)


@dataclass(frozen=True, slots=True)
class Answered:
    """A tool step's outcome: the answer, and whether the deadline cut the call."""

    ended_at: float
    result: ToolMessage
    cut: bool = False
    cancelled: str | None = None
    """The reason of a cancel request the step found, before its call (the call was not
    made) or after it (its answer is the call's): the steps after it make no call."""
    looked: bool = False
    """Whether the step's latest read of the cancel request came after its call (or it made
    none): the model step after it then reads nothing itself (``RunTime.request_seen``).
    An outcome recorded by an earlier version has no such field: read with ``getattr``."""
    began_at: float | None = None
    """The activation's start, when this was its first step (``RunTime.step``)."""


def stepped(tool: Tool, limits: Limits) -> Tool:
    """The stand-in the engine runs for ``tool``: its function is one step running the
    whole call (see the module docstring). Control tools have no function, and are returned
    as they are."""
    if tool.fn is None:
        return tool

    async def step(**values: Any) -> ToolResult:
        run = active()
        if run.cancelled is not None:  # an earlier step found the request: no step now
            return ToolResult(output=_not_run(tool.name, run.cancelled), is_error=True)

        async def body() -> Answered:
            return await _run_call(tool, values, limits, run)

        answered = await run.step(TOOL_STEP + tool.name, body)
        if answered.cut:
            run.cut()
        else:
            run.advance(answered.ended_at)
        if answered.cancelled is not None:
            run.cancelled = answered.cancelled
        run.saw_request(getattr(answered, "looked", False))
        result = answered.result
        return ToolResult(
            output=result.content,
            details=result.details,
            is_error=result.status is not ToolStatus.OK,
        )

    return dataclasses.replace(tool, fn=step, timeout_s=STAND_IN_TIMEOUT_S, max_retries=0)


def outcome_unknown(call: ToolCall, why: str = "it started before an interruption") -> ToolMessage:
    """The answer to a non-idempotent call whose effect may have happened: worded as the
    engine's own journal words it (``tools.scheduling``), ``why`` saying what is known."""
    return error_result(
        call,
        f"The outcome of this call to '{call.name}' is unknown: {why}, and it is not re-run"
        " because the tool is not idempotent. Check its effect before calling it again.",
        {"runtime": {"outcome_unknown": True}},
    )


def _not_run(name: str, reason: str) -> str:
    """The answer to a call a cancel request stopped before it started."""
    return f"Tool '{name}' was not run: the run was cancelled before this call started ({reason})."


def _cancelled(call: ToolCall, tool: Tool) -> ToolMessage:
    """The answer to a call the deadline cut, worded as the engine words a call its stop
    cancels (``tools.scheduling``)."""
    message = f"Tool '{call.name}' was cancelled because the run was stopped."
    runtime: dict[str, Any] = {"cancelled": True}
    if not tool.is_async:
        message += ABANDONED_NOTE
        runtime["abandoned"] = True
    return error_result(call, message, {"runtime": runtime})


_T = TypeVar("_T")


def _twice(write: Callable[..., _T], *args: Any) -> _T:
    """A journal call, made once more if it raises (a dropped connection is made again)."""
    try:
        return write(*args)
    except Exception:
        return write(*args)


def _look_up(
    run: RunTime, key: str, call: ToolCall, left: float
) -> tuple[JournalEntry | None, str | None, bool, Exception | None, Exception | None]:
    """A tool step's read before its call: its journal entry, a cancel request
    (``agent_fsm.dbos.cancelling``), whether the call was recorded as started (in the same
    round trip, when both are absent and ``left`` says the deadline has not come), the
    failure that left the entry unread, and the failure that refused the start. When the
    one round trip fails, the entry is read on its own: a journal that refuses writes must
    still tell "not run" (its start could not be recorded) from "may have run" (its entry
    could not be read). A start is a first start (``journal.start_fresh``): never recorded
    over another execution's, whose entry is answered instead."""
    if left > 0:
        try:
            entry, reason, started = _twice(run.start_and_request, key, call)
        except Exception:  # told apart by the read below
            pass
        else:
            if entry is not None or reason is not None or started:
                return entry, reason, started, None, None
            try:  # a journal that cannot start a call in its read: the first start now
                entry = _twice(start_fresh, run.journal, key, call)
            except NotStarted as exc:
                cause = exc.__cause__
                return None, None, False, None, cause if isinstance(cause, Exception) else exc
            except Exception as exc:  # whether another execution started it is not known
                return None, None, False, exc, None
            return entry, None, entry is None, None, None
    try:
        entry, reason = _twice(run.entry_and_request, key)
    except Exception as exc:
        return None, None, False, exc, None
    return entry, reason, False, None, None


async def _run_call(tool: Tool, values: dict[str, Any], limits: Limits, run: RunTime) -> Answered:
    """The body of a tool step: the journal around the call (see the module docstring).
    Must not raise for anything the journal does."""
    await run.admission.check()
    step_id = DBOS.step_id
    assert step_id is not None  # inside the step
    key = run.journal_key(step_id)
    call = ToolCall(id=key, name=tool.name, arguments=json.dumps(values, default=str))
    journal = run.journal
    left = run.remaining_s()
    entry, reason, started, unread, refused = _look_up(run, key, call, left)
    # No call is made below unless said: the request just read is the latest (``looked``).
    if entry is not None and entry.status is CallStatus.FINISHED and entry.result is not None:
        return Answered(run.fleet_now(), entry.result, cancelled=reason, looked=True)
    if (entry is not None or unread is not None) and not tool.idempotent:
        if unread is not None:
            why = f"its journal could not be read ({describe(unread)}), so it may have run"
            return Answered(run.fleet_now(), outcome_unknown(call, why))
        result = outcome_unknown(call)
        with contextlib.suppress(Exception):  # then a later execution answers the same
            _twice(journal.record_finished, key, result)
        return Answered(run.fleet_now(), result, cancelled=reason, looked=True)
    if reason is not None:  # cancelled from outside: the call never starts
        message = error_result(call, _not_run(tool.name, reason), {"runtime": {"cancelled": True}})
        return Answered(run.fleet_now(), message, cancelled=reason, looked=True)
    if left <= 0:  # the deadline came first: the call never starts
        return Answered(run.fleet_now(), _cancelled(call, tool), cut=True, looked=unread is None)
    if refused is None and not started:  # an idempotent call run again (found started, or
        refused = _restart(journal, key, call)  # maybe: unread)
    if refused is not None:
        return _not_recorded(call, refused, run, looked=unread is None)
    prepared = PreparedCall(call, tool, arguments=values, error=None, values=values)
    try:
        async with asyncio.timeout(left):
            result = (await execute(prepared, limits)).result
    except TimeoutError:  # execute never raises one of its own: it is the deadline's
        result, cut = _cancelled(call, tool), True
    else:
        cut = False
    try:  # one round trip: the end recorded, and a cancel request made meanwhile read
        looked, reason = _twice(run.finish_and_request, key, result)
    except Exception as exc:
        looked, reason = False, None  # the model step after it reads the request itself
        if not tool.idempotent:  # the journal says "started": any later execution says this
            why = f"it ran, but the journal could not record its end ({describe(exc)})"
            result = outcome_unknown(call, why)
    return Answered(run.fleet_now(), result, cut, cancelled=reason, looked=looked)


def _restart(journal: ToolJournal, key: str, call: ToolCall) -> Exception | None:
    """Record an idempotent call started again (its entry replaced); the failure if not."""
    try:
        _twice(journal.record_started, key, call)
    except Exception as exc:
        return exc
    return None


def _not_recorded(
    call: ToolCall, why: BaseException, run: RunTime, *, looked: bool = True
) -> Answered:
    """The answer to a call not made because its start could not be recorded."""
    what = f"its start could not be recorded in the journal ({describe(why)})"
    return Answered(
        run.fleet_now(), skipped_result(call, f"{what}; nothing was done"), looked=looked
    )


def durable_config(config: RunConfig) -> RunConfig:
    """``config`` with its model calls and tool calls as DBOS steps (and the models of its
    context policies); its runs live in a ``ReplayedKeeper``.

    Raises:
        ConfigError: a context policy has a model but is not a dataclass (its model cannot
            be wrapped in a ``StepModel``).
    """
    limits = config.limits
    tools = config.tools
    return dataclasses.replace(
        config,
        model=StepModel(config.model),
        tools=ToolRegistry(
            stepped(tool, limits) for spec in tools.specs if (tool := tools.get(spec.name))
        ),
        context_policies=tuple(_stepped_policy(policy) for policy in config.context_policies),
    )


def _clock() -> float:
    return active().clock()


def _random() -> float:
    return active().random.random()


def _no_timer(seconds: float, time_up: Callable[[], None]) -> None:
    """The deadline is the steps' to keep (``replay.RunTime.remaining_s``): no timer."""


REPLAYED_TIME = Timekeeping(clock=_clock, sleep=sleep, random=_random, arm_deadline=_no_timer)
"""The time of a run that is a DBOS workflow: the active run's recorded clock, a sleep that
is a step, a random source seeded per run, and no timer (``agent_fsm.dbos.replay``)."""


class ReplayedKeeper:
    """Where a DBOS workflow's run lives, as its engine sees it (``run.residence.RunKeeper``):
    the workflow's time; no tool journal of the engine's (each tool step keeps its own);
    nothing saved after a step, since DBOS records every step's outcome and a replay
    reproduces the run from them; the stops ``DBOSAgent`` saves itself when the workflow
    ends (``agent_fsm.dbos.pausing``).

    A cancel from outside (``agent_fsm.dbos.cancelling``) is found by a step, whose
    recorded outcome says so (``RunTime.cancelled``); the keeper aborts the run once that
    state's work has ended (``during``), before its row is chosen: the abort row is taken,
    on every execution at the same point, and nothing in flight is interrupted (each call
    is a step: a cancellation mid-step would land at a point a replay cannot reproduce).
    """

    __slots__ = ("_abort", "_run")

    time = REPLAYED_TIME
    journal: ToolJournal | None = None

    def __init__(self, run: RunTime) -> None:
        self._run = run
        self._abort: Callable[[str], None] | None = None

    def activated(self, abort: Callable[[str], None]) -> None:
        self._abort = abort

    def claim_stop(self, state: RunState) -> None:
        return None  # a resume is a workflow of its own, started once per stop

    def during(self, work: Awaitable[None]) -> Awaitable[None]:
        return self._then_abort_if_cancelled(work)

    async def _then_abort_if_cancelled(self, work: Awaitable[None]) -> None:
        await work
        reason, abort = self._run.cancelled, self._abort
        if reason is not None and abort is not None:
            abort(reason)  # Run.abort does nothing to a run already aborting

    def saved(self, state: RunState) -> None:
        return None

    def stopped(self, state: RunState, stop_reason: StopReason, resumable: bool) -> None:
        return None

    def release(self) -> None:
        self._abort = None  # a bound method of the Run: kept, the finished run is a cycle


def _stepped_policy(policy: ContextPolicy) -> ContextPolicy:
    """A context policy whose own model (``Summarize(model=...)``) makes its calls as steps."""
    model = getattr(policy, "model", None)
    if model is None:
        return policy
    if not dataclasses.is_dataclass(policy) or isinstance(policy, type):
        raise ConfigError(
            f"{type(policy).__name__} has a model of its own, which a DBOSAgent must make "
            "steps of: give it a dataclass policy, or wrap its model in StepModel yourself"
        )
    replaced: ContextPolicy = dataclasses.replace(policy, model=StepModel(model))
    return replaced
