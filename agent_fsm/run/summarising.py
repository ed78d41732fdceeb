"""SUMMARISE: a context policy asked for a summary of the early conversation (``Summarize``),
and this turn's model call writes it.

``summarise(ctx)`` is the whole of the state's work. The call is a turn like THINK's (counted,
retried with backoff on a transient failure, paid from the token budget, cancelled by
``abort()`` and the deadline), made with the policy's own model when it has one, a prompt the
policy wrote (``SummaryDue``) and no tools. When the summary comes, it replaces the messages
before the policy's cut in every later prompt (``compacting.take_summary``) and the rows take
the run back to OBSERVE, which checks the shrunk prompt against the window again. A failure is
recorded as THINK records one (``RunState.model_failure``), and the SUMMARISE rows read it the
same way. Must not raise for anything the model does.
"""

from __future__ import annotations

from agent_fsm.messages import FinishReason, ModelResponse
from agent_fsm.models.base import Model
from agent_fsm.run.compacting import summary_messages, take_summary
from agent_fsm.run.context import RunContext
from agent_fsm.run.thinking import (
    STOPPED,
    begin_call,
    count_call,
    failed,
    make_call,
    request_without_tools,
    take_response,
)
from agent_fsm.state import ModelFailure
from agent_fsm.tokens import estimate_message_tokens

__all__ = ["summarise"]


async def summarise(ctx: RunContext) -> None:
    """SUMMARISE's work: the summary call, and the summary taken in (or why there is none)."""
    state, config = ctx.state, ctx.config
    previous = begin_call(ctx)
    if previous is STOPPED:
        return
    due = state.summary_due
    if due is None:  # only COMPACT's summary_requested row leads here, with one due
        failed(ctx, ModelFailure(message="no summary was asked for", permanent=True))
        return
    policy_model = getattr(config.context_policies[due.policy], "model", None)
    model: Model = policy_model if policy_model is not None else config.model
    messages = summary_messages(due)
    estimate = sum(estimate_message_tokens(m, config.count_tokens) for m in messages)

    async def call() -> tuple[object, int]:
        await count_call(ctx, previous)
        calibrated = state.calibration.prompt(estimate)
        request = request_without_tools(ctx, messages, model=model.name, estimate=calibrated)
        return await model.request(request), estimate

    made = await make_call(ctx, call())
    if made is not None:
        _take_summary(ctx, *made)


def _take_summary(ctx: RunContext, response: ModelResponse, estimate: int) -> None:
    summary = take_response(ctx, response, estimate).content.strip()
    if not summary:
        failed(ctx, ModelFailure(message="the summary call wrote no text", permanent=False))
        return
    if response.finish_reason is FinishReason.LENGTH:
        # A summary cut at its token limit would replace the turns it summarises with half
        # of what they said: the transcript is kept, and the call counts as failed (retried
        # while retries last: another try may be shorter).
        message = "the summary was cut off at the model's token limit; the transcript is kept"
        failed(ctx, ModelFailure(message=message, permanent=False))
        return
    take_summary(ctx, summary)
