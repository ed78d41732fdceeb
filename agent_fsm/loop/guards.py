"""The guards: pure, named predicates over (RunState, Limits).

Each guard reads a handful of fields and does O(1) work: everything that needs history (loop
detection, the prompt-size estimate, error counts) is kept incrementally by the engine and
``loop.detection``, never recomputed here. Guards must have no side effects, because
``transitions`` evaluates them whenever it decides a transition (including ``may_<trigger>``
checks).
"""

from __future__ import annotations

from collections.abc import Callable

from agent_fsm.limits import Limits
from agent_fsm.messages import FinishReason
from agent_fsm.state import ControlKind, RunState, calibrated_prompt_tokens
from agent_fsm.table import CLOSING_GUARDS, STOP_GUARDS, TERMINAL_STATES

__all__ = ["GUARDS", "Guard"]

Guard = Callable[[RunState, Limits], bool]


def abort_requested(state: RunState, limits: Limits) -> bool:
    """Someone asked the run to stop."""
    return state.abort_reason is not None


def prompt_exceeds_budget(state: RunState, limits: Limits) -> bool:
    """The next prompt (by the calibrated estimate) does not fit in the tokens left: do not
    start the call."""
    return state.usage.total_tokens + calibrated_prompt_tokens(state) > limits.token_budget


def prompt_exceeds_cost_budget(state: RunState, limits: Limits) -> bool:
    """The next prompt (by the calibrated estimate), priced at the highest input price
    known, does not fit in the money left: do not start the call."""
    if limits.cost_budget is None:
        return False
    spent = state.cost or 0.0
    return limits.money_spent(spent + calibrated_prompt_tokens(state) * limits.most_per_input_token)


def cost_budget_spent(state: RunState, limits: Limits) -> bool:
    """Reported usage, priced, has reached the money budget."""
    return limits.money_spent(state.cost or 0.0)


def prompt_exceeds_window(state: RunState, limits: Limits) -> bool:
    """The next prompt (by the calibrated estimate) leaves less than ``reply_tokens`` of the
    model's context window: the call would fail, or its reply would be cut."""
    window = limits.context_window
    return window is not None and calibrated_prompt_tokens(state) + limits.reply_tokens > window


def summary_requested(state: RunState, limits: Limits) -> bool:
    """A context policy asked for a summary of the early conversation (a model call)."""
    return state.summary_due is not None


def summary_written(state: RunState, limits: Limits) -> bool:
    """The model call just made wrote the summary a context policy asked for."""
    return state.summarised


def output_rejected(state: RunState, limits: Limits) -> bool:
    """The final answer did not validate against the output type: a correction is due."""
    return state.correction is not None


def model_call_failed(state: RunState, limits: Limits) -> bool:
    """The model call of this turn raised or returned garbage."""
    return state.model_failure is not None


def context_overflowed(state: RunState, limits: Limits) -> bool:
    """The server refused the prompt as longer than its context window."""
    failure = state.model_failure
    return failure is not None and failure.context_overflow


def stopped_by_context_window(state: RunState, limits: Limits) -> bool:
    """The run stopped because its prompt did not fit the context window: a resume with a
    larger window (or a shrunk transcript) can go on."""
    return state.stop_reason in STOP_GUARDS["stopped_by_context_window"]


def model_error_is_permanent(state: RunState, limits: Limits) -> bool:
    """The model failure cannot be cured by retrying."""
    return state.model_failure is not None and state.model_failure.permanent


def too_many_errors(state: RunState, limits: Limits) -> bool:
    """Turns whose tool calls all failed, in a row, hit the limit."""
    return state.consecutive_errors >= limits.max_consecutive_errors


def no_turns_left(state: RunState, limits: Limits) -> bool:
    """Every allowed turn has been taken."""
    return state.turns >= limits.max_turns


def no_retries_left(state: RunState, limits: Limits) -> bool:
    """The failed model call may not be retried: the run's retries or this turn's are used
    up, or the next backoff would take this turn's wait past ``retry_wait_s``."""
    if state.retries >= limits.model_retries_per_run:
        return True
    if state.turn_retries >= limits.model_retries:
        return True
    failure = state.model_failure
    ceiling = limits.model_backoff_ceiling_s(
        state.turn_retries + 1, failure.retry_after_s if failure else None
    )
    return state.turn_retry_wait_s + ceiling > limits.retry_wait_s


def reply_was_filtered(state: RunState, limits: Limits) -> bool:
    """The provider withheld the reply (content filter)."""
    return state.last_finish_reason is FinishReason.CONTENT_FILTER


def reply_was_refused(state: RunState, limits: Limits) -> bool:
    """The model declined to answer (a refusal, which a provider reports apart from text)."""
    return state.last_finish_reason is FinishReason.REFUSAL


def reply_has_tool_calls(state: RunState, limits: Limits) -> bool:
    """The reply asks for tool calls (whatever its finish reason says)."""
    return state.last_tool_calls > 0


def input_waiting(state: RunState, limits: Limits) -> bool:
    """The caller queued a steering or follow-up message that the run has not observed."""
    return bool(state.pending_input) or bool(state.follow_ups)


def reply_was_truncated(state: RunState, limits: Limits) -> bool:
    """The reply hit the model's output-token limit."""
    return state.last_finish_reason is FinishReason.LENGTH


def _requested(state: RunState, kind: ControlKind) -> bool:
    """The turn made a control request of ``kind`` (at most four requests: O(1))."""
    return any(request.kind is kind for request in state.requests)


def ask_user_called(state: RunState, limits: Limits) -> bool:
    """ask_user was called anywhere in this turn's tool calls."""
    return bool(state.requests) and _requested(state, ControlKind.ASK_USER)


def finish_task_called(state: RunState, limits: Limits) -> bool:
    """finish_task was called anywhere in this turn's tool calls."""
    return bool(state.requests) and _requested(state, ControlKind.FINISH_TASK)


def terminal_tool_succeeded(state: RunState, limits: Limits) -> bool:
    """A tool declared terminal ran successfully in this turn: its output ends the run."""
    return bool(state.requests) and _requested(state, ControlKind.TERMINAL_TOOL)


def output_retries_exhausted(state: RunState, limits: Limits) -> bool:
    """The final answer failed to validate more often than ``output_retries`` allows."""
    return state.output_failures > limits.output_retries


def approval_pending(state: RunState, limits: Limits) -> bool:
    """A tool call in this turn waits for a person's approval."""
    return bool(state.requests) and _requested(state, ControlKind.APPROVAL)


def sub_agent_paused(state: RunState, limits: Limits) -> bool:
    """A sub-agent called in this turn stopped to ask the user or for approvals."""
    return bool(state.requests) and _requested(state, ControlKind.SUB_AGENT)


def budget_exhausted(state: RunState, limits: Limits) -> bool:
    """Reported usage has reached the token budget."""
    return state.usage.total_tokens >= limits.token_budget


def time_is_up(state: RunState, limits: Limits) -> bool:
    """The run has used its wall-clock time (or its deadline timer fired)."""
    return state.timed_out or state.elapsed_s >= limits.timeout_s


def is_looping(state: RunState, limits: Limits) -> bool:
    """Loop detection found a repeat or a cycle."""
    return state.loop.detected is not None


def input_guardrail_tripped(state: RunState, limits: Limits) -> bool:
    """An input guardrail did not pass a user message the run took in."""
    trip = state.guardrail_trip
    return trip is not None and trip.kind == "input"


def output_guardrail_tripped(state: RunState, limits: Limits) -> bool:
    """An output guardrail did not pass the answer (or kept asking for rewrites)."""
    trip = state.guardrail_trip
    return trip is not None and trip.kind == "output"


def nudge_due(state: RunState, limits: Limits) -> bool:
    """The loop ladder's first rung is next: nudge the model."""
    return limits.loop_ladder and state.loop_rung == 0


def withhold_due(state: RunState, limits: Limits) -> bool:
    """The loop ladder's second rung is next: withhold the repeated tool."""
    return limits.loop_ladder and state.loop_rung == 1


def reflector_says_done(state: RunState, limits: Limits) -> bool:
    """The agent's optional reflector hook judged the task done."""
    return state.reflector_done


def last_answer_wanted(state: RunState, limits: Limits) -> bool:
    """A limit that ends the run should first let the model write a last answer; not once
    the money budget is spent (a last answer is a call like any other)."""
    return limits.last_answer and not cost_budget_spent(state, limits)


def last_answer_due(state: RunState, limits: Limits) -> bool:
    """The prompt was compacted for a last answer: write it now."""
    return state.closing is not None


# -- last answer rows: which stop the last answer was written for ----------------------------


def closing_on_token_budget(state: RunState, limits: Limits) -> bool:
    """The last answer was written because the token budget ran out."""
    return state.closing is CLOSING_GUARDS["closing_on_token_budget"]


def closing_on_max_turns(state: RunState, limits: Limits) -> bool:
    """The last answer was written because every turn was used."""
    return state.closing is CLOSING_GUARDS["closing_on_max_turns"]


def closing_on_timeout(state: RunState, limits: Limits) -> bool:
    """The last answer was written because the run's time was up."""
    return state.closing is CLOSING_GUARDS["closing_on_timeout"]


# -- resume rows: which stop the run is in, and what the resume answered ---------------------


def stopped_to_ask_user(state: RunState, limits: Limits) -> bool:
    """The run stopped on ask_user."""
    return state.stop_reason in STOP_GUARDS["stopped_to_ask_user"]


def stopped_for_approval(state: RunState, limits: Limits) -> bool:
    """The run stopped for a person to approve tool calls."""
    return state.stop_reason in STOP_GUARDS["stopped_for_approval"]


def stopped_for_sub_agent(state: RunState, limits: Limits) -> bool:
    """The run stopped because a sub-agent waits for the user (a reply or approvals)."""
    return state.stop_reason in STOP_GUARDS["stopped_for_sub_agent"]


def stopped_by_interruption(state: RunState, limits: Limits) -> bool:
    """The run was aborted or ran out of time; its transcript is valid and it can go on."""
    return state.stop_reason in STOP_GUARDS["stopped_by_interruption"]


def stopped_by_transient_model_failure(state: RunState, limits: Limits) -> bool:
    """The run stopped on model errors whose cause may pass (unreachable server, reset
    connection, timeout, 429, 5xx): retrying later can help, unlike a 400 or a 401."""
    failure = state.model_failure
    return (
        state.stop_reason in STOP_GUARDS["stopped_by_transient_model_failure"]
        and failure is not None
        and not failure.permanent
    )


def stopped_by_crash(state: RunState, limits: Limits) -> bool:
    """The run did not stop: its process died mid-step, and it was reopened from its last
    checkpoint in the middle of the loop."""
    return state.state not in TERMINAL_STATES


def reply_given(state: RunState, limits: Limits) -> bool:
    """A user message (the resume's reply) waits to be observed."""
    return bool(state.pending_input)


def sub_agent_answered(state: RunState, limits: Limits) -> bool:
    """The sub-agent the run waits for has its answer: the reply to its question, or a
    decision on every call it waits to have approved."""
    control = state.control
    if control is None or control.sub_agent is None:
        return False
    if control.sub_agent.asks is ControlKind.ASK_USER:
        return bool(state.child_reply)
    decided = {decision.call.id for decision in state.decisions}
    return bool(decided) and all(call.id in decided for call in control.pending_calls)


def approvals_decided(state: RunState, limits: Limits) -> bool:
    """Every call that waited for approval has a decision."""
    control = state.control
    if control is None or not state.decisions:
        return False
    decided = {decision.call.id for decision in state.decisions}
    return all(call.id in decided for call in control.pending_calls)


GUARDS: dict[str, Guard] = {
    guard.__name__: guard
    for guard in (
        abort_requested,
        prompt_exceeds_window,
        prompt_exceeds_budget,
        prompt_exceeds_cost_budget,
        cost_budget_spent,
        summary_requested,
        summary_written,
        output_rejected,
        model_call_failed,
        model_error_is_permanent,
        context_overflowed,
        too_many_errors,
        output_retries_exhausted,
        no_turns_left,
        no_retries_left,
        reply_was_filtered,
        reply_was_refused,
        reply_has_tool_calls,
        input_waiting,
        reply_was_truncated,
        ask_user_called,
        finish_task_called,
        terminal_tool_succeeded,
        approval_pending,
        sub_agent_paused,
        budget_exhausted,
        time_is_up,
        is_looping,
        nudge_due,
        withhold_due,
        reflector_says_done,
        input_guardrail_tripped,
        output_guardrail_tripped,
        last_answer_wanted,
        last_answer_due,
        closing_on_token_budget,
        closing_on_max_turns,
        closing_on_timeout,
        stopped_to_ask_user,
        stopped_for_approval,
        stopped_for_sub_agent,
        stopped_by_interruption,
        stopped_by_transient_model_failure,
        stopped_by_context_window,
        stopped_by_crash,
        reply_given,
        approvals_decided,
        sub_agent_answered,
    )
}
"""Every guard by name: the vocabulary the table may use."""
