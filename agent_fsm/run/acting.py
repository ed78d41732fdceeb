"""The ACT state's work: answer every tool call of one reply, exactly once, in order.

Control-flow tools go first and alone: when a valid ``ask_user`` (or, failing that, a valid
``finish_task``) appears *anywhere* among the calls, however often, it wins the turn, is
answered once, and every other call is answered "skipped" without running. Checking the whole
turn rather than the last call is what stops ``finish_task`` from repeating forever.

Otherwise a valid call whose tool needs approval is answered "skipped, awaiting approval" and
recorded as a pending ``ControlRequest(kind=APPROVAL)``, which ends the run for a person to
decide; every other call runs: concurrently (at most ``Limits.max_parallel_tools`` at once)
unless the agent says not to, a ``sequential`` tool alone, with results in call order. Must
not raise for anything a model or a tool does.

Three optional hooks serve durable and steerable runs: a ``ToolJournal`` (never run a call
twice across a crash, see ``journal.py``), ``interruption`` (steering: once it names a reason,
calls not yet started are skipped) and ``stop`` (the run is aborted: in-flight calls are
cancelled, the rest skipped, and ``act`` returns promptly).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Collection, Sequence

from pydantic import JsonValue

from agent_fsm.cancellation import StopEvent
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.events import Event, ToolFinished
from agent_fsm.limits import Limits
from agent_fsm.loop.detection import canonical_arguments, record_calls, record_turn_results
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus
from agent_fsm.records import builder
from agent_fsm.state import ControlKind, ControlRequest, RunState
from agent_fsm.tools.results import error_result, merge_runtime_details, skipped_result, truncate
from agent_fsm.tools.scheduling import STOPPED, TurnCalls, run_until_stopped, tool_started, waves
from agent_fsm.tools.tool import PreparedCall, ToolRegistry

__all__ = ["act"]

_tool_finished = builder(ToolFinished)  # built on every tool call (see records.builder)

_CONTROL_PRIORITY = (ControlKind.ASK_USER, ControlKind.FINISH_TASK)

_CONTROL_ANSWER = {
    ControlKind.ASK_USER: "Your question was sent to the user. Their answer will arrive as the "
    "next user message.",
    ControlKind.FINISH_TASK: "The task is marked as finished.",
}

_AWAITING_APPROVAL = (
    "Awaiting the user's approval: this call was not run. The decision (and the result, if "
    "approved) will arrive in the next user message."
)


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


def _approval_request(pending: Sequence[PreparedCall]) -> ControlRequest:
    """A short human summary of the calls that wait for approval, and the calls themselves."""
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


def _awaiting_approval(call: ToolCall) -> ToolMessage:
    return ToolMessage(
        tool_call_id=call.id,
        name=call.name,
        content=_AWAITING_APPROVAL,
        status=ToolStatus.SKIPPED,
        details={"runtime": {"awaiting_approval": True}},
    )


def _fair_shares(sizes: Sequence[int], budget: int) -> list[int]:
    """Characters each output may keep so that together they fit ``budget``: outputs below
    an equal share keep everything, and what they leave is shared among the longer ones."""
    shares = list(sizes)
    left, count = budget, len(sizes)
    for index in sorted(range(len(sizes)), key=sizes.__getitem__):
        share = left // count
        if sizes[index] > share:
            shares[index] = share
        left -= shares[index]
        count -= 1
    return shares


def _fit_turn(results: list[ToolMessage], limits: Limits) -> None:
    """Cut the longest outputs of the turn, in place, until together they fit the turn limit."""
    budget = limits.turn_max_output_chars
    if sum([len(r.content) for r in results]) <= budget:
        return
    sizes: list[int] = []
    originals: list[int] = []
    for result in results:
        runtime = result.details.get("runtime") if isinstance(result.details, dict) else None
        shown = runtime.get("shown_chars") if isinstance(runtime, dict) else None
        original = runtime.get("original_chars") if isinstance(runtime, dict) else None
        # An output the tool's own limit already cut counts at the size it was cut to.
        sizes.append(shown if isinstance(shown, int) else len(result.content))
        originals.append(original if isinstance(original, int) else len(result.content))
    for index, share in enumerate(_fair_shares(sizes, budget)):
        if share >= sizes[index]:
            continue
        result = results[index]
        runtime_update: dict[str, JsonValue] = {
            "original_chars": originals[index],
            "shown_chars": share,
            "cut_by_turn_limit": True,
        }
        results[index] = result.model_copy(
            update={
                "content": truncate(result.content, share, result.name, originals[index]),
                "details": merge_runtime_details(result.details, runtime_update),
            }
        )


async def act(
    state: RunState,
    calls: Sequence[ToolCall],
    registry: ToolRegistry,
    limits: Limits,
    *,
    parallel: bool,
    emit: Callable[[Event], None] | None,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    journal: ToolJournal | None = None,
    interruption: Callable[[], str | None] | None = None,
    stop: StopEvent | None = None,
    approved: Collection[str] = (),
) -> list[ToolMessage]:
    """Answer ``calls``; record control requests, error counts and loop signals in ``state``.

    Args:
        parallel: run the calls of the reply concurrently (results stay in call order).
        emit: where events go; None when nobody listens.
        clock: the time source for durations.
        sleep: awaited for retry backoff (a fake one keeps tests instant).
        journal: records each executed call before and after it runs; a call it already
            holds is answered from it (finished) or, when it started but never finished,
            re-run only if its tool is idempotent.
        interruption: asked after each call finishes; once it returns a reason, calls not
            yet started are answered "skipped" with that reason.
        stop: once set, running calls are cancelled (a sync tool's thread is abandoned) and
            answered with an error, calls not yet started are skipped, and ``act`` returns.
        approved: ids of calls a person already approved (a resumed approval pause): they
            run without asking again.

    Returns the results in call order; the caller appends them to the transcript.
    """
    state.control = None
    prepared = [registry.prepare(call) for call in calls]
    winner = _control_winner(prepared)
    turn = TurnCalls(state, prepared, limits, emit, clock, sleep, journal, interruption)
    results = turn.results
    if winner is not None:
        control = _control_request(winner)
        state.control = control
        state.output = control.text
        reason = f"{winner.call.name} ended the turn, so this call was not run."
        answer = _CONTROL_ANSWER[control.kind]
        for index, item in enumerate(prepared):
            results[index] = (
                ToolMessage(tool_call_id=item.call.id, name=item.call.name, content=answer)
                if item is winner
                else skipped_result(item.call, reason)
            )
    else:
        runnable: list[int] = []
        pending: list[PreparedCall] = []
        for index, item in enumerate(prepared):
            if item.error is not None or item.tool is None:
                results[index] = error_result(item.call, item.error or "the call cannot run")
            elif (
                item.tool.requires_approval is not False
                and item.call.id not in approved
                and item.tool.needs_approval(item.arguments or {})
            ):
                results[index] = _awaiting_approval(item.call)
                pending.append(item)
            else:
                runnable.append(index)
        if runnable:
            groups = waves(prepared, runnable, parallel)
            if stop is None:
                await turn.run_groups(groups)
            else:
                await run_until_stopped(turn, groups, stop)
        if pending:
            control = _approval_request(pending)
            state.control = control
            state.output = control.text
    final: list[ToolMessage] = [
        result if result is not None else skipped_result(prepared[index].call, STOPPED)
        for index, result in enumerate(results)
    ]
    _fit_turn(final, limits)

    if emit is not None:
        run_id, number = state.run_id, state.turns
        for index, result in enumerate(final):
            if not turn.started[index]:
                emit(tool_started(run_id=run_id, turn=number, call=prepared[index].call))
            emit(
                _tool_finished(
                    run_id=run_id,
                    turn=number,
                    call_id=result.tool_call_id,
                    name=result.name,
                    status=result.status,
                    output=result.content,
                    duration_s=turn.durations[index],
                    is_error=result.status is ToolStatus.ERROR,
                    output_chars=len(result.content),
                    details=result.details,
                    attempts=turn.attempts[index],
                )
            )

    if winner is None:
        statuses = {r.status for r in final}
        if ToolStatus.OK in statuses:
            state.consecutive_errors = 0
        elif statuses == {ToolStatus.ERROR}:
            state.consecutive_errors += 1
    record_calls(
        state.loop,
        [(p.call.name, canonical_arguments(p.arguments, p.call.arguments)) for p in prepared],
        limits,
    )
    record_turn_results(state.loop, final, limits)
    return final
