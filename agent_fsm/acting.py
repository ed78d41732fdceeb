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
import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence

from pydantic import JsonValue

from agent_fsm.events import Event, ToolFinished, ToolRetried, ToolStarted
from agent_fsm.execution import ABANDONED_NOTE, Executed, execute
from agent_fsm.journal import CallStatus, ToolJournal, journal_key
from agent_fsm.limits import Limits
from agent_fsm.loops import canonical_arguments, record_calls, record_turn_results
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus
from agent_fsm.outputs import error_result, merge_runtime_details, skipped_result, truncate
from agent_fsm.state import ControlKind, ControlRequest, RunState
from agent_fsm.tools import PreparedCall, ToolRegistry

__all__ = ["act"]

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
_STOPPED = "the run was stopped before this call started"
_STOP_GRACE_S = 0.1
"""How long a stopped run waits for cancelled async tools to unwind before it moves on."""


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
    if sum(len(r.content) for r in results) <= budget:
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


class _Turn:
    """The execution of one turn's runnable calls; fills ``results`` by call index."""

    def __init__(
        self,
        state: RunState,
        prepared: Sequence[PreparedCall],
        limits: Limits,
        emit: Callable[[Event], None] | None,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]],
        journal: ToolJournal | None,
        interruption: Callable[[], str | None] | None,
    ) -> None:
        self.state = state
        self.prepared = prepared
        self.limits = limits
        self.emit = emit
        self.clock = clock
        self.sleep = sleep
        self.journal = journal
        self.interruption = interruption
        count = len(prepared)
        self.results: list[ToolMessage | None] = [None] * count
        self.durations = [0.0] * count
        self.attempts = [0] * count
        self.started = [False] * count
        self.open_keys: dict[int, str] = {}
        """Journal keys recorded as started and not yet finished, by call index."""
        self.halted: str | None = None
        """Why calls not yet started are skipped (steering or a stop); None to go on."""

    async def run_groups(self, groups: Sequence[Sequence[int]]) -> None:
        for group in groups:
            if len(group) == 1:
                await self.run_call(group[0])
                continue
            # A few workers share one iterator: calls start in call order, at most
            # max_parallel_tools at a time, without a semaphore per call.
            pending = iter(group)
            width = min(self.limits.max_parallel_tools, len(group))
            await asyncio.gather(*(self._worker(pending) for _ in range(width)))

    async def _worker(self, pending: Iterator[int]) -> None:
        for index in pending:
            await self.run_call(index)

    async def run_call(self, index: int) -> None:
        item = self.prepared[index]
        if self.halted is not None:
            self.results[index] = skipped_result(item.call, self.halted)
            return
        self.started[index] = True
        state, emit = self.state, self.emit
        if emit is not None:
            emit(ToolStarted(run_id=state.run_id, turn=state.turns, call=item.call))
        begun = self.clock()
        try:
            executed = await self._execute(index, item)
        except asyncio.CancelledError:
            self.cancelled(index)
            raise
        finally:
            self.durations[index] = self.clock() - begun
        self.results[index] = executed.result
        self.attempts[index] = executed.attempts
        if self.interruption is not None and self.halted is None:
            try:
                self.halted = self.interruption() or None
            except Exception:  # a broken steering hook must not break the run
                self.halted = None

    def cancelled(self, index: int) -> None:
        """Answer a call that was running when the run was stopped."""
        if self.results[index] is not None:
            return
        item = self.prepared[index]
        message = f"Tool '{item.call.name}' was cancelled because the run was stopped."
        runtime: dict[str, JsonValue] = {"cancelled": True}
        if item.tool is not None and not item.tool.is_async:
            message += ABANDONED_NOTE
            runtime["abandoned"] = True
        result = error_result(item.call, message, {"runtime": runtime})
        self.results[index] = result
        self._record_finished(index, result)

    async def _execute(self, index: int, item: PreparedCall) -> Executed:
        state, emit = self.state, self.emit
        on_retry = None
        if emit is not None:
            call = item.call

            def on_retry(attempt: int, error: str, delay: float) -> None:
                emit(
                    ToolRetried(
                        run_id=state.run_id,
                        turn=state.turns,
                        call_id=call.id,
                        name=call.name,
                        attempt=attempt,
                        error=error,
                        delay_s=delay,
                    )
                )

        if self.journal is None:
            return await execute(item, self.limits, sleep=self.sleep, on_retry=on_retry)
        replayed = self._from_journal(index, item)
        if replayed is not None:
            return replayed
        executed = await execute(item, self.limits, sleep=self.sleep, on_retry=on_retry)
        self._record_finished(index, executed.result)
        return executed

    def _from_journal(self, index: int, item: PreparedCall) -> Executed | None:
        """The answer the journal already holds for this call, or None after recording that
        the call starts now (it then must run)."""
        journal, call, tool = self.journal, item.call, item.tool
        assert journal is not None
        assert tool is not None
        key = journal_key(self.state.turns, index, call.id)
        try:
            entry = journal.lookup(key)
            if entry is not None and entry.status is CallStatus.FINISHED and entry.result:
                recorded = entry.result
                details = merge_runtime_details(recorded.details, {"replayed": True})
                return Executed(recorded.model_copy(update={"details": details}), 0)
            if entry is not None and not tool.idempotent:
                result = error_result(
                    call,
                    f"The outcome of this call to '{call.name}' is unknown: it started before "
                    "an interruption and is not re-run because the tool is not idempotent. "
                    "Check its effect before calling it again.",
                    {"runtime": {"outcome_unknown": True}},
                )
                journal.record_finished(key, result)
                return Executed(result, 0)
            journal.record_started(key, call)
        except Exception as exc:  # the store failed: never run a call the journal cannot see
            return Executed(
                error_result(
                    call,
                    f"Tool '{call.name}' was not run: its call could not be recorded "
                    f"({type(exc).__name__}: {exc}).",
                ),
                0,
            )
        self.open_keys[index] = key
        return None

    def _record_finished(self, index: int, result: ToolMessage) -> None:
        key = self.open_keys.pop(index, None)
        if key is None or self.journal is None:
            return
        # If the store fails the answer stands; a resume will call the outcome unknown.
        with contextlib.suppress(Exception):
            self.journal.record_finished(key, result)


def _groups(
    prepared: Sequence[PreparedCall], runnable: list[int], parallel: bool
) -> list[list[int]]:
    """Runnable call indices in waves: each wave runs concurrently, waves one after another.
    A sequential tool (or every call, when not ``parallel``) is a wave of its own."""
    groups: list[list[int]] = []
    current: list[int] = []
    for index in runnable:
        found = prepared[index].tool
        if not parallel or (found is not None and found.sequential):
            if current:
                groups.append(current)
                current = []
            groups.append([index])
        else:
            current.append(index)
    if current:
        groups.append(current)
    return groups


async def _run_until_stopped(turn: _Turn, groups: list[list[int]], stop: asyncio.Event) -> None:
    """Run the groups; when ``stop`` is set first, cancel what runs and skip the rest."""
    if stop.is_set():
        turn.halted = _STOPPED
        return
    work = asyncio.ensure_future(turn.run_groups(groups))
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((work, stopped), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # act itself was cancelled: take the calls down with it
        work.cancel()
        stopped.cancel()
        raise
    stopped.cancel()
    if work.done():
        work.result()
        return
    turn.halted = _STOPPED
    work.cancel()
    await asyncio.wait((work,), timeout=_STOP_GRACE_S)
    for index, started in enumerate(turn.started):
        if started:  # a tool that swallowed its cancellation, still unwinding: abandoned
            turn.cancelled(index)


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
    stop: asyncio.Event | None = None,
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

    Returns the results in call order; the caller appends them to the transcript.
    """
    state.control = None
    prepared = [registry.prepare(call) for call in calls]
    winner = _control_winner(prepared)
    turn = _Turn(state, prepared, limits, emit, clock, sleep, journal, interruption)
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
            elif item.tool.requires_approval is not False and item.tool.needs_approval(
                item.arguments or {}
            ):
                results[index] = _awaiting_approval(item.call)
                pending.append(item)
            else:
                runnable.append(index)
        if runnable:
            groups = _groups(prepared, runnable, parallel)
            if stop is None:
                await turn.run_groups(groups)
            else:
                await _run_until_stopped(turn, groups, stop)
        if pending:
            control = _approval_request(pending)
            state.control = control
            state.output = control.text
    final: list[ToolMessage] = [
        result if result is not None else skipped_result(prepared[index].call, _STOPPED)
        for index, result in enumerate(results)
    ]
    _fit_turn(final, limits)

    if emit is not None:
        run_id, number = state.run_id, state.turns
        for index, result in enumerate(final):
            if not turn.started[index]:
                emit(ToolStarted(run_id=run_id, turn=number, call=prepared[index].call))
            emit(
                ToolFinished(
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
