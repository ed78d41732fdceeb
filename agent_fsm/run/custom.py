"""The work of a state the user added to the loop (``custom_table.CustomState``).

The engine calls ``custom_work(ctx, state)`` as it calls ``think`` or ``act`` for the states of
the default loop: between triggers, never inside one. The user's function gets a
``StepContext``, the part of the run it may touch:

- read the run (``state``, a read-only view: ``views.view_of``; ``limits``) and keep data of
  its own in ``notes`` (checkpointed), the one part of the run it may change;
- add a user message to the transcript (``say``), when every tool call is answered;
- in a state that ``counts_turn``, make one model call aside from the transcript (``ask``):
  counted as the turn its entry took, paid from the token budget, announced like any model
  call. A failure is recorded as THINK records one (``RunState.model_failure``), so the rows
  out of the state can read ``model_call_failed``.

The work runs inside the run's stop scope, as THINK's and ACT's do: ``abort()`` and the
deadline cancel it wherever it awaits (a model call, a sleep, its own I/O), and the rows out
of the state then see the stop (``abort_requested``, ``time_is_up``; for a state that counts a
turn, ``model_call_failed`` too).

A work function that raises, writes the run, or leaves it with different counts (turns,
retries, usage, last answers) or a transcript other than its ``say`` made, stops the run's
driver with ``TableError`` naming the state (the run has not moved on; ``errors.TableError``
says how it continues).
"""

from __future__ import annotations

import asyncio
import inspect
import math
from typing import Any

from agent_fsm.cancellation import StopScope
from agent_fsm.custom_table import CustomState
from agent_fsm.errors import TableError
from agent_fsm.failures import describe, is_own_failure
from agent_fsm.limits import Limits
from agent_fsm.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    UserMessage,
    clean_text,
)
from agent_fsm.models.base import Model
from agent_fsm.run.context import RunContext
from agent_fsm.run.thinking import (
    count_call,
    failure_from,
    report_failure,
    request_aside,
    take_response,
)
from agent_fsm.state import ModelFailure, RunState
from agent_fsm.tokens import estimate_message_tokens
from agent_fsm.views import view_of

__all__ = ["StepContext", "custom_work"]


class StepContext:
    """What the work of a ``CustomState`` may see and do of its run (see the module doc)."""

    __slots__ = ("_asked", "_ctx", "_spec", "said")

    def __init__(self, ctx: RunContext, spec: CustomState) -> None:
        self._ctx = ctx
        self._spec = spec
        self._asked = False
        self.said = 0
        """Messages this step added with ``say``."""

    @property
    def state(self) -> RunState:
        """The run's state, read-only (``views.view_of``): a write raises; keep your own data
        in ``notes``."""
        return view_of(self._ctx.state)

    @property
    def notes(self) -> dict[str, Any]:
        """The user's own data of this run (``RunState.notes``): JSON values, checkpointed
        with the run, read by the table's custom guards."""
        return self._ctx.state.notes

    @property
    def limits(self) -> Limits:
        return self._ctx.limits

    @property
    def turn(self) -> int:
        """Turns taken so far (this state's own, when it counts one, included)."""
        return self._ctx.state.turns

    def say(self, text: str) -> None:
        """Add a user message to the transcript: an instruction the next model call reads.

        Raises:
            TableError: the last reply's tool calls are not all answered yet (a user message
                between a call and its result would break the transcript).
        """
        messages = self._ctx.state.messages
        last = messages[-1] if messages else None
        if isinstance(last, AssistantMessage) and last.tool_calls:
            raise TableError(
                f"state {self._spec.name} said a message while the last reply's tool calls "
                "wait for their results: route the run through ACT first"
            )
        self._ctx.append(UserMessage(content=clean_text(text)))
        self.said += 1

    async def ask(
        self,
        instructions: str,
        *,
        model: Model | None = None,
        transcript: bool = True,
    ) -> str | None:
        """Make this state's one model call, aside from the transcript: the prompt is the
        transcript as the model sees it (``transcript=False``: none) and ``instructions`` as
        a last user message; no tools are offered. Nothing is added to the transcript.

        Returns the reply's text, or None when the call failed, was cancelled, or returned
        no text: then ``RunState.model_failure`` says why, as after a failed THINK call.

        Raises:
            TableError: the state does not ``counts_turn`` (its model call would not be
                bounded by the turn budget), or this activation asked already.
        """
        ctx, spec = self._ctx, self._spec
        if not spec.counts_turn:
            raise TableError(
                f"state {spec.name} asked the model, but only a state that counts_turn may: "
                "declare it CustomState(..., counts_turn=True)"
            )
        if self._asked:
            raise TableError(f"state {spec.name} asked the model twice in one turn")
        self._asked = True
        state = ctx.state
        instruction = UserMessage(content=clean_text(instructions))
        estimate = estimate_message_tokens(instruction, ctx.config.count_tokens) + (
            state.prompt_tokens_estimate if transcript else 0
        )
        chosen = model or ctx.config.model
        request = request_aside(
            ctx, instruction, model=chosen.name, estimate=estimate, transcript=transcript
        )
        reply, failure = await self._call(chosen, request)
        if reply is not None:
            text = take_response(ctx, reply, estimate).content
            if text.strip():
                return text
            failure = ModelFailure(message="the model's reply had no text", permanent=False)
        assert failure is not None
        state.model_failure = failure
        report_failure(ctx, failure)
        return None

    async def _call(
        self, model: Model, request: ModelRequest
    ) -> tuple[ModelResponse | None, ModelFailure | None]:
        """The model's reply to ``request``, or why there is none (as THINK classifies it).
        The work's stop scope (``custom_work``) cancels the call: that cancellation goes on
        up through the work, which stops there."""
        ctx = self._ctx
        try:
            response = await model.request(request)
        except BaseException as exc:
            if ctx.stop.is_set():
                if isinstance(exc, asyncio.CancelledError):
                    raise  # the stop: the work's scope takes it
                message = f"the model call was interrupted: {ctx.why_stopped()}"
                return None, ModelFailure(message=message, permanent=True)
            if not is_own_failure(exc):
                raise  # the whole run was cancelled from outside, or a KeyboardInterrupt
            return None, failure_from(exc)
        if not isinstance(response, ModelResponse):
            message = f"the model returned {type(response).__name__}, not a ModelResponse"
            return None, ModelFailure(message=message, permanent=False)
        return response, None


async def custom_work(ctx: RunContext, spec: CustomState) -> None:
    """The work of ``spec`` for one activation: its turn counted first when it counts one,
    then the work, inside the run's stop scope.

    Raises:
        TableError: the work raised (chained to what it raised), wrote the run, or changed
            its counts or its transcript (``_check_untouched``), which the proof of
            termination and the transcript's validity rest on.
    """
    state = ctx.state
    if spec.counts_turn:
        previous, state.model_failure = state.model_failure, None
        await count_call(ctx, previous)
    step = StepContext(ctx, spec)
    before = _counted(state)
    scope = StopScope(ctx.stop)
    try:
        with scope:
            done = spec.work(step)
            if inspect.isawaitable(done):
                await done
    except TableError:
        raise
    except BaseException as exc:
        if not scope.stopped and not is_own_failure(exc):
            raise  # the whole run was cancelled from outside, or a KeyboardInterrupt
        if not scope.stopped:
            raise TableError(
                f"the work of state {spec.name} raised {describe(exc)} (turn {state.turns})"
            ) from exc
    if scope.stopped:
        _interrupted(ctx, spec)
    _check_untouched(spec, state, before, step.said)
    _check_notes(spec, state.notes)


def _check_notes(spec: CustomState, notes: dict[str, Any]) -> None:
    """Notes are checkpointed with the run, so they hold JSON values: text (any lone
    surrogate replaced, as in the rest of the run's text: every store keeps UTF-8), numbers
    (finite), booleans, None, and lists and objects of those with text keys, as a tree.

    Raises:
        TableError: a value of another kind, or a key that is not clean text, naming its
            place in the notes and the state whose work put it there.
    """
    stack: list[tuple[dict[str, Any] | list[Any], str]] = [(notes, "notes")]
    seen: set[int] = set()
    while stack:
        container, path = stack.pop()
        if id(container) in seen:
            raise TableError(f"the work of state {spec.name} made {path} hold itself")
        seen.add(id(container))
        if isinstance(container, dict):
            for key in list(container):
                if not isinstance(key, str) or clean_text(key) != key:
                    raise TableError(
                        f"the work of state {spec.name} put the key {path}[{key!r}]: keys are text"
                    )
                container[key] = _checked_value(spec, container[key], f"{path}[{key!r}]", stack)
        else:
            for index, value in enumerate(container):
                container[index] = _checked_value(spec, value, f"{path}[{index}]", stack)


def _checked_value(
    spec: CustomState,
    value: object,
    where: str,
    stack: list[tuple[dict[str, Any] | list[Any], str]],
) -> object:
    """``value`` as notes keep it: text cleaned, a list or object queued to be checked."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict | list):
        stack.append((value, where))
        return value
    if not _json_scalar(value):
        raise TableError(
            f"the work of state {spec.name} put {type(value).__name__} {value!r:.60} in "
            f"{where}: notes hold JSON values (text, numbers, booleans, None, lists, objects)"
        )
    return value


def _json_scalar(value: object) -> bool:
    if value is None or isinstance(value, bool | int):
        return True
    return isinstance(value, float) and math.isfinite(value)


def _interrupted(ctx: RunContext, spec: CustomState) -> None:
    """``abort()`` or the deadline cancelled the work: say so; a state that counts a turn
    records it as an interrupted call, as THINK does, for its rows to read."""
    why = ctx.why_stopped()
    ctx.log.info("custom_work_interrupted", state=spec.name, why=why)
    if spec.counts_turn and ctx.state.model_failure is None:
        message = f"the work of state {spec.name} was interrupted: {why}"
        ctx.state.model_failure = ModelFailure(message=message, permanent=True)


_Counted = tuple[int, int, int, int, int]


def _counted(state: RunState) -> _Counted:
    """What only the engine may change while a custom state works: the turn and retry
    counts, the tokens used, the last answers, and the transcript's length."""
    usage = state.usage
    return (state.turns, state.retries, usage.total_tokens, state.last_answers, len(state.messages))


def _check_untouched(spec: CustomState, state: RunState, before: _Counted, said: int) -> None:
    """Raise ``TableError`` when the work left the run's counts or transcript otherwise than
    its own ``ask`` and ``say`` did (a reference to the live state kept from elsewhere)."""
    after = _counted(state)
    asked_tokens = after[2] >= before[2]  # ask() adds the tokens of its call, nothing else
    expected = (*before[:2], after[2] if asked_tokens else before[2], before[3], before[4] + said)
    if after != expected:
        raise TableError(
            f"the work of state {spec.name} changed the run's counts or transcript (turns, "
            f"retries, tokens, last answers, messages: {before} before, {after} after, "
            f"{said} message(s) said): only the engine counts them, and the budgets that end "
            "every run read them"
        )
