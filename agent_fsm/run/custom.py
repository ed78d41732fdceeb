"""The work of a state the user added to the loop (``table.CustomState``).

The engine calls ``custom_work(ctx, state)`` as it calls ``think`` or ``act`` for the states of
the default loop: between triggers, never inside one. The user's function gets a
``StepContext``, the part of the run it may touch:

- read the run (``state``, ``limits``) and keep data of its own in ``notes`` (checkpointed);
- add a user message to the transcript (``say``), when every tool call is answered;
- in a state that ``counts_turn``, make one model call aside from the transcript (``ask``):
  counted as the turn its entry took, paid from the token budget, cancelled by ``abort()`` or
  the time limit, announced like any model call. A failure is recorded as THINK records one
  (``RunState.model_failure``), so the rows out of the state can read ``model_call_failed``.

A work function that raises stops the run's driver with ``TableError`` (the run has not moved
on; ``errors.TableError`` says how it continues).
"""

from __future__ import annotations

import inspect
from typing import Any

from agent_fsm.cancellation import StopScope
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
from agent_fsm.table import CustomState
from agent_fsm.tokens import estimate_message_tokens

__all__ = ["StepContext", "custom_work"]


class StepContext:
    """What the work of a ``CustomState`` may see and do of its run (see the module doc)."""

    __slots__ = ("_asked", "_ctx", "_spec")

    def __init__(self, ctx: RunContext, spec: CustomState) -> None:
        self._ctx = ctx
        self._spec = spec
        self._asked = False

    @property
    def state(self) -> RunState:
        """The run's state: read it; write only ``notes`` (the engine owns the rest)."""
        return self._ctx.state

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
        """The model's reply to ``request``, or why there is none (as THINK classifies it)."""
        ctx = self._ctx
        scope = StopScope(ctx.stop)
        try:
            with scope:
                response = await model.request(request)
        except BaseException as exc:
            if not scope.stopped and not is_own_failure(exc):
                raise  # the whole run was cancelled from outside, or a KeyboardInterrupt
            if not scope.stopped:
                return None, failure_from(exc)
            response = None
        if scope.stopped:
            message = f"the model call was interrupted: {ctx.why_stopped()}"
            return None, ModelFailure(message=message, permanent=True)
        if not isinstance(response, ModelResponse):
            message = f"the model returned {type(response).__name__}, not a ModelResponse"
            return None, ModelFailure(message=message, permanent=False)
        return response, None


async def custom_work(ctx: RunContext, spec: CustomState) -> None:
    """The work of ``spec`` for one activation: its turn counted first when it counts one.

    Raises:
        TableError: the work raised (chained to what it raised), or changed the turn or
            retry count, which the proof of termination rests on.
    """
    state = ctx.state
    if spec.counts_turn:
        previous, state.model_failure = state.model_failure, None
        await count_call(ctx, previous)
    step = StepContext(ctx, spec)
    counts = (state.turns, state.retries)
    try:
        done = spec.work(step)
        if inspect.isawaitable(done):
            await done
    except TableError:
        raise
    except Exception as exc:
        raise TableError(
            f"the work of state {spec.name} raised {describe(exc)} (turn {state.turns})"
        ) from exc
    if (state.turns, state.retries) != counts:
        raise TableError(
            f"the work of state {spec.name} changed the run's turns or retries (from {counts} "
            f"to {(state.turns, state.retries)}): only the engine counts them, and the turn "
            "budget that ends every run reads them"
        )
