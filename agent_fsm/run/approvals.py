"""Approvals, start to end: which calls wait for a person, what the run says while it waits,
how a person's decisions are read on resume, and what the model is told about each outcome.

A valid call whose tool ``requires_approval`` (and was not approved already) is answered
"awaiting approval" without running, and the turn's pending calls become a
``ControlRequest(kind=APPROVAL)`` that stops the run (DONE ``approval_required``). On resume,
``decide`` turns the caller's answer into one ``Decision`` per pending call; the resume row
``carry_out`` takes the run to ACT, which runs the allowed calls (``acting.carry_out``) and
tells the model the outcome of each in the next user message (``outcome_message``). The
transcript is valid throughout: every call was answered when the run paused.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence

from agent_fsm.errors import ResumeError
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus, clean_text
from agent_fsm.state import Approval, ControlKind, ControlRequest, Decision
from agent_fsm.tools.tool import PreparedCall, ToolRegistry

__all__ = [
    "Decisions",
    "approval_request",
    "awaiting_approval",
    "decide",
    "edited_call",
    "needs_approval",
    "outcome_message",
]

Decisions = Mapping[str, bool | Approval] | bool | Approval
"""Approval decisions as a caller gives them: per call id, or one for every pending call."""

AWAITING_APPROVAL = (
    "Awaiting the user's approval: this call was not run. The decision (and the result, if "
    "approved) will arrive in the next user message."
)


def needs_approval(item: PreparedCall, approved: Collection[str]) -> bool:
    """A valid call that must wait for a person: its tool asks for approval of these
    arguments, and it was not approved already (a resumed approval pause)."""
    tool = item.tool
    return (
        tool is not None
        and tool.requires_approval is not False
        and item.call.id not in approved
        and tool.needs_approval(item.arguments or {})
    )


def awaiting_approval(call: ToolCall) -> ToolMessage:
    """The answer of a call that waits: it did not run, and the model is told why."""
    return ToolMessage(
        tool_call_id=call.id,
        name=call.name,
        content=AWAITING_APPROVAL,
        status=ToolStatus.SKIPPED,
        details={"runtime": {"awaiting_approval": True}},
    )


def approval_request(pending: Sequence[PreparedCall]) -> ControlRequest:
    """The request that stops the run: a short human summary of the calls that wait for
    approval, and the calls themselves."""
    shown = []
    for item in pending:
        arguments = json.dumps(item.arguments, ensure_ascii=False, separators=(", ", "="))
        arguments = arguments[1:-1].replace('"', "") if arguments.startswith("{") else arguments
        if len(arguments) > 120:
            arguments = arguments[:119] + "…"
        shown.append(f"{item.call.name}({arguments})")
    if len(shown) == 1:
        text = f"Approval needed to run {shown[0]}"
    else:
        text = f"Approval needed to run {len(shown)} tool calls: " + "; ".join(shown)
    return ControlRequest(
        kind=ControlKind.APPROVAL,
        text=text,
        tool_call_id=pending[0].call.id,
        pending_calls=tuple(item.call for item in pending),
    )


def decide(
    run_id: str,
    control: ControlRequest,
    approvals: Decisions | None,
    tools: ToolRegistry | None = None,
) -> list[Decision]:
    """One decision per pending call, from the caller's ``approvals``; arguments a person
    edited (``Approval.arguments``) checked against the call's tool in ``tools`` as a
    model's call is (``ToolRegistry.prepare``).

    Raises:
        ResumeError: no approvals, not a mapping or one decision, a pending call without a
            decision, a decision for a call that is not pending, or a decision that is not
            ``True``, ``False`` or an ``Approval``; edited arguments that do not fit the
            tool's schema (what is wrong, as a model would be told), or without ``tools``
            to check them against. The message lists what is pending.
    """
    pending = control.pending_calls
    listing = ", ".join(f"{call.id} ({call.name} {call.arguments})" for call in pending)
    if approvals is None:
        raise ResumeError(
            f"run {run_id} waits for approval of {listing}: pass approvals={{call_id: True | "
            "False | Approval(allow=..., reason=...)}} (or one decision for all)"
        )
    if isinstance(approvals, bool | Approval):
        approvals = dict.fromkeys([call.id for call in pending], approvals)
    if not isinstance(approvals, Mapping):
        raise ResumeError(
            f"approvals must map call ids to decisions, got {type(approvals).__name__}"
        )
    unknown = sorted(set(approvals) - {call.id for call in pending})
    missing = [call.id for call in pending if call.id not in approvals]
    if unknown or missing:
        problems = []
        if missing:
            problems.append(f"no decision for {missing}")
        if unknown:
            problems.append(f"{unknown} are not pending")
        raise ResumeError(f"run {run_id}: {'; '.join(problems)} (pending: {listing})")
    decisions = [
        Decision(call=call, approval=_approval(call.id, approvals[call.id])) for call in pending
    ]
    for decision in decisions:
        if decision.approval.arguments is not None:
            _check_edit(run_id, decision, tools)
    return decisions


def edited_call(decision: Decision) -> ToolCall:
    """The call as the person approved it: with their arguments, when they edited them."""
    edit = decision.approval.arguments
    if edit is None:
        return decision.call
    text = json.dumps(edit, ensure_ascii=False, separators=(",", ":"))
    return decision.call.model_copy(update={"arguments": text})


def _check_edit(run_id: str, decision: Decision, tools: ToolRegistry | None) -> None:
    call = decision.call
    if tools is None:
        raise ResumeError(
            f"run {run_id}: the arguments given for {call.id} ({call.name}) cannot be checked "
            "here: edited arguments are checked against the agent's tools on resume"
        )
    prepared = tools.prepare(edited_call(decision))
    if prepared.error is not None:
        raise ResumeError(
            f"run {run_id}: the arguments given for {call.id} ({call.name}) do not fit the "
            f"tool: {prepared.error}"
        )


def _approval(call_id: str, decision: object) -> Approval:
    if isinstance(decision, bool):
        return Approval(allow=decision)
    if isinstance(decision, Approval):
        if decision.reason and clean_text(decision.reason) is not decision.reason:
            return decision.model_copy(update={"reason": clean_text(decision.reason)})
        return decision
    raise ResumeError(
        f"the decision for {call_id} must be True, False or an Approval, "
        f"got {type(decision).__name__}"
    )


def outcome_message(decisions: Sequence[Decision], results: Mapping[str, ToolMessage]) -> str:
    """What the model is told, as the next user message, about each decided call: denied (with
    the reason given), or approved with its result."""
    lines = ["Decisions on the tool calls that awaited approval:"]
    for decision in decisions:
        call, approval = decision.call, decision.approval
        why = f" Reason given: {approval.reason}" if approval.reason else ""
        result = results.get(call.id)
        if approval.arguments is not None and result is not None:
            edited = json.dumps(approval.arguments, ensure_ascii=False)
            why = f" The user changed its arguments to {edited}.{why}"
        if result is None:
            lines.append(f"- {call.name} (call {call.id}): denied, so it was not run.{why}")
        else:
            outcome = "approved, but it failed" if result.is_error else "approved and run"
            lines.append(
                f"- {call.name} (call {call.id}): {outcome}.{why} Result: {result.content}"
            )
    return "\n".join(lines)
