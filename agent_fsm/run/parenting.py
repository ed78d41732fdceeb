"""ACT for a parent: the work of the ACT state for an agent with sub-agent tools
(``run.delegation``), or whose output guardrails screen what ends a run in REFLECT.

The engine picks these for such agents only (``run.engine._work_for``), so an agent without
sub-agents or such guardrails runs the plain ``run.acting.act`` and pays nothing for them:

- ``act_as_parent``: the tools see the run as their parent (``PARENT_RUN``); what the
  step's children spent is counted in the run's when the step ends (``fold``: the turn
  count keys the tool journal, so it must not move while the step's calls run), and again
  for a child's answer replayed from the journal (``fold_replayed``); a child that stopped to
  ask the user becomes the turn's request to pause (``pause_request``, read by the
  ``sub_agent_paused`` row). Resumed with the answer for that child, ACT passes it down and
  goes on with the child instead (``_carry_out_child``): its result reaches the model in the
  next user message, or the run pauses again for it.
- ``act_screened``: the turn's finish_task summary or terminal tool output is checked by
  the output guardrails (``run.guarding.screen_ending``).

Must not raise for anything a model, a tool or a child does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import JsonValue

from agent_fsm.cancellation import StopScope
from agent_fsm.messages import ToolMessage, Usage
from agent_fsm.run.acting import act
from agent_fsm.run.context import RunContext, acting_for
from agent_fsm.run.guarding import screen_ending
from agent_fsm.state import ControlKind, ControlRequest, RunResult, SubAgentPause
from agent_fsm.table import Row, StopReason
from agent_fsm.tools.tool import ToolResult

__all__ = [
    "act_as_parent",
    "act_screened",
    "fold",
    "fold_replayed",
    "pause_request",
    "settle_orphans",
]


async def act_screened(ctx: RunContext) -> None:
    """ACT's work for an agent whose output guardrails screen what ends a run in REFLECT:
    the turn's finish_task summary or terminal tool output is checked once the calls are
    answered (``run.guarding.screen_ending``). The engine picks it for such an agent only."""
    await (act_as_parent(ctx) if ctx.config.delegates else act(ctx))
    await screen_ending(ctx)


async def act_as_parent(ctx: RunContext) -> None:
    """ACT's work (``act``) for an agent with sub-agent tools: they see the run as their
    parent (``run.delegation``); the spend of a sub-agent call answered from the journal
    is counted again (``fold_replayed``); a child that stopped to ask the user becomes a
    request that pauses the run (``sub_agent_paused``). Resumed with the answer for such a
    child, ACT passes it down and goes on with the child instead (``_carry_out_child``).
    The engine picks it for such an agent only."""
    state = ctx.state
    before = len(state.messages)
    try:
        with acting_for(ctx):
            if state.awaiting_child is not None and (
                state.child_reply is not None or state.decisions
            ):
                await _carry_out_child(ctx, state.awaiting_child)
            else:
                await act(ctx)
    finally:  # the step's calls are answered (or abandoned): its children's spend counts
        children, ctx.finished_children = ctx.finished_children, ()
        counted = ctx.counted_children
        for child in children:
            fold(ctx, child, None if counted is None else counted.pop(child.run_id, None))
    for message in state.messages[before:]:
        if isinstance(message, ToolMessage):
            fold_replayed(ctx, message)
            _pause_for_child(ctx, message.tool_call_id, message.name, message.details)


def pause_request(tool_call_id: str, tool_name: str, details: object) -> ControlRequest | None:
    """The parent's request to pause for a child that waits for the user, from its call's
    answer (``_answer``; the same when the answer is replayed from the journal); None for
    any other answer."""
    if not isinstance(details, dict) or "awaiting_sub_agent" not in details:
        return None
    try:
        asked = ControlRequest.model_validate(details["awaiting_sub_agent"])
        run_id = str(details["sub_agent_run_id"])
    except (ValueError, KeyError):
        return None
    asks = asked.waits_for
    spent = {key: details[key] for key in _SPEND_KEYS if key in details}
    deeper = asked.sub_agent
    below = () if deeper is None else (deeper.tool, *deeper.below)
    return ControlRequest(
        kind=ControlKind.SUB_AGENT,
        text=asked.text,
        tool_call_id=tool_call_id,
        pending_calls=asked.pending_calls,
        sub_agent=SubAgentPause(
            run_id=run_id,
            tool=tool_name,
            asks=asks,
            pause=asked.pause,
            below=below,
            counted=spent,
        ),
    )


_SPEND_KEYS = ("turns", "retries", "last_answers", "usage", "cost")


def _pause_for_child(ctx: RunContext, call_id: str, tool: str, details: object) -> None:
    """A child that waits for the user (its call's answer says so, run or replayed) makes
    the turn's request to pause the whole tree; the first one only (a reply's later
    sub-agent calls do not start while one waits: ``run.delegation.run_child``)."""
    request = pause_request(call_id, tool, details)
    if request is None:
        return
    state = ctx.state
    if not any(r.kind is ControlKind.SUB_AGENT for r in state.requests):
        state.requests.append(request)


async def _carry_out_child(ctx: RunContext, waiting: ControlRequest) -> None:
    """Pass the resume's answer down to the sub-agent the run paused for, and go on with
    it: its result is told to the model in the next user message (its call was answered
    when the run paused, so nothing is appended to the transcript), or, when it stops to
    ask again, the run pauses again for it."""
    state = ctx.state
    pause = waiting.sub_agent
    assert pause is not None  # a SUB_AGENT request always names its child
    reply, decisions = state.child_reply, state.decisions
    state.child_reply = None
    state.decisions = []
    state.awaiting_child = None
    found = ctx.config.tools.get(pause.tool)
    go_on = getattr(found.fn, "go_on", None) if found is not None else None
    if go_on is None:
        said = f"the sub-agent tool {pause.tool} is not one of this agent's tools any more"
        state.pending_input.append(_told(pause.tool, waiting.tool_call_id, said))
        return
    answer: ToolResult | None = None
    with StopScope(ctx.stop):  # the run's abort or deadline aborts the child
        answer = await go_on(ctx, pause, reply, decisions)
    if answer is None or _not_gone_on(answer):  # stopped, or could not go on with it
        why = ctx.why_stopped() if answer is None else answer.output
        assert found is not None  # it has a go_on
        await _settle(ctx, found.fn, pause, why)  # a child still at its pause is ended
        said = f"it was stopped before it finished: {why}"
        state.pending_input.append(_told(pause.tool, waiting.tool_call_id, said))
        return
    call_id = waiting.tool_call_id
    if pause_request(call_id, pause.tool, answer.details) is not None:
        _pause_for_child(ctx, call_id, pause.tool, answer.details)
        return
    if found is not None and found.terminal and not answer.is_error:  # a handoff's answer
        request = ControlRequest(
            kind=ControlKind.TERMINAL_TOOL, text=answer.output, tool_call_id=call_id
        )
        state.requests.append(request)  # ends the run, by the terminal_tool row
        return
    said = f"it stopped without finishing: {answer.output}" if answer.is_error else answer.output
    state.pending_input.append(_told(pause.tool, call_id, said))


def _not_gone_on(answer: ToolResult) -> bool:
    """The answer says the child was not run on (the parent had nothing left for it, or its
    run could not be reached): it may still wait at its pause."""
    details = answer.details
    return isinstance(details, dict) and details.get("stop_reason") in (
        "not_resumed",
        "not_started",
    )


async def _settle(ctx: RunContext, fn: object, pause: SubAgentPause, why: str) -> bool:
    """End the child that waits at ``pause``, which its parent will not answer
    (``run.delegation.settle``); False when there is nothing to end."""
    settle = getattr(fn, "settle", None)
    if settle is None:
        return False
    ended: bool = await settle(ctx, pause, why)
    return ended


async def settle_orphans(ctx: RunContext, row: Row) -> None:
    """The run stops by ``row`` for another reason than its child's pause, while a child of
    its last turn waits at one (a higher-ranked row won: an abort, finish_task, a terminal
    tool, its own question or approvals): that child is ended (``run.delegation.settle``),
    and the model is told, in the next user message, should the run go on (its call's answer
    said the run waits for it unless it stops first). The engine calls it for a parent's
    stops only."""
    state = ctx.state
    if row.stop_reason is StopReason.SUB_AGENT_PAUSED:
        return
    for request in state.requests:
        pause = request.sub_agent
        if request.kind is not ControlKind.SUB_AGENT or pause is None:
            continue
        found = ctx.config.tools.get(pause.tool)
        why = f"the run stopped ({row.stop_reason.value if row.stop_reason else row.dest})"
        if found is not None and await _settle(ctx, found.fn, pause, why):
            state.pending_input.append(
                f"The sub-agent {pause.tool} (call {request.tool_call_id}), which waited for "
                f"the user, was stopped without an answer: {why} first."
            )


def _told(tool: str, call_id: str, said: str) -> str:
    """The user message that brings a paused sub-agent's result to the model."""
    return (
        f"The sub-agent {tool} (call {call_id}), which waited for the user, went on with "
        f"their answer. Its result: {said}"
    )


def fold(
    parent: RunContext, child: RunResult, counted: Mapping[str, JsonValue] | None = None
) -> None:
    """Count what a child spent in its parent: its turns and last answers as the parent's
    turns (at least one: a call that made no model call still uses a turn, so ``max_turns``
    bounds how many a run makes), its retries, usage and cost as the parent's (the cost
    only when the parent is priced). A child that went on after a pause adds only what it
    spent since (``counted``: what the parent counted then)."""
    state = parent.state
    spent = counted or {}
    turns = child.turns + child.last_answers
    turns -= _spent(spent, "turns") + _spent(spent, "last_answers")
    state.turns += max(turns, 0) if counted is not None else max(turns, 1)
    state.retries += max(child.retries - _spent(spent, "retries"), 0)
    usage = child.usage
    before = spent.get("usage")
    if isinstance(before, dict):
        usage = _less(usage, Usage.model_validate(before))
    state.usage = state.usage + usage
    if child.cost is not None and parent.config.pricing is not None:
        earlier = spent.get("cost")
        cost = child.cost - (float(earlier) if isinstance(earlier, int | float) else 0.0)
        state.cost = (state.cost or 0.0) + max(cost, 0.0)


def _less(usage: Usage, before: Usage) -> Usage:
    """What ``usage`` adds to ``before`` (each count at least 0)."""
    values = usage.model_dump()
    earlier = before.model_dump()
    return Usage.model_validate(
        {
            key: value
            if isinstance(value, bool) or not isinstance(value, int)
            else max(value - earlier.get(key, 0), 0)
            for key, value in values.items()
        }
    )


def fold_replayed(parent: RunContext, answer: ToolMessage) -> None:
    """Count in the parent what a child spent when its call's answer was replayed from the
    journal (a step redone after a crash: the checkpoint the parent restarted from was taken
    before the call, so the spend the call counted was lost with the process). Answers that
    are no sub-agent's, or were not replayed, are left alone."""
    details = answer.details
    if not isinstance(details, dict) or "sub_agent_run_id" not in details:
        return
    runtime = details.get("runtime")
    if not isinstance(runtime, dict) or runtime.get("replayed") is not True:
        return
    state = parent.state
    state.turns += max(_spent(details, "turns") + _spent(details, "last_answers"), 1)
    state.retries += _spent(details, "retries")
    usage = details.get("usage")
    if isinstance(usage, dict):
        state.usage = state.usage + Usage.model_validate(usage)
    cost = details.get("cost")
    if isinstance(cost, int | float) and parent.config.pricing is not None:
        state.cost = (state.cost or 0.0) + float(cost)


def _spent(details: Mapping[str, Any], key: str) -> int:
    """A count of a sub-agent's details, as a non-negative int (0 when it is anything else)."""
    value = details.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0
