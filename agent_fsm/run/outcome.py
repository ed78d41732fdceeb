"""How a run ends: the error text for each stop reason, the events that announce the end, and
which ends can be resumed. Pure functions of the final state; the engine applies them."""

from __future__ import annotations

from agent_fsm.events import Event, GuardTripped, RunFinished, RunPaused
from agent_fsm.limits import Limits
from agent_fsm.state import RunResult, RunState, RunStatus
from agent_fsm.table import Row, StopReason

__all__ = ["RESUMABLE", "describe_failure", "ending_events"]

RESUMABLE = frozenset(
    {StopReason.ASK_USER, StopReason.APPROVAL_REQUIRED, StopReason.ABORTED, StopReason.TIMEOUT}
)
"""Runs that ended with these can be resumed."""


def describe_failure(state: RunState, limits: Limits, reason: StopReason) -> str:
    """``RunResult.error`` for a run that stopped in ERROR with ``reason``: what went wrong,
    with the numbers that tripped the guard."""
    failure = state.model_failure
    descriptions = {
        StopReason.ABORTED: state.abort_reason or "aborted",
        StopReason.MODEL_ERROR: failure.message if failure else "the model call failed",
        StopReason.CONTENT_FILTER: "the provider's content filter withheld the reply",
        StopReason.CONSECUTIVE_ERRORS: (
            f"{state.consecutive_errors} consecutive errors (limit {limits.max_consecutive_errors})"
        ),
        StopReason.TOKEN_BUDGET: (
            f"token budget of {limits.token_budget} exhausted: used "
            f"{state.usage.total_tokens}, next prompt needs about "
            f"{state.prompt_tokens_estimate + state.tools_tokens_estimate}"
        ),
        StopReason.MAX_TURNS: f"all {limits.max_turns} model calls used",
        StopReason.TIMEOUT: (
            f"timed out after {state.elapsed_s:.3g} s (limit {limits.timeout_s:g} s)"
        ),
        StopReason.LOOP_DETECTED: f"loop detected: {state.loop.detected}",
    }
    return descriptions.get(reason, reason.value)


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
        )
    )
    return events
