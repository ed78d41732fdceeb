"""THINK: one model call, and what the run takes from its reply or its failure.

``think(ctx)`` is the whole of the THINK state's work. It never raises for anything the
model does: an exception, a reply that is not a ``ModelResponse``, an empty reply, or a call
cut short by ``abort()`` or the deadline each become a ``ModelFailure`` in the run state, which
the THINK guards read (retry, give up, or stop with ``aborted``/``timeout``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from agent_fsm.cancellation import StopScope
from agent_fsm.constructors import builder
from agent_fsm.errors import ScriptExhaustedError
from agent_fsm.events import MessageUpdated, ModelFailed, ModelRequested, ModelResponded
from agent_fsm.failures import describe, is_own_failure
from agent_fsm.hooks import BeforeModel, ModelPlan, plan_call
from agent_fsm.limits import Limits
from agent_fsm.loop.detection import record_reply_text
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    ReplyDelta,
    ToolCall,
    ToolSpec,
    Usage,
    UserMessage,
    clean_message,
)
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.output import OutputInvalid
from agent_fsm.pricing import Pricing
from agent_fsm.prompt import prompt_messages
from agent_fsm.run.context import RunContext
from agent_fsm.run.guarding import screen_output
from agent_fsm.state import ModelFailure
from agent_fsm.table import Verb
from agent_fsm.tokens import estimate_message_tokens, estimate_tools_tokens
from agent_fsm.tools.execution import retry_delay

__all__ = [
    "STOPPED",
    "backoff_s",
    "begin_call",
    "count_call",
    "failed",
    "failure_from",
    "make_call",
    "report_failure",
    "request_aside",
    "request_without_tools",
    "take_response",
    "think",
    "with_call_ids",
]

# Built on every model call (see constructors.builder).
_model_request = builder(ModelRequest)
_model_requested = builder(ModelRequested)
_model_responded = builder(ModelResponded)


def failure_from(exc: BaseException) -> ModelFailure:
    """Classify an exception raised by a model call: transient ones are retried."""
    if isinstance(exc, ModelCallError):
        message = describe(exc).removeprefix(f"{type(exc).__name__}: ")
        return ModelFailure(
            message=message,
            permanent=not exc.transient,
            retry_after_s=exc.retry_after_s,
            context_overflow=exc.context_overflow,
            prompt_tokens=exc.prompt_tokens,
        )
    transient = isinstance(exc, TimeoutError | ConnectionError)
    if isinstance(exc, ScriptExhaustedError):
        transient = False
    return ModelFailure(message=describe(exc), permanent=not transient)


def with_call_ids(message: AssistantMessage, turn: int) -> AssistantMessage:
    """The message with every tool call given a non-empty id unique within the reply.

    Each result must name its call; a model that omits or repeats ids would otherwise make
    the transcript ambiguous. Ids the model chose are kept whenever they are usable.
    """
    chosen = {tool_call.id for tool_call in message.tool_calls}
    if len(chosen) == len(message.tool_calls) and "" not in chosen:
        return message  # the usual case: nothing to fix
    seen: set[str] = set()
    fixed: list[ToolCall] = []
    for index, tool_call in enumerate(message.tool_calls):
        if not tool_call.id or tool_call.id in seen:
            new_id, attempt = f"call_{turn}_{index}", 0
            while new_id in chosen or new_id in seen:  # never take an id the model used
                attempt += 1
                new_id = f"call_{turn}_{index}_{attempt}"
            tool_call = tool_call.model_copy(update={"id": new_id})
        seen.add(tool_call.id)
        fixed.append(tool_call)
    return message.model_copy(update={"tool_calls": tuple(fixed)})


def backoff_s(
    failure: ModelFailure,
    attempt: int,
    limits: Limits,
    jitter: Callable[[], float] = random.random,
) -> float:
    """The pause before model retry number ``attempt`` (1-based): the tool runtime's
    exponential backoff with jitter (from ``jitter``: the run's ``RunConfig.random``), never
    shorter than the server's Retry-After (itself cut to ``retry_after_max_s``). Never longer
    than ``Limits.model_backoff_ceiling_s``, which the ``no_retries_left`` guard plans with."""
    retry_after = min(failure.retry_after_s or 0.0, limits.retry_after_max_s)
    return max(retry_delay(attempt, limits, jitter), retry_after)


async def think(ctx: RunContext) -> None:
    """THINK's work: one model call (after a backoff, if the last one failed), and its reply
    taken in, or why there is none recorded as a ``ModelFailure``. Must not raise for
    anything the model does."""
    state = ctx.state
    previous = begin_call(ctx)
    if previous is STOPPED:
        return
    estimate = state.prompt_tokens_estimate + state.tools_tokens_estimate
    made = await make_call(ctx, _call_model(ctx, previous, estimate))
    if made is not None:
        _take_reply(ctx, *made)
        if ctx.config.output_guardrails and _would_end_the_run(ctx):
            await screen_output(ctx, state.output or "")
    elif state.model_failure is not None and state.model_failure.context_overflow:
        _learn_overflow(ctx, state.model_failure, estimate)


def _would_end_the_run(ctx: RunContext) -> bool:
    """The reply just taken is an answer a row into DONE would end the run with: text, no
    tool calls, no correction due, no input waiting, not withheld by the provider."""
    state = ctx.state
    return (
        state.model_failure is None
        and not state.last_tool_calls
        and state.correction is None
        and not state.pending_input
        and not state.follow_ups
        and state.last_finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    )


def _learn_overflow(ctx: RunContext, failure: ModelFailure, estimate: int) -> None:
    """A prompt the server refused as too long teaches the calibration: it was at least the
    size the server named, else longer than the window, so the estimate of a prompt that
    size now exceeds the window and the rows shrink it (or stop ``context_window``)."""
    window = ctx.limits.context_window
    size = failure.prompt_tokens or (window + 1 if window is not None else None)
    if size is not None:
        ctx.state.calibration.learn(estimate, size)


STOPPED = ModelFailure(message="stopped before the call", permanent=True)
"""What ``begin_call`` returns when the run was stopped before the call could start."""


def begin_call(ctx: RunContext) -> ModelFailure | None:
    """Clear what the last call left for the guards; return the failure of the last call (a
    retry backs off from it), or ``STOPPED`` when the run was stopped already (recorded as
    an interrupted call: no call is made)."""
    state = ctx.state
    previous = state.model_failure
    state.model_failure = None
    state.last_finish_reason = None
    state.last_tool_calls = 0
    state.summarised = False
    if ctx.stop.is_set():
        _interrupted(ctx)
        return STOPPED
    return previous


async def make_call(
    ctx: RunContext, call: Coroutine[Any, Any, tuple[object, int]]
) -> tuple[ModelResponse, int] | None:
    """Await ``call`` (a model call, not started yet, giving the reply and the estimate of
    its prompt) inside the run's stop scope. Returns the reply, or None when there is none:
    the failure (an exception, the deadline or ``abort()``, something that is not a
    ``ModelResponse``) is then recorded as ``RunState.model_failure`` for the guards. Raises
    only for a cancellation of the whole run from outside, or a ``KeyboardInterrupt``."""
    scope = StopScope(ctx.stop)
    try:
        with scope:
            response, estimate = await call
    except BaseException as exc:
        if scope.stopped:  # the model turned our cancellation into an error of its own
            _interrupted(ctx)
        elif is_own_failure(exc):  # anything the model raised, CancelledError and all
            failed(ctx, failure_from(exc))
        else:
            raise  # a cancellation of the whole run from outside, or a KeyboardInterrupt
        return None
    if scope.stopped:
        _interrupted(ctx)
        return None
    if not isinstance(response, ModelResponse):
        failed(
            ctx,
            ModelFailure(
                message=f"the model returned {type(response).__name__}, not a ModelResponse",
                permanent=False,
            ),
        )
        return None
    return response, estimate


def _hold_to_output_type(ctx: RunContext, text: str, finish: FinishReason) -> None:
    """A text reply that would end a run with an output type: in tool mode it gave no result
    at all, in native mode its text must validate. One that fails goes back to the model as a
    correction (queued input: the ``input_waiting`` row takes the run round again, a turn
    like any other) and counts against ``Limits.output_retries``."""
    output = ctx.config.output
    assert output is not None
    if finish is not FinishReason.STOP:
        return  # truncated, filtered or refused: the rows for those decide
    problem: str | None = None
    if output.mode == "native":
        try:
            output.parse(text)
        except OutputInvalid as exc:
            problem = str(exc)
        else:
            return
    ctx.state.output_failures += 1
    ctx.state.correction = output.correction(problem)


def failed(ctx: RunContext, failure: ModelFailure) -> None:
    """Record a failed model call; the THINK guards decide whether it is retried (its own
    budget: ``Limits.model_retries``), so it does not count as a failed turn."""
    ctx.state.model_failure = failure
    report_failure(ctx, failure)


def report_failure(ctx: RunContext, failure: ModelFailure) -> None:
    """Log a failed model call and announce it (``ModelFailed``)."""
    state = ctx.state
    ctx.log.warning(
        "model_call_failed", turn=state.turns, error=failure.message, permanent=failure.permanent
    )
    emit = ctx.bus.emitter
    if emit is not None:
        emit(
            ModelFailed(
                run_id=state.run_id,
                turn=state.turns,
                message=failure.message,
                permanent=failure.permanent,
            )
        )


def _interrupted(ctx: RunContext) -> None:
    """The call was cancelled by abort() or the deadline: the run stops (no retry)."""
    message = f"the model call was interrupted: {ctx.why_stopped()}"
    failed(ctx, ModelFailure(message=message, permanent=True))


async def count_call(ctx: RunContext, previous: ModelFailure | None) -> None:
    """Count the model call about to be made: a new turn (turn += 1), or, when the row into
    this state was a retry row, a retry of the turn's call, after a backoff from the failure
    ``previous`` (retries += 1). The verifier bounds each kind by its own budget, so which it
    is follows the row, as the verifier reads it. Every state whose entry makes a model call
    counts it here: THINK, and a ``CustomState`` that ``counts_turn``."""
    state, config = ctx.state, ctx.config
    if _entered_by_retry(ctx):
        state.retries += 1
        state.turn_retries += 1
        if previous is not None:
            pause = backoff_s(previous, state.turn_retries, config.limits, ctx.random)
            state.turn_retry_wait_s += pause
            await ctx.sleep(pause)
    else:
        state.turns += 1
        state.turn_retries = 0
        state.turn_retry_wait_s = 0.0


async def _call_model(
    ctx: RunContext, previous: ModelFailure | None, estimate: int
) -> tuple[object, int]:
    """Make one model call, counted as a turn or a retry (``count_call``).

    Returns what the model returned, and the estimate of the prompt it was sent (a
    ``before_model`` hook may have changed the prompt)."""
    state, config = ctx.state, ctx.config
    await count_call(ctx, previous)
    model, messages = config.model, prompt_messages(state.messages, state.context)
    tools, choice = config.tools.specs, None
    if state.withheld:  # the loop ladder took these away (``Limits.loop_ladder``)
        tools = tuple(spec for spec in tools if spec.name not in state.withheld)
    hooks = config.hooks
    if hooks is not None and hooks.before_model is not None:
        plan = ModelPlan(
            model=model, messages=messages, tools=tools, run_id=state.run_id, turn=state.turns,
            retry=state.turn_retries, last_error=None if previous is None else previous.message,
        )  # fmt: skip
        plan, estimate = await _planned(ctx, hooks.before_model, plan, estimate)
        chosen = plan.model
        ctx.chosen_pricing = None if chosen is model else _price_of_chosen(ctx, chosen)
        model, messages, tools, choice = chosen, plan.messages, plan.tools, plan.tool_choice
    request = _request_for(ctx, model.name, messages, tools, choice, estimate)
    return await model.request(request), estimate


def _price_of_chosen(ctx: RunContext, model: Model) -> Pricing | None:
    """The price of a model a ``before_model`` hook chose instead of the agent's own, when
    the limits have prices (None when they have none: nothing is priced).

    Raises:
        ModelCallError: "before_model hook failed: ..." (permanent): the limits price models
            but not this one, so its call could not be counted against the money budget nor
            its cost reported; it is refused rather than counted as free.
    """
    limits = ctx.limits
    if not limits.prices:
        return None
    pricing = limits.price_of(model.name)
    if pricing is None:
        raise ModelCallError(
            f"before_model hook failed: it chose the model {model.name!r}, which "
            f"Limits.prices does not price (it prices {[name for name, _ in limits.prices]}): "
            "its call could not be counted",
            transient=False,
        )
    return pricing


def _request_for(
    ctx: RunContext,
    model_name: str,
    messages: Sequence[Message],
    tools: tuple[ToolSpec, ...],
    tool_choice: str | None,
    estimate: int,
) -> ModelRequest:
    """The request of one model call (announced by ``ModelRequested`` while anyone
    listens)."""
    state = ctx.state
    emit = ctx.bus.emitter
    on_delta = None
    if emit is not None:
        emit(
            _model_requested(
                run_id=state.run_id,
                turn=state.turns,
                messages=len(messages),
                estimated_prompt_tokens=state.calibration.prompt(estimate),
                model=model_name,
            )
        )

        def on_delta(delta: ReplyDelta) -> None:
            """Streamed fragments of the reply in flight (its turn is the current one)."""
            ctx.bus.emit(MessageUpdated(run_id=state.run_id, turn=state.turns, delta=delta))

    output = ctx.config.output
    return _model_request(
        messages=messages,
        tools=tools,
        run_id=state.run_id,
        turn=state.turns,
        on_delta=on_delta,
        output=output.format if output is not None and output.mode == "native" else None,
        tool_choice=tool_choice,
    )  # fmt: skip


async def _planned(
    ctx: RunContext, hook: BeforeModel, plan: ModelPlan, estimate: int
) -> tuple[ModelPlan, int]:
    """The plan ``hook`` makes of the call (``hooks.plan_call``), and the estimate of the
    prompt it sends: the hook may add text, but the prompt must still fit the context
    window with ``reply_tokens`` to spare, as the context rules keep every prompt.

    Raises:
        ModelCallError: "before_model hook failed: ...", as ``plan_call`` says, or a prompt
            that no longer fits (permanent).
    """
    state, config, limits = ctx.state, ctx.config, ctx.limits
    planned = await plan_call(hook, plan, config.tools)
    if planned.messages is plan.messages and planned.tools is plan.tools:
        return planned, estimate
    count = config.count_tokens
    changed = (
        state.prompt_tokens_estimate
        if planned.messages is plan.messages
        else sum(estimate_message_tokens(message, count) for message in planned.messages)
    ) + (
        state.tools_tokens_estimate
        if planned.tools is plan.tools
        else estimate_tools_tokens(planned.tools, count)
    )
    window = limits.context_window
    if window is not None and changed > estimate:
        tokens = state.calibration.prompt(changed)
        if tokens + limits.reply_tokens > window:
            raise ModelCallError(
                f"before_model hook failed: its prompt of ~{tokens} tokens leaves less than "
                f"reply_tokens={limits.reply_tokens} of the context window {window}",
                transient=False,
            )
    return planned, changed


USAGE_CEILING = 10**12
"""The most tokens one reply may report per count: far above any real call, and low enough
that a million calls sum below SQLite's INTEGER (2**63). A broken proxy's 2**63 is clamped
to it, and the token budget then ends the run."""


def _one_sane_request(usage: Usage) -> Usage:
    counts = ("input_tokens", "output_tokens", "cached_tokens", "reasoning_tokens")
    update: dict[str, int] = {name: min(getattr(usage, name), USAGE_CEILING) for name in counts}
    return usage.model_copy(update={**update, "requests": 1})


def _entered_by_retry(ctx: RunContext) -> bool:
    trace = ctx.state.trace
    if not trace:
        return False
    row = ctx.config.machine.rows[trace[-1][0]]
    if row.restarts:  # the step is done again after a crash: the row before counts
        found = ctx.entering_row()
        return found is not None and found.outcome is Verb.RETRY
    return row.outcome is Verb.RETRY


def request_aside(
    ctx: RunContext,
    instruction: UserMessage,
    *,
    model: str,
    estimate: int,
    transcript: bool = True,
    last_answer: bool = False,
) -> ModelRequest:
    """A model call beside the turns' own: the transcript as the model sees it (nothing of
    it when not ``transcript``) with ``instruction`` last, and no tools offered; announced
    (``ModelRequested``, with ``estimate``) while anyone listens. The last answer
    (LAST_ANSWER) and a custom state's ``StepContext.ask`` make theirs so."""
    state = ctx.state
    messages: list[Message] = (
        [*prompt_messages(state.messages, state.context), instruction]
        if transcript
        else [instruction]
    )
    return request_without_tools(
        ctx, messages, model=model, estimate=estimate, last_answer=last_answer
    )


def request_without_tools(
    ctx: RunContext,
    messages: Sequence[Message],
    *,
    model: str,
    estimate: int,
    last_answer: bool = False,
) -> ModelRequest:
    """The request of a call that offers no tools and sends ``messages`` (a summary, a last
    answer, a custom state's question), announced (``ModelRequested``) while anyone
    listens."""
    state = ctx.state
    emit = ctx.bus.emitter
    if emit is not None:
        emit(
            _model_requested(
                run_id=state.run_id,
                turn=state.turns,
                messages=len(messages),
                estimated_prompt_tokens=estimate,
                model=model,
                last_answer=last_answer,
            )
        )
    return _model_request(messages=messages, tools=(), run_id=state.run_id, turn=state.turns)


def take_response(
    ctx: RunContext, response: ModelResponse, estimate: int, *, last_answer: bool = False
) -> AssistantMessage:
    """Take in the reply of one model call: its message cleaned, its usage added to the
    run's (``_take_usage``) and priced (``RunConfig.pricing``), and the reply announced
    (``ModelResponded``). Returns the cleaned message, which the caller records as it
    needs; in a run with a checkpoint store (a journal), carrying the call's usage
    (``AssistantMessage.usage``), so that the checkpoint keeps it per call."""
    state = ctx.state
    message = clean_message(response.message)  # output and loop detection read it too
    usage = _take_usage(ctx, response, message, estimate)
    if ctx.journal is not None:  # a stored run keeps each call's usage with its reply
        # (made anew: cheaper than model_copy, whose per-call machinery costs more here)
        message = AssistantMessage(
            content=message.content,
            tool_calls=message.tool_calls,
            provider_data=message.provider_data,
            usage=usage,
        )
    pricing, cost = ctx.config.pricing, None
    chosen = ctx.chosen_pricing
    if chosen is not None:  # a before_model hook chose another model: its price
        pricing = chosen
        ctx.chosen_pricing = None
    if pricing is not None:
        cost = pricing.cost(usage)
        state.cost = (state.cost or 0.0) + cost
    emit = ctx.bus.emitter
    if emit is not None:
        emit(
            _model_responded(
                run_id=state.run_id,
                turn=state.turns,
                text=message.content,
                tool_calls=message.tool_calls,
                finish_reason=response.finish_reason,
                usage=usage,
                last_answer=last_answer,
                cost=cost,
            )
        )
    return message


def _take_usage(
    ctx: RunContext, response: ModelResponse, message: AssistantMessage, estimate: int
) -> Usage:
    """Add the usage of one reply to the run's, and return it: the server's report (one
    request, each count clamped to ``USAGE_CEILING``), or an estimate when it gave none. A
    report calibrates every later estimate against ``estimate``, the engine's own estimate
    of the prompt sent."""
    state = ctx.state
    usage = response.usage
    if usage is None:
        usage = Usage(
            input_tokens=estimate,
            output_tokens=estimate_message_tokens(message, ctx.config.count_tokens),
            requests=1,
            estimated=True,
        )
    elif usage.requests != 1 or max(usage.input_tokens, usage.output_tokens) > USAGE_CEILING:
        usage = _one_sane_request(usage)
    if not usage.estimated and estimate > 0:
        state.reported_prompt_tokens += usage.input_tokens
        state.estimated_prompt_tokens += estimate
        state.calibration.learn(estimate, usage.input_tokens)
    state.usage = state.usage + usage
    return usage


def _take_reply(ctx: RunContext, response: ModelResponse, estimate: int) -> None:
    state = ctx.state
    message = take_response(ctx, response, estimate)
    empty = not message.content and not message.tool_calls
    if empty and response.finish_reason in (FinishReason.STOP, FinishReason.TOOL_CALLS):
        failed(ctx, ModelFailure(message="the model returned an empty reply", permanent=False))
        return
    if message.tool_calls:
        message = with_call_ids(message, state.turns)
    else:
        state.output = message.content
        state.output_incomplete = response.finish_reason is FinishReason.LENGTH
    ctx.append(message)
    if ctx.config.output is not None and not message.tool_calls:
        _hold_to_output_type(ctx, message.content, response.finish_reason)
    state.last_finish_reason = response.finish_reason
    state.last_tool_calls = len(message.tool_calls)
    record_reply_text(
        state.loop,
        message.content,
        ctx.limits,
        [(tool_call.name, tool_call.arguments) for tool_call in message.tool_calls],
    )
