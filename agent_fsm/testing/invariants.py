"""Run invariants: what must hold for every run, whatever the model did.

``check_invariants`` is what agent_fsm's own property tests assert after every generated run,
and what users assert about their own agents. It returns nothing and raises
``InvariantViolation`` listing every rule that failed.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from agent_fsm.events import Event, ModelResponded
from agent_fsm.limits import Limits
from agent_fsm.messages import AssistantMessage, Message, ToolMessage, ToolStatus, Usage
from agent_fsm.state import RunResult, RunStatus, status_for
from agent_fsm.table import INITIAL_STATE, TERMINAL_STATES, AgentState, StopReason
from agent_fsm.verify import TerminationBound

__all__ = ["InvariantViolation", "check_invariants", "transcript_problems"]


class InvariantViolation(AssertionError):
    """One or more run invariants failed; the message lists them all."""


def transcript_problems(messages: Sequence[Message]) -> list[str]:
    """Every way the transcript breaks "each tool call is answered exactly once, in order"."""
    problems: list[str] = []
    expected: list[tuple[str, str]] = []  # (call id, name) still owed, in order
    for index, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            if not expected:
                problems.append(
                    f"message {index}: tool result {message.tool_call_id!r} answers no call"
                )
                continue
            call_id, name = expected.pop(0)
            if (message.tool_call_id, message.name) != (call_id, name):
                problems.append(
                    f"message {index}: result for {message.tool_call_id!r} ({message.name}) "
                    f"but call {call_id!r} ({name}) was due"
                )
            continue
        if expected:
            problems.append(f"message {index}: calls {[c for c, _ in expected]} left unanswered")
            expected = []
        if isinstance(message, AssistantMessage):
            ids = [c.id for c in message.tool_calls]
            if len(set(ids)) != len(ids) or "" in ids:
                problems.append(f"message {index}: tool call ids are empty or repeated: {ids}")
            expected = [(c.id, c.name) for c in message.tool_calls]
    if expected:
        problems.append(f"end of transcript: calls {[c for c, _ in expected]} left unanswered")
    return problems


def _control_problem(result: RunResult) -> str | None:
    """If the last turn's control-flow tool ran, the run must have stopped for it."""
    if not result.trace or result.trace[-1].source is not AgentState.REFLECT:
        return None
    messages = result.messages
    last = next(
        (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AssistantMessage)),
        None,
    )
    if last is None:
        return None
    answered = {
        m.name
        for m in messages[last + 1 :]
        if isinstance(m, ToolMessage) and m.status is ToolStatus.OK
    }
    expected = None
    if "ask_user" in answered:
        expected = StopReason.ASK_USER
    elif "finish_task" in answered:
        expected = StopReason.FINISH_TASK
    if expected is not None and result.stop_reason not in (expected, StopReason.ABORTED):
        return f"{expected.value} was called but the run stopped with {result.stop_reason.value}"
    return None


def check_invariants(
    result: RunResult,
    *,
    limits: Limits,
    bound: TerminationBound | None = None,
    events: Sequence[Event] | None = None,
) -> None:
    """Assert every run invariant; raise InvariantViolation naming each one broken.

    The rules: the run ended in DONE or ERROR, its status agrees with its final state and
    stop reason (and a failed run, and only a failed run, carries an error); model calls stay
    within ``max_turns`` (and the bound) and transitions within the bound; the trace is one
    connected path from OBSERVE, ends where the run ended with the stop reason's row, and its
    turn counts never go back; every tool call is answered exactly once, in order; a
    control-flow tool that ran in the last turn stopped the run (ask_user before
    finish_task); with ``events``, usage is the sum of the replies' usage and no model call
    started once the token budget was spent, so it is overshot by at most the call in flight.

    Args:
        result: the finished run.
        limits: the limits it ran under.
        bound: the agent's ``bound``; the transition count is checked against it when given.
        events: the run's events; when given, usage is checked to add up call by call and
            the token budget to be overshot by at most the last call.
    """
    problems: list[str] = []
    if result.final_state not in TERMINAL_STATES:
        problems.append(f"final state {result.final_state} is not terminal")
    if result.status is not status_for(result.final_state, result.stop_reason):
        problems.append(
            f"status {result.status} disagrees with {result.final_state}/{result.stop_reason}"
        )
    if result.turns > limits.max_turns:
        problems.append(f"{result.turns} model calls exceed max_turns={limits.max_turns}")
    if bound is not None and len(result.trace) > bound.transitions:
        problems.append(f"{len(result.trace)} transitions exceed the bound {bound.transitions}")
    trace = result.trace
    if not trace:
        problems.append("the trace is empty")
    else:
        if trace[0].source is not INITIAL_STATE:
            problems.append(f"the trace starts in {trace[0].source}, not {INITIAL_STATE}")
        for before, after in itertools.pairwise(trace):
            if before.dest is not after.source:
                problems.append(f"trace jumps from {before.dest} to {after.source}")
        if trace[-1].dest is not result.final_state:
            problems.append(f"the trace ends in {trace[-1].dest}, not {result.final_state}")
        if any(entry.dest in TERMINAL_STATES for entry in trace[:-1]):
            problems.append("the trace continues after a terminal state")
    if result.usage.requests > result.turns:
        problems.append(
            f"usage counts {result.usage.requests} replies but only {result.turns} model calls"
        )
    if bound is not None and result.turns > bound.model_calls:
        problems.append(f"{result.turns} model calls exceed the bound {bound.model_calls}")
    if result.status is RunStatus.FAILED and not result.error:
        problems.append("the run failed but carries no error")
    if result.status is not RunStatus.FAILED and result.error:
        problems.append(f"the run did not fail but carries the error {result.error!r}")
    if trace:
        last = trace[-1]
        if last.dest in TERMINAL_STATES and last.label != result.stop_reason.value:
            problems.append(
                f"the last transition is {str(last.label)!r} but the stop reason is "
                f"{result.stop_reason.value!r}"
            )
        turns = [entry.turn for entry in trace]
        if any(b < a for a, b in itertools.pairwise(turns)) or turns[-1] != result.turns:
            problems.append(f"the trace's turn counts {turns} do not rise to {result.turns}")
    problems.extend(transcript_problems(result.messages))
    control = _control_problem(result)
    if control:
        problems.append(control)
    if events is not None:
        calls = [e.usage for e in events if isinstance(e, ModelResponded)]
        total = sum(calls, Usage())
        if (total.input_tokens, total.output_tokens, total.requests) != (
            result.usage.input_tokens,
            result.usage.output_tokens,
            result.usage.requests,
        ):
            problems.append(f"usage {result.usage} is not the sum of the calls' usage {total}")
        if len(calls) != result.usage.requests:
            problems.append(
                f"{len(calls)} replies were received but usage counts {result.usage.requests}"
            )
        if calls and total.total_tokens - calls[-1].total_tokens >= limits.token_budget:
            problems.append(
                f"a model call started with the budget of {limits.token_budget} already spent"
            )
    if problems:
        raise InvariantViolation(
            f"run {result.run_id} ({result.stop_reason.value}) broke {len(problems)} "
            "invariant(s):\n- " + "\n- ".join(problems)
        )
