"""Running the calls of one turn that are cleared to run: in waves, at most
``Limits.max_parallel_tools`` at a time, through the tool journal, until steering interrupts
or the run is stopped. ``acting.py`` decides which calls run; this module runs them.

Every call ends with exactly one answer in ``TurnCalls.results``: run, replayed from the
journal, cancelled by a stop, or skipped because it never started.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any, Protocol

from pydantic import JsonValue

from agent_fsm.cancellation import StopEvent, StopScope
from agent_fsm.constructors import builder
from agent_fsm.durable.journal import (
    CallStatus,
    NotStarted,
    ToolJournal,
    journal_key,
    start_fresh,
)
from agent_fsm.events import Event, ToolRetried, ToolStarted
from agent_fsm.limits import Limits
from agent_fsm.messages import ToolCall, ToolMessage
from agent_fsm.state import RunState
from agent_fsm.tools.execution import ABANDONED_NOTE, Executed, RetryHandler, execute
from agent_fsm.tools.results import (
    error_result,
    merge_runtime_details,
    outcome_unknown,
    skipped_result,
)
from agent_fsm.tools.tool import PreparedCall

__all__ = [
    "STOPPED",
    "CallSite",
    "Review",
    "TurnCalls",
    "run_until_stopped",
    "tool_started",
    "wave_end",
]

tool_started = builder(ToolStarted)
"""Builds ToolStarted on every tool call (see constructors.builder); acting uses it too."""

STOPPED = "the run was stopped before this call started"
"""Why a call that had not started when the run was stopped was skipped."""


Review = Callable[[PreparedCall, ToolMessage], Awaitable[ToolMessage]]
"""Given the answer of a call that ran, the answer to keep (the ``after_tool`` hook, and the
facts a ``before_tool`` hook's change adds): before the journal records it, so that a replay
gives the model the very answer it saw. Must not raise, except the run's own cancellation."""


class CallSite(Protocol):
    """What running one turn's calls needs from the run (``RunContext`` provides it)."""

    @property
    def state(self) -> RunState: ...
    @property
    def limits(self) -> Limits: ...
    @property
    def journal(self) -> ToolJournal | None: ...
    @property
    def stop(self) -> StopEvent: ...
    @property
    def log(self) -> Any:
        """The run's structlog logger (run id bound)."""
        ...

    @property
    def clock(self) -> Callable[[], float]: ...
    @property
    def sleep(self) -> Callable[[float], Awaitable[None]]: ...
    def emitter(self) -> Callable[[Event], None] | None: ...
    def steered(self) -> str | None:
        """Asked after each call finishes: a reason to skip the calls not yet started."""
        ...


class TurnCalls:
    """The execution of one turn's runnable calls; fills ``results`` by call index."""

    __slots__ = (
        "attempts",
        "durations",
        "emit",
        "halted",
        "on_retry",
        "open_keys",
        "prepared",
        "results",
        "review",
        "site",
        "started",
    )

    def __init__(
        self, site: CallSite, prepared: Sequence[PreparedCall], review: Review | None = None
    ) -> None:
        self.site = site
        self.prepared = prepared
        """The calls, by index; a ``before_tool`` hook may have replaced some (new arguments)."""
        self.review = review
        self.emit = site.emitter()
        count = len(prepared)
        self.results: list[ToolMessage | None] = [None] * count
        self.started = [False] * count
        self.durations: list[float] | None = None
        self.attempts: list[int] | None = None
        """Each call's duration and attempts: what the ToolFinished events tell, so kept
        only when anyone listens (``emit``); a turn nobody watches makes no list of them."""
        if self.emit is not None:
            self.durations, self.attempts = [0.0] * count, [0] * count
        self.open_keys: dict[int, str] | None = {} if site.journal is not None else None
        """Journal keys recorded as started and not yet finished, by call index; None
        without a journal (no dict held while the calls run)."""
        self.halted: str | None = None
        """Why calls not yet started are skipped (steering or a stop); None to go on."""
        self.on_retry: RetryHandler | None = self._report_retry if self.emit is not None else None

    async def run_wave(self, group: Sequence[int]) -> None:
        """Run the calls of one wave concurrently (``waves``)."""
        # A few workers share one iterator: calls start in call order, at most
        # max_parallel_tools at a time, without a semaphore per call.
        pending = iter(group)
        width = min(self.site.limits.max_parallel_tools, len(group))
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
        site, emit = self.site, self.emit
        state = site.state
        if emit is not None:
            emit(tool_started(run_id=state.run_id, turn=state.turns, call=item.call))
        begun = site.clock()
        try:
            if site.journal is None:  # the hot path: ``_execute``, inlined
                executed = await execute(
                    item, site.limits, sleep=site.sleep, on_retry=self.on_retry
                )
                if self.review is not None and executed.attempts:
                    executed.result = await self.review(item, executed.result)
            else:
                executed = await self._journalled(index, item)
        except asyncio.CancelledError:
            self.cancelled(index)
            raise
        finally:
            if self.durations is not None:
                self.durations[index] = site.clock() - begun
        self.results[index] = executed.result
        if self.attempts is not None:
            self.attempts[index] = executed.attempts
        if executed.attempts and executed.result.is_error:
            # The model sees the error; the people who run the tool see it in the log too.
            site.log.warning(
                "tool_call_failed",
                tool=item.call.name,
                call_id=item.call.id,
                turn=state.turns,
                error=executed.result.content[:500],
            )
        if self.halted is None:
            self.halted = site.steered()

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

    def _report_retry(self, call: ToolCall, attempt: int, error: str, delay: float) -> None:
        """The retry handler while anyone listens: each retry is a ToolRetried event."""
        assert self.emit is not None
        state = self.site.state
        self.emit(
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

    async def _journalled(self, index: int, item: PreparedCall) -> Executed:
        """Run the call through the journal: answered from it when it holds the outcome,
        recorded before and after it runs otherwise."""
        replayed = self._from_journal(index, item)
        if replayed is not None:
            return replayed
        executed = await self._execute(item)
        self._record_finished(index, executed.result)
        return executed

    async def _execute(self, item: PreparedCall) -> Executed:
        """Run the call, and ``review`` its answer when it ran."""
        site = self.site
        executed = await execute(item, site.limits, sleep=site.sleep, on_retry=self.on_retry)
        review = self.review
        if review is not None and executed.attempts:
            executed.result = await review(item, executed.result)
        return executed

    def _from_journal(self, index: int, item: PreparedCall) -> Executed | None:
        """The answer the journal already holds for this call, or None after recording that
        the call starts now (it then must run)."""
        journal, call, tool = self.site.journal, item.call, item.tool
        assert journal is not None
        assert tool is not None
        key = journal_key(self.site.state.turns, index, call.id)
        try:  # a first start: never over another execution's (``start_fresh``)
            entry = start_fresh(journal, key, call)
        except NotStarted as exc:  # read: never started; and it could not be recorded
            return Executed(_not_recorded(call, exc.__cause__ or exc), 0)
        except Exception as exc:  # unread is not unrun: it may have run before a crash
            return Executed(outcome_unknown(call, f"{type(exc).__name__}: {exc}"), 0)
        open_keys = self.open_keys
        assert open_keys is not None  # made with the journal
        if entry is None:  # recorded as started: it runs now
            open_keys[index] = key
            return None
        if entry is not None and entry.status is CallStatus.FINISHED and entry.result:
            recorded = entry.result
            details = merge_runtime_details(recorded.details, {"replayed": True})
            return Executed(recorded.model_copy(update={"details": details}), 0)
        if entry is not None and not tool.idempotent:
            result = outcome_unknown(call)
            with contextlib.suppress(Exception):  # the answer stands; a resume says it again
                journal.record_finished(key, result)
            return Executed(result, 0)
        try:  # an idempotent call found started: run again, its entry replaced
            journal.record_started(key, call)
        except Exception as exc:  # the store failed: never run a call the journal cannot see
            return Executed(_not_recorded(call, exc), 0)
        open_keys[index] = key
        return None

    def _record_finished(self, index: int, result: ToolMessage) -> None:
        journal, open_keys = self.site.journal, self.open_keys
        key = open_keys.pop(index, None) if open_keys is not None else None
        if key is None or journal is None:
            return
        # If the store fails the answer stands; a resume will call the outcome unknown.
        with contextlib.suppress(Exception):
            journal.record_finished(key, result)


def _not_recorded(call: ToolCall, why: BaseException) -> ToolMessage:
    """The answer to a call that did not run because the journal could not record it."""
    return error_result(
        call,
        f"Tool '{call.name}' was not run: its call could not be recorded "
        f"({type(why).__name__}: {why}).",
    )


def wave_end(
    prepared: Sequence[PreparedCall], runnable: Sequence[int], start: int, parallel: bool
) -> int:
    """Where the wave of runnable calls that begins at ``runnable[start]`` ends (exclusive):
    the calls of one wave run concurrently, waves one after another. A sequential tool's
    call (or every call, when not ``parallel``) is a wave of its own; other calls run
    together up to the next sequential one.

    Positions, not a list of waves: nothing of the kind is held while the calls run, in
    every live run, for the cyclic collector to look at (issue 39)."""
    end = start + 1
    if parallel and not _sequential(prepared[runnable[start]]):
        while end < len(runnable) and not _sequential(prepared[runnable[end]]):
            end += 1
    return end


def _sequential(item: PreparedCall) -> bool:
    return item.tool is not None and item.tool.sequential


async def run_until_stopped(turn: TurnCalls, runnable: Sequence[int], parallel: bool) -> None:
    """Run the ``runnable`` calls in this task, wave by wave (``wave_end``); when the run's
    stop is set first, cancel what runs (answered "cancelled") and skip the rest."""
    stop = turn.site.stop
    if stop.is_set():
        turn.halted = STOPPED
        return
    with StopScope(stop) as scope:
        start = 0
        while start < len(runnable):
            end = wave_end(turn.prepared, runnable, start, parallel)
            if end == start + 1:  # a wave of one call, the usual, is awaited without a coroutine
                await turn.run_call(runnable[start])
            else:
                await turn.run_wave(runnable[start:end])
            start = end
    if scope.stopped:
        turn.halted = STOPPED
        for index, started in enumerate(turn.started):
            if started:  # answered "cancelled" unless it finished before the stop reached it
                turn.cancelled(index)
