"""The ACT state's work: answer every tool call of one reply, exactly once, in order.

Control-flow tools go first and alone: when a valid ``ask_user`` (or, failing that, a valid
``finish_task``) appears *anywhere* among the calls, however often, it wins the turn, is
answered once, and every other call is answered "skipped" without running. Checking the whole
turn rather than the last call is what stops ``finish_task`` from repeating forever.

Otherwise the calls run, concurrently unless the agent says not to, and each one's result is
appended in call order. Must not raise for anything a model or a tool does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from agent_fsm.events import Event, ToolFinished, ToolStarted
from agent_fsm.limits import Limits
from agent_fsm.loops import canonical_arguments, record_calls, record_turn_results
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus
from agent_fsm.state import ControlKind, ControlRequest, RunState
from agent_fsm.tools import PreparedCall, ToolRegistry, skipped_result

__all__ = ["act"]

_CONTROL_PRIORITY = (ControlKind.ASK_USER, ControlKind.FINISH_TASK)

_CONTROL_ANSWER = {
    ControlKind.ASK_USER: "Your question was sent to the user. Their answer will arrive as the "
    "next user message.",
    ControlKind.FINISH_TASK: "The task is marked as finished.",
}


def _control_winner(prepared: Sequence[PreparedCall]) -> PreparedCall | None:
    """The first valid call of the highest-priority control tool in the turn, if any."""
    for kind in _CONTROL_PRIORITY:
        for item in prepared:
            if item.tool is not None and item.tool.control is kind and item.error is None:
                return item
    return None


def _control_request(winner: PreparedCall) -> ControlRequest:
    assert winner.tool is not None
    assert winner.tool.control is not None
    assert winner.arguments is not None
    kind = winner.tool.control
    text = winner.arguments.get("question" if kind is ControlKind.ASK_USER else "summary", "")
    return ControlRequest(kind=kind, text=str(text), tool_call_id=winner.call.id)


async def act(
    state: RunState,
    calls: Sequence[ToolCall],
    registry: ToolRegistry,
    limits: Limits,
    *,
    parallel: bool,
    emit: Callable[[Event], None] | None,
    clock: Callable[[], float],
) -> list[ToolMessage]:
    """Answer ``calls``; record control requests, error counts and loop signals in ``state``.

    Returns the results in call order; the caller appends them to the transcript.
    """
    state.control = None
    prepared = [registry.prepare(call) for call in calls]
    winner = _control_winner(prepared)
    turn = state.turns
    if emit is not None:
        for item in prepared:
            emit(ToolStarted(run_id=state.run_id, turn=turn, call=item.call))

    async def run_one(item: PreparedCall) -> tuple[ToolMessage, float]:
        started = clock()
        result = await registry.run(item, limits.tool_timeout_s)
        return result, clock() - started

    timed: list[tuple[ToolMessage, float]]
    if winner is not None:
        control = _control_request(winner)
        state.control = control
        state.output = control.text
        reason = f"{winner.call.name} ended the turn, so this call was not run."
        answer = _CONTROL_ANSWER[control.kind]
        timed = [
            (
                ToolMessage(tool_call_id=item.call.id, name=item.call.name, content=answer)
                if item is winner
                else skipped_result(item.call, reason),
                0.0,
            )
            for item in prepared
        ]
    elif len(prepared) == 1:
        timed = [await run_one(prepared[0])]
    elif parallel:
        timed = list(await asyncio.gather(*(run_one(item) for item in prepared)))
    else:
        timed = [await run_one(item) for item in prepared]
    results = [result for result, _ in timed]

    if emit is not None:
        for result, duration in timed:
            emit(
                ToolFinished(
                    run_id=state.run_id,
                    turn=turn,
                    call_id=result.tool_call_id,
                    name=result.name,
                    status=result.status,
                    output=result.content,
                    duration_s=duration,
                )
            )

    if winner is None:
        statuses = {r.status for r in results}
        if ToolStatus.OK in statuses:
            state.consecutive_errors = 0
        elif statuses == {ToolStatus.ERROR}:
            state.consecutive_errors += 1
    record_calls(
        state.loop,
        [(p.call.name, canonical_arguments(p.arguments, p.call.arguments)) for p in prepared],
        limits,
    )
    record_turn_results(state.loop, results, limits)
    return results
