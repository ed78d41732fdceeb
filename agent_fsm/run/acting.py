"""ACT: answer every tool call of one reply, exactly once, in order.

``act(ctx)`` is the whole of the ACT state's work. It carries out approval decisions when a
resume brought the run here (``carry_out``); otherwise it answers the calls of the last reply
(``answer_calls``), in named steps:

1. **control calls**: when a valid ``ask_user`` or ``finish_task`` appears *anywhere* among
   the calls, the turn runs no tool: each kind called becomes a request (``RunState.requests``,
   read by its own guard), the one the table ranks first (``AgentMachine.control_order``,
   the order of the REFLECT rows) is answered as made, and every other call is answered
   "skipped". Checking the whole turn rather than the last call is what stops
   ``finish_task`` from repeating forever;
2. **the before_tool hook** (``Agent(hooks=...)``, if set) decides, in call order, each call
   that would be gated next: it may deny it (answered with the reason) or change its
   arguments (validated again; the answer records the change) (``_screened``);
3. **gating**: a call that cannot run is answered with its error; a call that needs approval is
   answered "awaiting approval" and becomes part of a pending request (``approvals.py``); a
   call of a terminal tool after the turn's first valid one is answered "skipped", and so is
   every terminal call while calls wait for approval, when the table ranks the approval row
   above the terminal one. So a person approves the arguments that will run, and is not
   asked about a denied call;
4. **running** the rest through ``tools.scheduling`` (concurrently unless the agent says not
   to, through the journal, until steering interrupts or the run is stopped); the answer of
   each call that ran goes through the after_tool hook, if set (``_reviewer``);
5. **fair share**: the turn's outputs are cut to fit ``Limits.turn_max_output_chars``;
6. **terminal tools**: when the turn's terminal call succeeded, its output becomes a
   ``terminal_tool`` request; with calls left awaiting approval beside it, the REFLECT rows
   decide which request ends the run (by default the terminal one: the run ends, and they
   never run);
7. **counters**: the consecutive-error count and the loop detector see the turn.

ACT decides no stop: it records what the turn asked for, and the REFLECT rows decide (the
request of the row that fires becomes ``RunState.control`` and the run's output, in
``run.outcome``). Must not raise for anything a model or a tool does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Collection, Sequence

from pydantic import JsonValue

from agent_fsm.cancellation import StopScope
from agent_fsm.constructors import builder
from agent_fsm.durable.journal import CallStatus, journal_key
from agent_fsm.events import ToolFinished
from agent_fsm.loop.detection import canonical_arguments, record_calls, record_turn_results
from agent_fsm.messages import AssistantMessage, ToolCall, ToolMessage, ToolStatus
from agent_fsm.run.approvals import (
    approval_request,
    awaiting_approval,
    edited_call,
    needs_approval,
    outcome_message,
)
from agent_fsm.run.context import RunContext
from agent_fsm.state import CONTROL_STOPS, ControlKind, ControlRequest
from agent_fsm.table import StopReason
from agent_fsm.tools.hooks import AfterTool, BeforeTool, review_result, screen_call
from agent_fsm.tools.results import (
    error_result,
    fit_turn,
    merge_runtime_details,
    readable_parts,
    skipped_result,
)
from agent_fsm.tools.scheduling import (
    STOPPED,
    Review,
    TurnCalls,
    run_until_stopped,
    tool_started,
)
from agent_fsm.tools.tool import PreparedCall, ToolRegistry

__all__ = ["act", "answer_calls", "carry_out"]

_tool_finished = builder(ToolFinished)  # built on every tool call (see constructors.builder)

_ASKS = (ControlKind.ASK_USER, ControlKind.FINISH_TASK)
"""The control tools whose call makes the whole turn: no other call of it runs."""

_CONTROL_ANSWER = {
    ControlKind.ASK_USER: "Your question was sent to the user. Their answer will arrive as the "
    "next user message.",
    ControlKind.FINISH_TASK: "The task is marked as finished.",
}


def act(ctx: RunContext) -> Awaitable[object]:
    """ACT's work: carry out a resume's approval decisions, or answer the last reply's calls
    into the transcript. A function that returns the work to await, not a coroutine of its
    own: one object fewer held by every run while its tools run (issue 39)."""
    state = ctx.state
    if state.decisions:
        return carry_out(ctx)
    last = state.messages[-1]
    calls = last.tool_calls if isinstance(last, AssistantMessage) else ()
    return answer_calls(ctx, calls, transcribed=True)


async def carry_out(ctx: RunContext) -> None:
    """Run the calls a person allowed, skip the denied ones, and tell the model the outcome of
    each in the next user message (the calls were answered "awaiting approval" when the run
    paused, so nothing is appended to the transcript here)."""
    state = ctx.state
    decisions = state.decisions
    allowed = [edited_call(d) for d in decisions if d.approval.allow]
    # a call a person edited is put to the before_tool hook again: it screens what will run
    edited = {d.call.id for d in decisions if d.approval.arguments is not None}
    results = await answer_calls(
        ctx, allowed, approved={call.id for call in allowed}, unscreened=edited
    )
    state.pending_input.append(outcome_message(decisions, {r.tool_call_id: r for r in results}))
    state.decisions = []


def _unless_withheld(item: PreparedCall, withheld: tuple[str, ...]) -> PreparedCall:
    """A call of a tool the loop ladder withheld cannot run: it is answered with why."""
    if item.call.name not in withheld:
        return item
    return dataclasses.replace(
        item,
        error=f"The tool '{item.call.name}' is no longer available in this run: it was "
        "called over and over without progress. Go on without it.",
    )


async def answer_calls(
    ctx: RunContext,
    calls: Sequence[ToolCall],
    approved: Collection[str] = (),
    unscreened: Collection[str] = (),
    *,
    transcribed: bool = False,
) -> list[ToolMessage]:
    """Answer ``calls``, one result each in call order; record a control request, the error
    count and loop signals in the run state.

    Args:
        transcribed: append the answers to the transcript (a reply's calls, answered in
            ACT); otherwise the caller uses them (calls a person approved, whose answers
            went into the transcript when the run paused).
        approved: ids of calls a person already approved: they run without asking again
            (and without the ``before_tool`` hook, which saw them before they were asked).
        unscreened: ids among ``approved`` whose arguments the person changed: the hook
            has not seen these arguments, so it is asked about them.
    """
    # No comprehension in this function: on Python 3.11 one makes each local it reads a
    # cell, and the cells live in this frame while the tools run, for the collector to
    # look at (issue 39).
    state, config = ctx.state, ctx.config
    if state.requests:  # the last turn's: a new list only when there were some
        state.requests = []
    prepared = _prepare(config.tools, calls, state.withheld)
    hooks = config.hooks
    turn = TurnCalls(ctx, prepared, None if hooks is None else _reviewer(ctx, hooks.after_tool))
    machine = config.machine
    asked = _control_calls(prepared, machine.control_order)
    if asked:
        _answer_control(ctx, asked, prepared, turn.results)
    elif hooks is None or await _screened(
        ctx, hooks.before_tool, turn, set(approved) - set(unscreened) if unscreened else approved
    ):
        runnable, pending = _gate(turn.prepared, approved, turn.results, machine.approval_first)
        if runnable:
            await run_until_stopped(turn, runnable, config.parallel_tool_calls)
        if pending:
            state.requests.append(approval_request(pending))
    final = _answers(turn)
    if hooks is not None:
        _keep_hook_facts(turn.prepared, final)
    _end_on_terminal_tool(ctx, turn.prepared, final)
    fit_turn(final, ctx.limits.turn_max_output_chars)
    if config.part_support is not None:
        readable_parts(final, config.part_support)
    _report(ctx, turn, turn.prepared, final)
    _count(ctx, bool(asked), prepared, final)  # the loop detector sees the model's calls
    if transcribed:
        for result in final:
            ctx.append(result)
    return final


def _prepare(
    tools: ToolRegistry, calls: Sequence[ToolCall], withheld: tuple[str, ...]
) -> list[PreparedCall]:
    """Each call prepared to run; one of a tool the loop ladder took away
    (``Limits.loop_ladder``) is answered with why."""
    prepared = [tools.prepare(call) for call in calls]
    if withheld:
        prepared = [_unless_withheld(item, withheld) for item in prepared]
    return prepared


def _answers(turn: TurnCalls) -> list[ToolMessage]:
    """Every call's answer: a call that never started (the run was stopped) is skipped."""
    return [
        result if result is not None else skipped_result(turn.prepared[index].call, STOPPED)
        for index, result in enumerate(turn.results)
    ]


def _rank(order: Sequence[StopReason], kind: ControlKind) -> int:
    """Where the table ranks requests of ``kind`` (kinds it has no row for come last)."""
    stop = CONTROL_STOPS[kind]
    return order.index(stop) if stop in order else len(order)


def _control_calls(
    prepared: Sequence[PreparedCall], order: Sequence[StopReason]
) -> Sequence[PreparedCall]:
    """The first valid call of each control tool the turn calls (ask_user, finish_task), the
    one the table ranks first first."""
    first: dict[ControlKind, PreparedCall] | None = None
    for item in prepared:
        tool = item.tool
        if tool is not None and tool.control in _ASKS and item.error is None:
            assert tool.control is not None
            first = first or {}
            first.setdefault(tool.control, item)
    if first is None:  # the usual turn: no control tool called
        return ()
    return sorted(first.values(), key=lambda item: _rank(order, _kind(item)))


def _kind(item: PreparedCall) -> ControlKind:
    tool = item.tool
    assert tool is not None
    assert tool.control is not None
    return tool.control


def _answer_control(
    ctx: RunContext,
    asked: Sequence[PreparedCall],
    prepared: Sequence[PreparedCall],
    results: list[ToolMessage | None],
) -> None:
    """The turn called control tools: each becomes a request; the one ranked first is
    answered as made, every other call of the turn skipped."""
    for item in asked:
        assert item.arguments is not None
        kind = _kind(item)
        text = item.arguments.get("question" if kind is ControlKind.ASK_USER else "summary", "")
        request = ControlRequest(kind=kind, text=str(text), tool_call_id=item.call.id)
        ctx.state.requests.append(request)
    winner = asked[0]
    kind = _kind(winner)
    reason = f"{winner.call.name} ended the turn, so this call was not run."
    for index, item in enumerate(prepared):
        results[index] = (
            ToolMessage(
                tool_call_id=item.call.id, name=item.call.name, content=_CONTROL_ANSWER[kind]
            )
            if item is winner
            else skipped_result(item.call, reason)
        )


async def _screened(
    ctx: RunContext, hook: BeforeTool | None, turn: TurnCalls, approved: Collection[str]
) -> bool:
    """Put each call that would be gated next to the ``before_tool`` hook, one at a time in
    call order (``tools.hooks.screen_call``): a denied or failed one is answered, a changed
    one replaced in ``turn.prepared``. False when the run was stopped meanwhile: then no call
    is gated or run (each unanswered one is answered "skipped").

    Not put to the hook: calls that cannot run (their error answers them), control and
    typed-output calls (the engine's own), calls a person approved (the hook saw them before
    they were asked), terminal calls after the turn's first (skipped), and calls the journal
    answers (a crashed run's finished calls are replayed as they were, the hook not asked
    again; an idempotent call that never finished is re-run, and asked again).
    """
    if hook is None:
        return True
    registry, prepared = ctx.config.tools, list(turn.prepared)
    terminal = False  # a terminal call goes on: later ones are skipped, so not asked about
    with StopScope(ctx.stop) as scope:
        for index, item in enumerate(prepared):
            tool = item.tool
            if tool is None or item.error is not None or (tool.terminal and terminal):
                continue
            if _asks_hook(ctx, index, item, approved):
                limits = ctx.limits
                timeout_s = tool.timeout_s or limits.tool_timeout_s
                limit = tool.max_output_chars or limits.tool_max_output_chars
                screened = await screen_call(hook, item, registry, timeout_s, limit)
                if isinstance(screened, ToolMessage):
                    turn.results[index] = screened
                    _log_hook_failure(ctx, screened)
                    continue
                prepared[index] = screened
            terminal = terminal or tool.terminal
    turn.prepared = prepared
    return not (scope.stopped or ctx.stop.is_set())


def _asks_hook(ctx: RunContext, index: int, item: PreparedCall, approved: Collection[str]) -> bool:
    """Whether ``before_tool`` decides this valid call (see ``_screened``)."""
    return (
        _hooked(ctx, item)
        and item.call.id not in approved
        and not _journal_answers(ctx, index, item)
    )


def _hooked(ctx: RunContext, item: PreparedCall) -> bool:
    """Whether the tool hooks see this call: every tool's but the engine's own (control
    tools, and the typed-output tool, whose arguments are the run's result)."""
    tool = item.tool
    if tool is None or tool.control is not None:
        return False
    output = ctx.config.output
    return output is None or output.mode != "tool" or tool.name != output.tool_name


def _journal_answers(ctx: RunContext, index: int, item: PreparedCall) -> bool:
    """The journal of a resumed durable run answers this call without running it: it
    finished before the crash, or it started and is not idempotent (its outcome unknown)."""
    journal = ctx.journal
    if journal is None:
        return False
    try:
        entry = journal.lookup(journal_key(ctx.state.turns, index, item.call.id))
    except Exception:  # the store failed: running the call will say so
        return False
    if entry is None:
        return False
    idempotent = item.tool is not None and item.tool.idempotent
    return entry.status is CallStatus.FINISHED or not idempotent


def _log_hook_failure(ctx: RunContext, result: ToolMessage) -> None:
    """The people who run the agent see a hook's failure in the log (the model sees the
    answer)."""
    runtime = result.details.get("runtime") if isinstance(result.details, dict) else None
    failed = runtime.get("hook_failed") if isinstance(runtime, dict) else None
    if failed is not None:
        ctx.log.warning(
            "tool_hook_failed",
            tool=result.name,
            call_id=result.tool_call_id,
            turn=ctx.state.turns,
            error=result.content[:500],
        )


def _reviewer(ctx: RunContext, hook: AfterTool | None) -> Review:
    """What a call's answer goes through once it ran (``TurnCalls.review``): the facts of a
    ``before_tool`` change added, then the ``after_tool`` hook (which cannot drop them)."""

    async def review(item: PreparedCall, result: ToolMessage) -> ToolMessage:
        if item.runtime is not None:
            result = _with_facts(result, item.runtime)
        if hook is None or not _hooked(ctx, item):
            return result
        tool, limits = item.tool, ctx.limits
        assert tool is not None  # it ran
        timeout_s = tool.timeout_s or limits.tool_timeout_s
        limit = tool.max_output_chars or limits.tool_max_output_chars
        reviewed = await review_result(hook, item, result, timeout_s, limit)
        if reviewed is not result and item.runtime is not None:
            reviewed = _with_facts(reviewed, item.runtime)
        return reviewed  # a failed hook is logged with the failed calls (tool_call_failed)

    return review


def _with_facts(result: ToolMessage, runtime: dict[str, JsonValue]) -> ToolMessage:
    return result.model_copy(update={"details": merge_runtime_details(result.details, runtime)})


def _keep_hook_facts(prepared: Sequence[PreparedCall], final: list[ToolMessage]) -> None:
    """Every answer of a call a ``before_tool`` hook changed says so, whatever became of the
    call (run, awaiting approval, skipped, cancelled)."""
    for index, item in enumerate(prepared):
        if item.runtime is not None:
            final[index] = _with_facts(final[index], item.runtime)


def _gate(
    prepared: Sequence[PreparedCall],
    approved: Collection[str],
    results: list[ToolMessage | None],
    approval_first: bool = False,
) -> tuple[tuple[int, ...], tuple[PreparedCall, ...]]:
    """Answer the calls that cannot run (their error) and those that wait for approval;
    return the indices of the calls that run, and the calls that wait (tuples, held while
    the calls run: see ``scheduling.wave_end``). With
    ``approval_first`` (the table ranks a pending approval above a terminal tool), terminal
    calls do not run while calls wait: the run pauses before anything could end it."""
    runnable: list[int] = []
    pending: list[PreparedCall] = []
    terminal: PreparedCall | None = None
    for index, item in enumerate(prepared):
        if results[index] is not None:  # answered by the before_tool hook
            continue
        if item.error is not None or item.tool is None:
            results[index] = error_result(item.call, item.error or "the call cannot run")
        elif item.tool.terminal and terminal is not None:
            reason = f"{terminal.call.name} is ending the run, so this call was not run."
            results[index] = skipped_result(item.call, reason)
        elif needs_approval(item, approved):
            results[index] = awaiting_approval(item.call)
            pending.append(item)
        else:
            runnable.append(index)
        if item.tool is not None and item.tool.terminal and item.error is None:
            terminal = terminal or item
    if approval_first and pending and terminal is not None:
        waiting = "calls of this turn wait for a person's approval, so this call was not run."
        for index in [i for i in runnable if prepared[i].tool.terminal]:  # type: ignore[union-attr]
            results[index] = skipped_result(prepared[index].call, waiting)
            runnable.remove(index)
    return tuple(runnable), tuple(pending)


def _end_on_terminal_tool(
    ctx: RunContext, prepared: Sequence[PreparedCall], final: list[ToolMessage]
) -> None:
    """A terminal tool's successful call ends the run: its output is the run's output, and its
    result says so (``details["runtime"]["ends_run"]``), for people and for the invariants."""
    output = ctx.config.output
    for index, (item, result) in enumerate(zip(prepared, final, strict=True)):
        if output is not None and item.call.name == output.tool_name and result.is_error:
            ctx.state.output_failures += 1
        if item.tool is not None and item.tool.terminal and result.status is ToolStatus.OK:
            request = ControlRequest(
                kind=ControlKind.TERMINAL_TOOL, text=result.content, tool_call_id=item.call.id
            )
            ctx.state.requests.append(request)
            details = merge_runtime_details(result.details, {"ends_run": True})
            final[index] = result.model_copy(update={"details": details})
            return


def _report(
    ctx: RunContext,
    turn: TurnCalls,
    prepared: Sequence[PreparedCall],
    final: Sequence[ToolMessage],
) -> None:
    """A ToolFinished for every call (and a ToolStarted for those that never started), to
    whoever listened when the turn's calls began (as their ToolStarted events did)."""
    emit, durations, attempts = turn.emit, turn.durations, turn.attempts
    if emit is None or durations is None or attempts is None:
        return
    run_id, number = ctx.state.run_id, ctx.state.turns
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
                duration_s=durations[index],
                is_error=result.status is ToolStatus.ERROR,
                output_chars=len(result.content),
                details=result.details,
                attempts=attempts[index],
            )
        )


def _count(
    ctx: RunContext,
    controlled: bool,
    prepared: Sequence[PreparedCall],
    final: Sequence[ToolMessage],
) -> None:
    """Feed the turn to the error count and to the loop detector. A turn won by a control
    tool counts neither way, nor does the typed-output tool's call: a failing result is
    counted by ``Limits.output_retries`` (``output_retries_exhausted``, stop reason
    ``invalid_output``), the one limit that speaks for typed output."""
    if not controlled:
        output = ctx.config.output
        skip = output.tool_name if output is not None and output.mode == "tool" else None
        statuses = {r.status for r in final if r.name != skip}
        if ToolStatus.OK in statuses:
            ctx.clear_failures()
        elif statuses == {ToolStatus.ERROR}:
            ctx.count_failure()
    loop, limits = ctx.state.loop, ctx.limits
    record_calls(
        loop,
        [(p.call.name, canonical_arguments(p.arguments, p.call.arguments)) for p in prepared],
        limits,
    )
    record_turn_results(loop, final, limits)
