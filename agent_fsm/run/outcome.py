"""How a run ends: what the run state records when a row into DONE or ERROR is taken (the stop
reason, the error text with the numbers that tripped the guard, an answer for every call of a
reply the run will not act on), and the events that announce the end."""

from __future__ import annotations

from agent_fsm.events import Event, GuardTripped, RunFinished, RunPaused
from agent_fsm.limits import Limits
from agent_fsm.messages import AssistantMessage
from agent_fsm.run.context import RunContext
from agent_fsm.state import (
    CONTROL_STOPS,
    RunResult,
    RunState,
    RunStatus,
    calibrated_prompt_tokens,
)
from agent_fsm.table import LAST_CALL_STATE, AgentState, Row, StopReason
from agent_fsm.tools.results import skipped_result

__all__ = ["describe_failure", "ending_events", "record_stop"]


def record_stop(ctx: RunContext, row: Row) -> None:
    """The run took ``row`` into DONE or ERROR: record why, say what went wrong, and answer
    the calls of a reply it will not act on, so none is left orphaned."""
    state = ctx.state
    stop_reason = row.stop_reason
    assert stop_reason is not None  # a verified row into a terminal state has one
    state.stop_reason = stop_reason
    if state.requests:
        _take_request(state, stop_reason)
    if row.dest is AgentState.ERROR:
        state.error = describe_failure(state, ctx.limits, stop_reason)
        # its output is the last answer, if written (and passed the output guardrails)
        if row.source is not LAST_CALL_STATE or stop_reason is StopReason.GUARDRAIL_TRIPPED:
            state.output = None
    if row.source is AgentState.THINK and state.last_tool_calls:
        last = state.messages[-1]
        if isinstance(last, AssistantMessage):
            reason = f"the run ended ({stop_reason.value}) before it could run"
            for tool_call in last.tool_calls:
                ctx.append(skipped_result(tool_call, reason))
        state.last_tool_calls = 0


def _take_request(state: RunState, stop_reason: StopReason) -> None:
    """A control row ended the run: the request it read is what the run stopped on
    (``RunState.control``: the question asked, the calls to approve), and its text the
    run's output. Any other stop leaves the turn's requests unanswered."""
    for request in state.requests:
        if CONTROL_STOPS[request.kind] is stop_reason:
            state.control = request.model_copy(update={"pause": f"pause-{len(state.trace)}"})
            state.output = request.text
            if request.sub_agent is not None:  # kept across the stop, for ACT to carry out
                state.awaiting_child = state.control
            return


def _model_error(state: RunState, limits: Limits) -> str:
    """Why the model call failed and, for a transient failure, why it was not retried."""
    failure = state.model_failure
    if failure is None:
        return "the model call failed"
    if failure.permanent:
        return failure.message
    attempts = state.turn_retries + 1
    if state.retries >= limits.model_retries_per_run:
        why = f"{state.retries} retries in the run, the most allowed"
    elif state.turn_retries >= limits.model_retries:
        why = f"{state.turn_retries} retries, the most allowed for one call"
    else:
        why = (
            f"{state.turn_retries} retries, {state.turn_retry_wait_s:.1f} s waited; the next "
            f"would pass retry_wait_s={limits.retry_wait_s:g}"
        )
    return f"the model call failed {attempts} times in a row ({why}): {failure.message}"


def _context_window(state: RunState, limits: Limits) -> str:
    """Why the prompt could not be made to fit, with the numbers (or the server's words,
    when it refused the prompt)."""
    failure = state.model_failure
    if failure is not None and failure.context_overflow:
        return f"the server refused the prompt as longer than its context: {failure.message}"
    window = limits.context_window or 0
    return (
        f"the prompt (about {calibrated_prompt_tokens(state)} tokens with the tool "
        f"definitions) does not fit the context window of {window} tokens with "
        f"{limits.reply_tokens} kept for the reply: {state.context_problem or 'nothing shrank it'}"
    )


_SAID = {
    StopReason.CONTENT_FILTER: "the provider's content filter withheld the reply",
    StopReason.REFUSED: "the model declined the request",
}
"""What ``RunResult.error`` says for the stops that have no numbers to report."""


def describe_failure(state: RunState, limits: Limits, reason: StopReason) -> str:
    """``RunResult.error`` for a run that stopped in ERROR with ``reason``: what went wrong,
    with the numbers that tripped the guard (only the one asked for is worked out)."""
    fixed = _SAID.get(reason)
    if fixed is not None:
        return fixed
    match reason:
        case StopReason.ABORTED:
            return state.abort_reason or "aborted"
        case StopReason.MODEL_ERROR:
            return _model_error(state, limits)
        case StopReason.INVALID_OUTPUT:
            return (
                f"the final answer did not validate {state.output_failures} times "
                f"(output_retries={limits.output_retries})"
            )
        case StopReason.CONSECUTIVE_ERRORS:
            return (
                f"{state.consecutive_errors} consecutive errors "
                f"(limit {limits.max_consecutive_errors})"
            )
        case StopReason.TOKEN_BUDGET | StopReason.COST_BUDGET:
            return _budget_spent(reason, state, limits)
        case StopReason.CONTEXT_WINDOW:
            return _context_window(state, limits)
        case StopReason.MAX_TURNS:
            return f"all {limits.max_turns} turns used"
        case StopReason.TIMEOUT:
            return f"timed out after {state.elapsed_s:.3g} s (limit {limits.timeout_s:g} s)"
        case StopReason.LOOP_DETECTED:
            return f"loop detected: {state.loop.detected}"
        case StopReason.GUARDRAIL_TRIPPED if state.guardrail_trip is not None:
            trip = state.guardrail_trip
            why = f": {trip.reason}" if trip.reason else ""
            return f"the {trip.kind} guardrail {trip.guardrail!r} tripped{why}"
        case _:
            return reason.value


def _budget_spent(reason: StopReason, state: RunState, limits: Limits) -> str:
    """Why the token or the money budget stopped the run: what was spent, and what the next
    prompt needs."""
    prompt = calibrated_prompt_tokens(state)
    if reason is StopReason.TOKEN_BUDGET:
        return (
            f"token budget of {limits.token_budget} exhausted: used "
            f"{state.usage.total_tokens}, next prompt needs about {prompt}"
        )
    return (
        f"cost budget of {limits.cost_budget or 0.0:g} spent: used {state.cost or 0.0:.6g}, "
        f"next prompt costs about {prompt * limits.most_per_input_token:.6g}"
    )


def ending_events(state: RunState, row: Row, result: RunResult) -> list[Event]:
    """The events of the run's last transition, in order: RunPaused (when it waits for a
    person), GuardTripped (the row that stopped it), RunFinished."""
    stop_reason = result.stop_reason
    events: list[Event] = []
    if result.status is RunStatus.NEEDS_INPUT and state.control is not None:
        events.append(
            RunPaused(
                run_id=state.run_id,
                stop_reason=stop_reason,
                question=state.control.text,
                pending_calls=state.control.pending_calls,
                pause=state.control.pause,
            )
        )
    events.append(
        GuardTripped(
            run_id=state.run_id, state=row.source, guards=row.guards, stop_reason=stop_reason
        )
    )
    events.append(
        RunFinished(
            run_id=state.run_id,
            status=result.status,
            stop_reason=stop_reason,
            final_state=result.final_state,
            turns=state.turns,
            usage=state.usage,
            output=result.output,
            error=result.error,
            cost=state.cost,
        )
    )
    return events
