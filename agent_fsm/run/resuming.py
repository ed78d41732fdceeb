"""Reopening a checkpointed run: check that the answer fits the way it stopped, and hand the
machine a run its resume rows can take back into the loop.

Which stops can be resumed, and into which state, is the table's to say: its ``resumed`` rows
(``table.py``) leave DONE after ask_user (to OBSERVE, where the reply is observed) and after
approvals (to ACT, which carries the decisions out), and ERROR after an abort, a timeout or a
transient model failure (to OBSERVE). ``reopen`` reads the rows to know what answer a stop
takes, puts the answer in the run state, asks the machine which row would fire, and leaves
taking it to the run's first step (``Run.step``), so the resume is a transition like any
other: traced, drawn, verified and checkpointed.

A run that was interrupted without ending (its process died) continues from its last
checkpoint through the row that restarts the step it was in (guard ``stopped_by_crash``, verb
``restart``), and the tool journal keeps any side effect from happening twice. A state
without such a row cannot be recovered: that is a ``ResumeError`` too.

Anything else (a finished run, a reply to an approval, a decision for an unknown call, a
permanent model error) is a ``ResumeError`` saying what the run is waiting for, and the state
is left untouched.
"""

from __future__ import annotations

from agent_fsm.errors import ConfigError, ResumeError
from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine
from agent_fsm.messages import UserInput, UserMessage, clean_text, user_input
from agent_fsm.run.approvals import Decisions, decide
from agent_fsm.run.residence import finished
from agent_fsm.state import (
    Approval,
    ControlKind,
    ControlRequest,
    Decision,
    RunState,
    reopen_fields,
)
from agent_fsm.table import CRASH_GUARD, STOP_GUARDS, TERMINAL_STATES, Row, StopReason, Verb
from agent_fsm.tools.tool import ToolRegistry

__all__ = ["Decisions", "finished", "reopen"]

_ANSWERED = {
    Verb.ANSWER: "reply",
    Verb.CARRY_OUT: "approvals",
    Verb.RESUME: "interrupted",
    Verb.RECOVER: "recovered",
    Verb.RESTART: "crashed",
}
"""What ``RunResumed.answered`` says for each resume row's verb."""


def reopen(
    state: RunState,
    machine: AgentMachine,
    limits: Limits,
    reply: UserInput | None = None,
    approvals: Decisions | None = None,
    pause: str | None = None,
    *,
    tools: ToolRegistry | None = None,
) -> str:
    """Make ``state`` ready to continue; return what was answered ("reply", "approvals",
    "interrupted", "recovered" or "crashed").

    Args:
        tools: the agent's tools, which arguments a person edited in an approval
            (``Approval.arguments``) are checked against.
        pause: the pause the answer is for (``RunResult.pending.pause``): refused when the
            run has moved on to another (a late answer must not answer a pause nobody saw);
            required with a decision on every pending call at once (``approvals=True``),
            which names no call.

    Raises:
        ResumeError: when the run cannot continue, or not with this answer, or was made with
            another table, or the answer is for another pause. ``state`` is then unchanged.
    """
    answer = None if reply is None else _reply_of(reply)
    if not machine.knows(state):
        raise ResumeError(
            f"run {state.run_id} (in state {state.state}) was not made with this agent's "
            "table: resume it with an agent whose table has its states and rows"
        )
    if state.state not in TERMINAL_STATES:
        if answer is not None or approvals is not None or pause is not None:
            raise ResumeError(
                f"run {state.run_id} was interrupted in {state.state}, not paused: resume it "
                "without a reply or approvals"
            )
        if machine.resume_row(state, limits) is None:
            raise ResumeError(
                f"run {state.run_id} was interrupted in {state.state}, and no row of its "
                f"table restarts that state after a crash ({CRASH_GUARD})"
            )
        answered = "crashed"
    else:
        answered = _answer_stop(state, machine, limits, answer, approvals, pause, tools)
    reopen_fields(state, stopped=False)
    state.resumed_at.append(len(state.trace))
    return answered


def _reply_of(reply: object) -> str | UserMessage:
    """The reply as the transcript keeps it: a text, or a message with images and files
    (``messages.user_input``).

    Raises:
        ResumeError: anything else, saying what a reply may be.
    """
    try:
        return user_input(reply)
    except ConfigError as exc:
        raise ResumeError(f"reply: {exc}") from None


def _said_nothing(reply: str | UserMessage | None) -> bool:
    """No reply, or one with no text and no parts."""
    if isinstance(reply, UserMessage):
        return not reply.content and not reply.parts
    return not reply


def _check_pause(state: RunState, approvals: Decisions | None, pause: str | None) -> None:
    """Refuse an answer for another pause than the one the run waits at, and a blanket
    decision that names no pause at all.

    Raises:
        ResumeError: saying which pause the run waits at, if any.
    """
    control = state.control
    waits_at = control.pause if control is not None else ""
    if pause is not None and pause != waits_at:
        now = f"waits at {waits_at}" if waits_at else "waits at no pause"
        raise ResumeError(
            f"run {state.run_id}: this answer is for {pause}, but the run {now}: it went on "
            "after the pause answered (a late or repeated answer); look at it again"
        )
    blanket = isinstance(approvals, bool | Approval)
    approving = control is not None and _asks_approvals(control)
    if blanket and approving and pause is None and waits_at:
        raise ResumeError(
            f"run {state.run_id}: a decision on every pending call at once must name the pause "
            f"it answers: pass pause={waits_at!r} (RunResult.pending.pause, RunPaused.pause), "
            "or decide each call by its id"
        )


def _asks_approvals(control: ControlRequest) -> bool:
    """The run waits for approvals: its own calls', or a sub-agent's."""
    return control.waits_for is ControlKind.APPROVAL


def _answer_stop(
    state: RunState,
    machine: AgentMachine,
    limits: Limits,
    reply: str | UserMessage | None,
    approvals: Decisions | None,
    pause: str | None,
    tools: ToolRegistry | None = None,
) -> str:
    """Put the answer into a stopped run and find the resume row that will take it; undo and
    raise when none will."""
    if state.stop_reason is None and state.trace:  # a checkpoint from before 0.2 kept no reason
        state.stop_reason = machine.rows[state.trace[-1][0]].stop_reason
    stop = state.stop_reason
    candidates = _rows_leaving(machine.rows, state, stop)
    if not candidates:
        raise finished(state.run_id, stop.value if stop else str(state.state))
    _check_pause(state, approvals, pause)
    decisions = _check_answer(state, candidates, reply, approvals, tools)
    for_child = stop is StopReason.SUB_AGENT_PAUSED
    if reply is not None:
        if for_child:  # passed down to the sub-agent that asked, by ACT
            if not isinstance(reply, str):
                raise ResumeError(
                    f"run {state.run_id}: its sub-agent asked the user a question, which "
                    "takes a text reply (images and files go in the input of a run)"
                )
            state.child_reply = clean_text(reply)
        else:
            state.pending_input.append(reply)
    state.decisions = decisions
    row = machine.resume_row(state, limits)
    if row is None:
        if reply is not None:
            if for_child:
                state.child_reply = None
            else:
                state.pending_input.pop()
        state.decisions = []
        failure = state.model_failure
        detail = f": {failure.message}" if failure is not None and failure.permanent else ""
        raise ResumeError(
            f"run {state.run_id} stopped with {stop.value if stop else str(state.state)}"
            f"{detail}, and no resume row accepts it (a permanent model error cannot be "
            "resumed)"
        )
    assert isinstance(row.outcome, Verb)
    return _ANSWERED.get(row.outcome, row.outcome.value)


def _rows_leaving(rows: tuple[Row, ...], state: RunState, stop: StopReason | None) -> list[Row]:
    """The resume rows whose stop guard accepts the run's stop."""
    return [
        row
        for row in rows
        if row.resumes
        and row.source == state.state
        and any(stop in STOP_GUARDS.get(guard, ()) for guard in row.guards)
    ]


def _check_answer(
    state: RunState,
    candidates: list[Row],
    reply: str | UserMessage | None,
    approvals: Decisions | None,
    tools: ToolRegistry | None = None,
) -> list[Decision]:
    """Check the answer against what the stop's rows need: a reply (``reply_given``), approval
    decisions (``approvals_decided``), or neither (an optional reply); return the decisions."""
    run_id = state.run_id
    needs = {guard for row in candidates for guard in row.guards}
    control = state.control
    if "sub_agent_answered" in needs and control is not None and control.sub_agent is not None:
        return _check_child_answer(run_id, control, reply, approvals, tools)
    if "approvals_decided" in needs:
        if reply is not None:
            raise ResumeError(f"run {run_id} waits for approvals, not a reply: pass approvals=...")
        assert control is not None  # an approval stop always records its request
        return decide(run_id, control, approvals, tools)
    if "reply_given" in needs:
        question = control.text if control else ""
        if approvals is not None:
            raise ResumeError(
                f"run {run_id} asked the user {question!r}: answer with reply=..., not approvals"
            )
        if _said_nothing(reply):
            raise ResumeError(
                f"run {run_id} asked the user {question!r}: pass the answer as reply=..."
            )
        return []
    if approvals is not None:
        stop = state.stop_reason.value if state.stop_reason else str(state.state)
        raise ResumeError(f"run {run_id} ended {stop}; it has nothing to approve")
    return []


def _check_child_answer(
    run_id: str,
    control: ControlRequest,
    reply: str | UserMessage | None,
    approvals: Decisions | None,
    tools: ToolRegistry | None,
) -> list[Decision]:
    """Check the answer for the sub-agent a run waits for: a reply to its question, or a
    decision per call it waits to have approved (edited arguments checked against the
    sub-agent's tools, when it is one of ``tools``); return the decisions."""
    child = control.sub_agent
    assert child is not None
    if child.asks is ControlKind.APPROVAL:
        if reply is not None:
            raise ResumeError(
                f"run {run_id}: its sub-agent {child.tool} waits for approvals, not a reply: "
                "pass approvals=..."
            )
        owner = _tools_of_owner(tools, (child.tool, *child.below))
        return decide(run_id, control, approvals, owner)
    if approvals is not None:
        raise ResumeError(
            f"run {run_id}: its sub-agent {child.tool} asked the user {control.text!r}: "
            "answer with reply=..., not approvals"
        )
    if _said_nothing(reply):
        raise ResumeError(
            f"run {run_id}: its sub-agent {child.tool} asked the user {control.text!r}: pass "
            "the answer as reply=..."
        )
    return []


def _tools_of_owner(tools: ToolRegistry | None, path: tuple[str, ...]) -> ToolRegistry | None:
    """The tools of the agent that owns the calls a sub-agent's pause shows, however deep:
    each name of ``path`` is a sub-agent tool of the level above (``run.delegation`` marks
    its function with its ``delegate``), walked down from ``tools``; edited arguments are
    checked against them. None when a name is no sub-agent tool of its level."""
    for name in path:
        found = tools.get(name) if tools is not None else None
        agent = getattr(getattr(found.fn, "delegate", None), "agent", None) if found else None
        registry = getattr(getattr(agent, "run_config", None), "tools", None)
        tools = registry if isinstance(registry, ToolRegistry) else None
    return tools
