"""Model calls and tool calls of a DBOS run, replay-safe: each made without a step when the
run's journal can stand for one, else as a DBOS step.

**A model call** goes through ``StepModel``, a model wrapping the agent's: each ``request``
has one recorded outcome (``replies.Replied``): the reply, or the failure (as the engine
classifies it: ``run.thinking.failure_from``), or the deadline's cut, or the cancel request
that stopped it. It is kept in the run's journal when the journal keeps outcomes
(``journal.OutcomeJournal``: ``agent_fsm.dbos.model_calls``), else recorded by a step. A
replay gets the recorded outcome back and raises or returns exactly as the first execution
did.

**A tool call** goes through a stand-in (``agent_fsm.dbos.tool_calls.stepped``), made
without a step when the tool journal can stand for one, else as a step around the whole
call.

``durable_config`` is the agent's run configuration with these steps in place, and
``ReplayedKeeper`` is where such a run lives: the clock, sleep, random numbers and deadline of
``agent_fsm.dbos.replay``, and nothing saved by the engine (DBOS records the steps).

Model calls and tool calls enforce the run's deadline (``replay.RunTime.remaining_s``) and
record when they ended, which is what the run's clock reads (``agent_fsm.dbos.replay``); the
activation's first one records when it began too, the activation's start
(``replay.RunTime.step``, ``replay.RunTime.begin``). Before a call, both pass the execution's fence
(``liveness.Admission.check``): a call starts only while this process's liveness lease, the
one the execution was admitted under, is fresh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from agent_fsm.compaction import ContextPolicy
from agent_fsm.dbos.model_calls import Unkept, call_model, without_step
from agent_fsm.dbos.replay import (
    MODEL_STEP,
    RunTime,
    active,
    interrupted,
    sleep,
)
from agent_fsm.dbos.replies import Replied
from agent_fsm.dbos.tool_calls import Answered, outcome_unknown, stepped
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.errors import ConfigError
from agent_fsm.messages import ModelRequest, ModelResponse
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.run.context import RunConfig
from agent_fsm.run.residence import Timekeeping
from agent_fsm.state import RunState
from agent_fsm.table import LAST_CALL_STATE, StopReason
from agent_fsm.tools.tool import ToolRegistry

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


class StepModel:
    """The agent's model, each of whose calls has a recorded outcome (see the module
    docstring).

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
        if run.cancelled is not None:  # an earlier step found the request: no call now
            raise _not_made(run.cancelled)
        last = run.state.state == LAST_CALL_STATE
        look = not run.request_seen()  # a tool call read it after the latest call: not again
        heard = run.heard  # what a call made without a step read so (recorded by this call)
        replied = await _replied(self.model, request, run, last=last, look=look, heard=heard)
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


async def _replied(
    model: Model, request: ModelRequest, run: RunTime, *, last: bool, look: bool, heard: str | None
) -> Replied:
    """The outcome of the activation's next model call: made without a step when the
    journal keeps outcomes and DBOS holds no step of it (an earlier execution's, whose
    journal failed), else as a step (named ``MODEL_STEP#N``, its number: a replay tells
    them apart); an outcome made without a step that the journal could not keep is
    recorded by that step."""
    number = run.next_model()
    name = f"{MODEL_STEP}#{number}"
    if run.outcomes is not None and name not in await run.recorded_steps():
        made = await without_step(
            model, request, run, run.model_key(number), last=last, look=look, heard=heard
        )
        if isinstance(made, Unkept):
            return await run.record_step(name, made.replied)
        run.begun(made.began_at)
        return made

    async def call() -> Replied:
        return await call_model(model, request, run, last=last, look=look, heard=heard)

    return await run.step(name, call)


def _not_made(reason: str) -> ModelCallError:
    """The failure of a model call a cancel request stopped before it was made: permanent,
    and the run is aborted once the state's work ends (``ReplayedKeeper.during``), so the
    abort row is the one taken."""
    return ModelCallError(
        f"the model call was not made: the run was cancelled ({reason})", transient=False
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
