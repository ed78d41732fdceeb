"""LAST_ANSWER: a limit is ending the run, and the model gets one last call, without tools,
to write its best answer from what the run has (``Limits.last_answer``).

``answer(ctx)`` is the whole of the state's work. The stop that asked for the answer is the
stop row that the row into LAST_ANSWER softens (``table.softened_stop``); it is kept in
``RunState.closing``, which the rows out read, so the run ends with that stop whatever the
last call itself costs in tokens or time.

The call is made once, never retried, within ``Limits.last_answer_timeout_s`` (the run's own
time may be up already, and its deadline does not cut the answer short); ``Run.abort``
cancels it. Its prompt is the transcript as sent with one more user message asking for the
answer (``LAST_ANSWER_PROMPT``, or the agent's own). When the answer comes, that message and
the reply join the transcript, and the reply is the run's ``output``. A reply that asks for
tools anyway gives its text only: its calls are never run or kept, so none goes unanswered.
A prompt too big for the context window was shrunk before the run came here, by COMPACT
(the rows into COMPACT guarded by ``table.LAST_ANSWER_WINDOW_GUARD``, which record the stop in
``RunState.closing``); if it still does not fit, no call is made.
Nothing the model does makes this raise: a failed, empty or skipped answer is reported
(``ModelFailed``) and the run ends with its stop all the same.
"""

from __future__ import annotations

import asyncio

from agent_fsm.cancellation import StopEvent, StopScope
from agent_fsm.failures import is_own_failure
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelResponse,
    UserMessage,
)
from agent_fsm.run.context import RunContext
from agent_fsm.run.guarding import screen_output
from agent_fsm.run.thinking import failure_from, report_failure, request_aside, take_response
from agent_fsm.state import ModelFailure
from agent_fsm.table import StopReason, softened_stop
from agent_fsm.tokens import estimate_message_tokens

__all__ = ["LAST_ANSWER_PROMPT", "answer", "last_answer_request"]

LAST_ANSWER_PROMPT = (
    "{reason} You cannot call tools any more. From what you have found so far, write your "
    "best final answer to the request now. Say plainly what is still unknown or unfinished."
)
"""The user message that asks for the last answer; ``{reason}`` becomes why the run is
ending (``Agent(last_answer_prompt=...)`` replaces it)."""

_REASONS = {
    StopReason.TOKEN_BUDGET: "This task has used up its token budget.",
    StopReason.MAX_TURNS: "This task has used all the turns it is allowed.",
    StopReason.TIMEOUT: "This task has run out of time.",
    StopReason.LOOP_DETECTED: "This task is going round in circles: {loop}.",
}


def last_answer_request(template: str, reason: StopReason, loop: str | None) -> UserMessage:
    """The message that asks for the last answer when ``reason`` ends the run."""
    why = _REASONS.get(reason, f"This task is ending ({reason.value}).")
    why = why.replace("{loop}", loop or "the same steps again and again")
    return UserMessage(content=template.replace("{reason}", why))


async def answer(ctx: RunContext) -> None:
    """LAST_ANSWER's work: record the stop that fired, then ask for the last answer."""
    state, config = ctx.state, ctx.config
    closing = state.closing  # set by COMPACT when the prompt was shrunk for this answer
    if closing is None:
        entered_by = ctx.entering_index()
        assert entered_by is not None  # a row took the run here
        closing = softened_stop(config.machine.rows, entered_by)
    assert closing is not None  # the verifier's rule 5: a row into LAST_ANSWER softens a stop
    state.closing = closing
    state.output = None
    if state.abort_reason is not None:  # whoever aborted wants no more calls
        _skipped(ctx, f"the run was aborted: {state.abort_reason}")
        return
    template = config.last_answer_prompt or LAST_ANSWER_PROMPT
    request = last_answer_request(template, closing, state.loop.detected)
    extra = estimate_message_tokens(request, config.count_tokens)
    if not _fits(ctx, extra):
        _skipped(ctx, "its prompt does not fit the context window")
        return
    await _ask(ctx, request, extra)


def _estimate(ctx: RunContext, extra: int) -> tuple[int, int]:
    """The engine's estimate of the last answer's prompt (no tools are sent), raw and
    calibrated."""
    state = ctx.state
    raw = state.prompt_tokens_estimate + extra
    return raw, state.calibration.prompt(raw)


def _fits(ctx: RunContext, extra: int) -> bool:
    window = ctx.limits.context_window
    return window is None or _estimate(ctx, extra)[1] + ctx.limits.reply_tokens <= window


async def _ask(ctx: RunContext, request: UserMessage, extra: int) -> None:
    """Make the call, with a stop of its own (the run's may be set: its time is up) that
    ``Run.abort`` sets, and its own time limit."""
    state, config = ctx.state, ctx.config
    estimate, calibrated = _estimate(ctx, extra)
    ctx.stop = StopEvent()
    state.last_answers += 1
    call = request_aside(
        ctx, request, model=config.model.name, estimate=calibrated, last_answer=True
    )
    scope = StopScope(ctx.stop)
    try:
        with scope:
            async with asyncio.timeout(ctx.limits.last_answer_timeout_s):
                response = await config.model.request(call)
    except BaseException as exc:
        if scope.stopped:
            _skipped(ctx, f"the call was interrupted: {ctx.why_stopped()}")
        elif isinstance(exc, TimeoutError):
            _skipped(ctx, f"it took longer than {ctx.limits.last_answer_timeout_s:g} s")
        elif is_own_failure(exc):
            _skipped(ctx, f"the call failed: {failure_from(exc).message}")
        else:
            raise  # a cancellation of the whole run from outside, or a KeyboardInterrupt
        return
    if scope.stopped:
        _skipped(ctx, f"the call was interrupted: {ctx.why_stopped()}")
        return
    _take_answer(ctx, request, response, estimate)
    output = ctx.state.output
    if output is not None and "LAST_ANSWER" in ctx.config.screened_ends:
        await screen_output(ctx, output, rewrite=False)


def _take_answer(ctx: RunContext, request: UserMessage, response: object, estimate: int) -> None:
    state = ctx.state
    if not isinstance(response, ModelResponse):
        _skipped(ctx, f"the model returned {type(response).__name__}, not a ModelResponse")
        return
    message = take_response(ctx, response, estimate, last_answer=True)
    if not message.content.strip():
        _skipped(ctx, "the reply had no text")
        return
    if message.tool_calls:
        ctx.log.info("last_answer_tool_calls_dropped", calls=len(message.tool_calls))
    ctx.append(request)
    ctx.append(AssistantMessage(content=message.content))
    state.output = message.content
    state.output_incomplete = response.finish_reason is FinishReason.LENGTH
    if state.output_incomplete:
        ctx.log.warning("last_answer_cut_off", chars=len(message.content))


def _skipped(ctx: RunContext, why: str) -> None:
    """No last answer: say why; the run ends with its stop all the same."""
    report_failure(ctx, ModelFailure(message=f"no last answer was written: {why}", permanent=True))
