"""Reopening a checkpointed run: check that the answer fits the way it stopped, then put the
run back into the state it continues from.

A run can continue when it

- paused on ``ask_user``: the ``reply`` becomes the next user message (OBSERVE);
- paused on approvals: every pending call gets a decision, and the run continues in ACT,
  which runs the allowed calls and tells the model the outcome of each;
- was aborted or timed out: it continues in OBSERVE (with ``reply`` as a new user message,
  if one is given), and its transcript is already valid because every cancelled call was
  answered;
- was interrupted without ending (the process died): it continues from its last checkpoint,
  and the tool journal keeps any side effect from happening twice.

Anything else (a finished run, a reply to an approval, a decision for an unknown call) is a
``ResumeError`` saying what the run is waiting for, and the state is left untouched.
"""

from __future__ import annotations

from collections.abc import Mapping

from agent_fsm.errors import ResumeError
from agent_fsm.state import Approval, RunState
from agent_fsm.table import TERMINAL_STATES, AgentState, Row, StopReason

__all__ = ["Decisions", "reopen"]

Decisions = Mapping[str, bool | Approval] | bool | Approval
"""Approval decisions: per call id, or one decision for every pending call."""

_INTERRUPTED = frozenset({StopReason.ABORTED, StopReason.TIMEOUT})


def _decisions(run_id: str, state: RunState, approvals: Decisions | None) -> dict[str, Approval]:
    assert state.control is not None
    pending = [call.id for call in state.control.pending_calls]
    listing = ", ".join(
        f"{call.id} ({call.name} {call.arguments})" for call in state.control.pending_calls
    )
    if approvals is None:
        raise ResumeError(
            f"run {run_id} waits for approval of {listing}: pass approvals={{call_id: True | "
            "False | Approval(allow=..., reason=...)}} (or one decision for all)"
        )
    if isinstance(approvals, bool | Approval):
        approvals = dict.fromkeys(pending, approvals)
    if not isinstance(approvals, Mapping):
        raise ResumeError(
            f"approvals must map call ids to decisions, got {type(approvals).__name__}"
        )
    unknown = sorted(set(approvals) - set(pending))
    missing = [call_id for call_id in pending if call_id not in approvals]
    if unknown or missing:
        problems = []
        if missing:
            problems.append(f"no decision for {missing}")
        if unknown:
            problems.append(f"{unknown} are not pending")
        raise ResumeError(f"run {run_id}: {'; '.join(problems)} (pending: {listing})")
    decided: dict[str, Approval] = {}
    for call_id in pending:
        decision = approvals[call_id]
        if isinstance(decision, bool):
            decision = Approval(allow=decision)
        elif not isinstance(decision, Approval):
            raise ResumeError(
                f"the decision for {call_id} must be True, False or an Approval, "
                f"got {type(decision).__name__}"
            )
        decided[call_id] = decision
    return decided


def reopen(
    state: RunState,
    rows: tuple[Row, ...],
    reply: str | None = None,
    approvals: Decisions | None = None,
) -> str:
    """Make ``state`` continue; return what was answered ("reply", "approvals",
    "interrupted" or "crashed").

    Raises:
        ResumeError: when the run cannot continue, or not with this answer. ``state`` is then
            unchanged.
    """
    run_id = state.run_id
    if reply is not None and not isinstance(reply, str):
        raise ResumeError(f"reply must be a str, got {type(reply).__name__}")
    if state.state not in TERMINAL_STATES:
        if reply is not None or approvals is not None:
            raise ResumeError(
                f"run {run_id} was interrupted in {state.state}, not paused: resume it "
                "without a reply or approvals"
            )
        answered = "crashed"
    else:
        stop_reason = rows[state.trace[-1][0]].stop_reason if state.trace else None
        if stop_reason is StopReason.ASK_USER:
            question = state.control.text if state.control else ""
            if approvals is not None:
                raise ResumeError(
                    f"run {run_id} asked the user {question!r}: answer with reply=..., "
                    "not approvals"
                )
            if not reply:
                raise ResumeError(
                    f"run {run_id} asked the user {question!r}: pass the answer as reply=..."
                )
            state.pending_input.append(reply)
            state.state, answered = AgentState.OBSERVE, "reply"
        elif stop_reason is StopReason.APPROVAL_REQUIRED:
            if reply is not None:
                raise ResumeError(
                    f"run {run_id} waits for approvals, not a reply: pass approvals=..."
                )
            state.approvals = _decisions(run_id, state, approvals)
            state.state, answered = AgentState.ACT, "approvals"
        elif stop_reason in _INTERRUPTED:
            if approvals is not None:
                raise ResumeError(f"run {run_id} ended {stop_reason}; it has nothing to approve")
            if reply is not None:
                state.pending_input.append(reply)
            state.state, answered = AgentState.OBSERVE, "interrupted"
        else:
            reason = stop_reason.value if stop_reason else state.state.value
            raise ResumeError(
                f"run {run_id} has finished ({reason}); only a run that paused (ask_user, "
                "approvals), was aborted, timed out or was interrupted can be resumed"
            )
        if answered != "approvals":
            state.control = None
        state.abort_reason = None
        state.error = None
        state.output = None
        state.model_failure = None
        state.reflector_done = False
    state.timed_out = False
    state.elapsed_s = 0.0
    state.resumed_at.append(len(state.trace))
    return answered
