"""Run invariants: what must hold for every run, whatever the model did.

``check_invariants`` is what agent_fsm's own property tests assert after every generated run,
and what users assert about their own agents. It returns nothing and raises
``InvariantViolation`` listing every rule that failed.

A resumed run is one run: its trace holds every activation, and ``RunResult.resumed_at`` says
where each resume began. ``state_problems`` (built on ``trace_problems`` and
``transcript_problems``) checks a run that has not ended yet, between two steps: the stateful
machine asks it after every transition.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from agent_fsm.events import Event, ModelRequested, ModelResponded
from agent_fsm.limits import Limits
from agent_fsm.loop.verify import TerminationBound
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolMessage,
    ToolStatus,
    Usage,
    UserMessage,
)
from agent_fsm.state import RunResult, RunState, RunStatus, TraceEntry, status_for
from agent_fsm.table import (
    CRASH_GUARD,
    INITIAL_STATE,
    LAST_CALL_STATE,
    STOP_GUARDS,
    TABLE,
    TERMINAL_STATES,
    AgentState,
    Row,
    StopReason,
    Trigger,
)

__all__ = [
    "InvariantViolation",
    "activations",
    "bound_problems",
    "check_invariants",
    "state_problems",
    "prompt_problems",
    "trace_problems",
    "transcript_problems",
]


class InvariantViolation(AssertionError):
    """One or more run invariants failed; the message lists them all."""


def transcript_problems(messages: Sequence[Message], *, open_turn: bool = False) -> list[str]:
    """Every way the transcript breaks "each tool call is answered exactly once, in order".

    Args:
        messages: the transcript.
        open_turn: the transcript of a run in ACT, between steps: its last message is the
            reply whose calls are about to run, so they are not owed yet (every call before
            it still is). The engine answers a turn's calls all at once, so a reply that is
            not last must be fully answered.
    """
    problems: list[str] = []
    if open_turn:
        last = messages[-1] if messages else None
        if not isinstance(last, AssistantMessage) or not last.tool_calls:
            problems.append("the run is about to act, but its last message is no tool call")
            return problems
        problems = transcript_problems(messages[:-1])
        ids = [c.id for c in last.tool_calls]
        if len(set(ids)) != len(ids) or "" in ids:
            problems.append(
                f"message {len(messages) - 1}: tool call ids are empty or repeated: {ids}"
            )
        return problems
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


def prompt_problems(
    prompts: Sequence[Sequence[Message]], transcript: Sequence[Message]
) -> list[str]:
    """Every way the prompts a run sent break the context rules: each prompt of an agent turn
    must be a valid transcript (no call separated from its result) that starts with the
    run's system prompt, if it has one, and holds the latest user input sent before it.

    Args:
        prompts: the messages of each model call, in order (``ModelRequest.messages``).
        transcript: the run's whole transcript (``RunResult.messages``); prompt messages are
            matched to it by identity, as the engine sends them (cleared stubs and summaries
            are the engine's own and match nothing).
    """
    problems: list[str] = []
    where = {id(message): index for index, message in enumerate(transcript)}
    system = transcript[0] if transcript and isinstance(transcript[0], SystemMessage) else None
    for number, prompt in enumerate(prompts, 1):
        indices = [where[id(m)] for m in prompt if id(m) in where]
        if not indices:
            continue  # a summary call: its own instructions and text
        for problem in transcript_problems(prompt):
            problems.append(f"prompt {number}: {problem}")
        if system is not None and (not prompt or prompt[0] is not system):
            problems.append(f"prompt {number}: the system prompt is not sent first")
        latest = next(
            (i for i in range(max(indices), -1, -1) if isinstance(transcript[i], UserMessage)),
            None,
        )
        if latest is not None and latest not in indices:
            problems.append(f"prompt {number}: the latest user input (message {latest}) is dropped")
    return problems


def trace_problems(
    trace: Sequence[TraceEntry],
    resumed_at: Sequence[int] = (),
    *,
    now: AgentState | str | None = None,
) -> list[str]:
    """Every way ``trace`` fails to be the path of one run, resumes included.

    A run's trace is one connected path from OBSERVE: each transition starts where the
    previous one ended, across resumes too, because a resume is itself a transition (a
    ``resumed`` row out of DONE or ERROR after a stop; after a crash, one that restarts the
    state of the last checkpoint). Only a resume row may leave DONE or ERROR, and only
    where the run was reopened (``resumed_at``). Turn counts never go back.

    Args:
        trace: the transitions taken, oldest first.
        resumed_at: where each reopening began (``RunResult.resumed_at``), in order; a position
            may repeat (a run reopened again before it took a step) and may equal
            ``len(trace)`` for a run reopened but not yet stepped.
        now: the state the run is in; when given, the trace must lead there.
    """
    positions = list(resumed_at)
    if positions != sorted(positions) or any(not 0 <= p <= len(trace) for p in positions):
        return [f"resume positions {positions} are not in order within the trace"]
    problems: list[str] = []
    reopened = set(positions)
    where: AgentState | str = INITIAL_STATE  # where the next transition must start
    for index, entry in enumerate(trace):
        problems += _step_problems(trace, index, where, reopened)
        where = entry.dest
    if now is not None and where != now:
        problems.append(f"the trace ends in {where}, not {now}")
    return problems


def _step_problems(
    trace: Sequence[TraceEntry], index: int, where: AgentState | str, reopened: set[int]
) -> list[str]:
    """What is wrong with transition ``index`` of a path that has reached ``where``."""
    entry = trace[index]
    problems: list[str] = []
    if entry.source != where:
        if index == 0:
            problems.append(f"the trace starts in {entry.source}, not {INITIAL_STATE}")
        else:
            problems.append(f"trace jumps from {where} to {entry.source} at {index}")
    resumes = entry.trigger is Trigger.RESUMED
    if where in TERMINAL_STATES and not resumes:
        problems.append(f"the trace continues after {where} ({trace[index - 1].label}) at {index}")
    if resumes and index not in reopened:
        problems.append(f"transition {index} resumes the run, which was not reopened there")
    restarts = resumes and CRASH_GUARD in entry.guards
    if restarts and entry.dest != entry.source:
        problems.append(f"transition {index} restarts {entry.source} in another state")
    if resumes and index and not restarts:
        stop = trace[index - 1].label
        accepted = {r.value for g in entry.guards for r in STOP_GUARDS.get(g, ())}
        if stop not in accepted:
            problems.append(
                f"transition {index} resumes the run after {where} ({stop}), which its row "
                "does not resume"
            )
    if index and entry.turn < trace[index - 1].turn:
        problems.append(
            f"transition {index}: the turn count goes back from "
            f"{trace[index - 1].turn} to {entry.turn}"
        )
    return problems


def activations(trace: Sequence[TraceEntry]) -> list[int]:
    """How many transitions each activation took: the trace split before each resume row
    (after a stop, or restarting the step a crash interrupted)."""
    cuts = [i for i, entry in enumerate(trace) if i and entry.trigger is Trigger.RESUMED]
    edges = [0, *cuts, len(trace)]
    return [b - a for a, b in itertools.pairwise(edges) if b > a]


def bound_problems(trace: Sequence[TraceEntry], bound: TerminationBound) -> list[str]:
    """The transitions of each activation, and of the whole run, against the bound: the first
    activation within ``bound.transitions``, each resumed one within what a resume may add,
    and the run within ``bound.with_resumes(resumes)``."""
    sizes = activations(trace)
    problems: list[str] = []
    for number, taken in enumerate(sizes, 1):
        limit = bound.transitions if number == 1 else bound.with_resumes(1)
        if taken > limit:
            which = f" in activation {number}" if len(sizes) > 1 else ""
            problems.append(f"{taken} transitions{which} exceed the bound {limit}")
    resumes = len(sizes) - 1
    if resumes and len(trace) > bound.with_resumes(resumes):
        problems.append(
            f"{len(trace)} transitions exceed the bound {bound.with_resumes(resumes)} of a run "
            f"resumed {resumes} times"
        )
    return problems


def state_problems(
    state: RunState,
    rows: Sequence[Row],
    *,
    limits: Limits,
    bound: TerminationBound | None = None,
) -> list[str]:
    """Every way a run breaks the invariants it keeps between two steps, ended or not.

    Turns stay within ``max_turns`` and retries within ``model_retries_per_run`` (all
    activations together); the trace is a path
    to where the run is (``trace_problems``) whose last turn count is the run's, and no
    activation exceeds the bound; every tool call is answered exactly once, in order, except
    those of a reply the run is about to act on.

    Args:
        state: the run's state (``Run.state``, or a checkpoint), read between steps.
        rows: the machine table the run follows (``agent.machine.rows``): the trace holds
            row numbers.
        limits: the limits it runs under.
        bound: the agent's ``bound``, to check each activation's transitions against.
    """
    problems = _count_problems(state.turns, state.retries, limits)
    trace = [TraceEntry.from_row(rows[row], turn) for row, turn in state.trace]
    problems += trace_problems(trace, state.resumed_at, now=state.state)
    if trace and trace[-1].turn != state.turns:
        problems.append(f"the trace's last turn count {trace[-1].turn} is not {state.turns}")
    if bound is not None:
        problems += bound_problems(trace, bound)
    # In ACT between steps, the reply's calls have not run yet (unless the run resumed to
    # carry out approved calls: those were answered when it paused).
    open_turn = state.state is AgentState.ACT and not state.decisions
    problems += transcript_problems(state.messages, open_turn=open_turn)
    return problems


def _control_problem(result: RunResult, rows: Sequence[Row]) -> str | None:
    """If the last turn's control-flow tool ran, the run must have stopped for it, or for a
    REFLECT row the table tries before that tool's (an abort, or a limit a table of your own
    ranks higher)."""
    trace: Sequence[TraceEntry] = result.trace
    messages = result.messages
    if trace and trace[-1].source is LAST_CALL_STATE and len(trace) > 1:
        trace = trace[:-1]  # the limit that asked for the last answer was taken after REFLECT
        if result.output is not None:  # the last answer and the message asking for it
            messages = messages[:-2]
    if not trace or trace[-1].source is not AgentState.REFLECT:
        return None
    last = next(
        (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AssistantMessage)),
        None,
    )
    if last is None:
        return None
    results = [
        m for m in messages[last + 1 :] if isinstance(m, ToolMessage) and m.status is ToolStatus.OK
    ]
    answered = {m.name for m in results}
    expected = None
    if "ask_user" in answered:
        expected = StopReason.ASK_USER
    elif "finish_task" in answered:
        expected = StopReason.FINISH_TASK
    elif any(_ends_run(m) for m in results):
        expected = StopReason.TERMINAL_TOOL
    if expected is None or result.stop_reason in (expected, StopReason.ABORTED):
        return None
    if result.stop_reason in _ranked_before(rows, expected):
        return None
    return f"{expected.value} was called but the run stopped with {result.stop_reason.value}"


def _ranked_before(rows: Sequence[Row], stop: StopReason) -> set[StopReason]:
    """The stops of the REFLECT rows the table tries before the first that ends with
    ``stop``."""
    earlier: set[StopReason] = set()
    for row in rows:
        if row.trigger is not Trigger.REFLECTED:
            continue
        if row.stop_reason is stop:
            break
        if row.stop_reason is not None:
            earlier.add(row.stop_reason)
    return earlier


def _ends_run(result: ToolMessage) -> bool:
    """The result of a terminal tool's call that ended the run (the runtime marks it)."""
    details = result.details
    runtime = details.get("runtime") if isinstance(details, dict) else None
    return isinstance(runtime, dict) and runtime.get("ends_run") is True


def check_invariants(
    result: RunResult,
    *,
    limits: Limits,
    bound: TerminationBound | None = None,
    events: Sequence[Event] | None = None,
    rows: Sequence[Row] | None = None,
) -> None:
    """Assert every run invariant; raise InvariantViolation naming each one broken.

    The rules: the run ended in DONE or ERROR, its status agrees with its final state and
    stop reason (and a failed run, and only a failed run, carries an error); model calls stay
    within ``max_turns`` (and the bound) and transitions within the bound; the trace is one
    connected path from OBSERVE, ends where the run ended with the stop reason's row, and its
    turn counts never go back; every tool call is answered exactly once, in order; a
    control-flow tool whose call the last turn answered as made (ask_user, finish_task, a
    terminal tool) stopped the run with its stop, or an abort; at most one last answer per
    activation, and only under
    ``Limits.last_answer``; with ``events``, usage is the sum of the replies' usage, no model
    call but a last answer started once the token budget was spent, so it is overshot by at
    most the call in flight (and the last answer),
    and every prompt sent (by the calibrated estimate ``ModelRequested`` reports) left
    ``reply_tokens`` of the context window free.

    A resumed run is checked as one run: ``max_turns``, the token budget and the model-call
    bound hold for all its activations together, as the engine counts them (turns and usage
    carry over a resume; only the time limit restarts). Its trace leaves a stop only by a
    resume row, where it was reopened (see ``trace_problems``), and each activation stays
    within what the bound allows it (``bound_problems``).

    Args:
        result: the finished run.
        limits: the limits it ran under.
        bound: the agent's ``bound``; the transition count is checked against it when given.
        events: the run's events (of every activation, for a resumed run); when given,
            usage is checked to add up call by call and the token budget to be overshot by
            at most the last call.
        rows: the agent's table (``agent.machine.rows``), which says which stops wait for a
            person; the default table when not given.
    """
    problems = _outcome_problems(result, limits, bound, rows)
    problems += _trace_problems_of(result, bound)
    problems += transcript_problems(result.messages)
    control = _control_problem(result, TABLE if rows is None else rows)
    if control:
        problems.append(control)
    if events is not None:
        problems += _usage_problems(result, limits, events)
    if problems:
        raise InvariantViolation(
            f"run {result.run_id} ({result.stop_reason.value}) broke {len(problems)} "
            "invariant(s):\n- " + "\n- ".join(problems)
        )


def _count_problems(turns: int, retries: int, limits: Limits) -> list[str]:
    problems = []
    if turns > limits.max_turns:
        problems.append(f"{turns} turns exceed max_turns={limits.max_turns}")
    if retries > limits.model_retries_per_run:
        problems.append(
            f"{retries} model retries exceed model_retries_per_run={limits.model_retries_per_run}"
        )
    return problems


def _outcome_problems(
    result: RunResult, limits: Limits, bound: TerminationBound | None, rows: Sequence[Row] | None
) -> list[str]:
    """Final state, status, error and model-call counts."""
    problems: list[str] = []
    if result.final_state not in TERMINAL_STATES:
        problems.append(f"final state {result.final_state} is not terminal")
    table = tuple(rows) if rows is not None else TABLE
    if result.status is not status_for(result.final_state, result.stop_reason, table):
        problems.append(
            f"status {result.status} disagrees with {result.final_state}/{result.stop_reason}"
        )
    problems += _count_problems(result.turns, result.retries, limits)
    calls = result.turns + result.retries + result.last_answers
    if result.usage.requests > calls:
        problems.append(
            f"usage counts {result.usage.requests} replies but only {calls} model calls"
        )
    resumes = len(activations(result.trace)) - 1
    if result.last_answers > resumes + 1:
        problems.append(
            f"{result.last_answers} last answers in {resumes + 1} activation(s): at most one each"
        )
    if result.last_answers and not limits.last_answer:
        problems.append(f"{result.last_answers} last answer(s) without Limits.last_answer")
    if bound is not None and calls > bound.calls_with_resumes(resumes):
        problems.append(f"{calls} model calls exceed the bound {bound.calls_with_resumes(resumes)}")
    if result.status is RunStatus.FAILED and not result.error:
        problems.append("the run failed but carries no error")
    if result.status is not RunStatus.FAILED and result.error:
        problems.append(f"the run did not fail but carries the error {result.error!r}")
    return problems


def _trace_problems_of(result: RunResult, bound: TerminationBound | None) -> list[str]:
    """The trace: a connected path within the bound, ending with the stop reason's row."""
    trace = result.trace
    if not trace:
        return ["the trace is empty"]
    problems = bound_problems(trace, bound) if bound is not None else []
    problems += trace_problems(trace, result.resumed_at, now=result.final_state)
    if result.resumed_at and result.resumed_at[-1] >= len(trace):
        problems.append(
            f"the run was resumed at transition {result.resumed_at[-1]} but its trace ends there"
        )
    last = trace[-1]
    if last.dest in TERMINAL_STATES and last.label != result.stop_reason.value:
        problems.append(
            f"the last transition is {str(last.label)!r} but the stop reason is "
            f"{result.stop_reason.value!r}"
        )
    if last.turn != result.turns:
        problems.append(f"the trace's last turn count {last.turn} is not the run's {result.turns}")
    return problems


def _usage_problems(result: RunResult, limits: Limits, events: Sequence[Event]) -> list[str]:
    """Usage adds up call by call, and no call started with the budget already spent."""
    problems: list[str] = []
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
    # A last answer may start with the budget spent (that is what it is for); no other call.
    responded = [e for e in events if isinstance(e, ModelResponded)]
    last = max((i for i, e in enumerate(responded) if not e.last_answer), default=None)
    if last is not None:
        before = sum((e.usage for e in responded[:last]), Usage())
        if before.total_tokens >= limits.token_budget:
            problems.append(
                f"a model call started with the budget of {limits.token_budget} already spent"
            )
    problems += _cost_problems(result, limits, responded)
    window = limits.context_window
    if window is not None:
        for event in events:
            if (
                isinstance(event, ModelRequested)
                and event.run_id == result.run_id  # a sub-agent's model has its own window
                and event.estimated_prompt_tokens + limits.reply_tokens > window
            ):
                problems.append(
                    f"turn {event.turn}'s prompt of ~{event.estimated_prompt_tokens} tokens "
                    f"left less than reply_tokens={limits.reply_tokens} of the context "
                    f"window {window}"
                )
    return problems


def _cost_problems(
    result: RunResult, limits: Limits, responded: Sequence[ModelResponded]
) -> list[str]:
    """The run's cost is the sum of its calls' (``Limits.prices``), and no call started
    with the money budget spent (a last answer neither: a run out of money makes no more
    calls), so it is overshot by at most the call in flight."""
    own = [e.cost for e in responded if e.run_id == result.run_id]
    if result.cost is None:  # an unpriced run counts no sub-agent's cost either
        return (
            []
            if all(cost is None for cost in own)
            else ["calls were priced but the run reports no cost"]
        )
    costs = [e.cost for e in responded]
    if any(cost is None for cost in costs):
        return [f"the run reports a cost of {result.cost} but some calls were not priced"]
    problems: list[str] = []
    total = sum(cost for cost in costs if cost is not None)
    if abs(total - result.cost) > 1e-9 * max(1.0, abs(total)):
        problems.append(f"cost {result.cost} is not the sum of the calls' costs {total}")
    budget = limits.cost_budget
    if budget is not None:
        spent = 0.0
        for event in responded:
            if spent >= budget:
                problems.append(
                    f"a model call (turn {event.turn}) started with the cost budget of "
                    f"{budget:g} already spent ({spent:.6g})"
                )
                break
            spent += event.cost or 0.0
    return problems
