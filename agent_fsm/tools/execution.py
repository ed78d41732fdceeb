"""Running one prepared tool call: the timeout, the worker thread, retries, the output.

Must not raise for anything a tool does: an exception, a timeout, a return value with no JSON
form each become an error result. The one exception that passes through is cancellation
(``asyncio.CancelledError``), which belongs to whoever cancelled the call.

Sync tools run on daemon threads from a small pool of our own, never on the event loop's
default executor: ``asyncio.run`` waits for that executor's threads when it shuts down, so a
sync tool that ignores its timeout would hang the caller's exit. A thread that outlives its
timeout is abandoned: its result, if it ever comes, is discarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import queue
import random
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

from agent_fsm.content import ContentPart
from agent_fsm.failures import describe, failure_traceback, is_own_failure
from agent_fsm.limits import Limits
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus, clean_message
from agent_fsm.records import fields_set, give_fields_set
from agent_fsm.tools.results import (
    PART_CARRIERS,
    ToolResult,
    error_result,
    merge_runtime_details,
    serialise_output,
    split_parts,
    truncate,
)
from agent_fsm.tools.tool import PreparedCall, Tool
from agent_fsm.watchdog import watchdog_for

__all__ = ["ABANDONED_NOTE", "Executed", "RetryHandler", "execute", "retry_delay", "run_in_thread"]

TRACEBACK_CHARS = 4000
"""How much of a failed tool's traceback its details keep (the end: where it raised)."""

RetryHandler = Callable[[ToolCall, int, str, float], None]
"""Told ``(call, failed attempt, error text, delay before the next one)`` before each retry
(the call is passed so that one handler serves every call, with no closure per call)."""

ABANDONED_NOTE = (
    " It runs in a worker thread that cannot be stopped, so it was abandoned: it may still "
    "finish in the background, and its result will be discarded."
)


class _DaemonThreads:
    """A pool of daemon threads that grows on demand and shrinks when idle.

    ``idle`` counts waiting workers minus queued jobs; it never goes negative, so every job
    has a worker. Daemon threads are never joined: interpreter exit does not wait for them.
    """

    def __init__(self, idle_s: float = 30.0) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._idle_s = idle_s

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._jobs.put(job)
            if self._idle:
                self._idle -= 1
                return
        threading.Thread(target=self._work, name="agent_fsm-tool", daemon=True).start()

    def _work(self) -> None:
        while True:
            try:
                job = self._jobs.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    if self._jobs.empty():
                        self._idle -= 1
                        return
                continue
            job()
            with self._lock:
                self._idle += 1


_THREADS = _DaemonThreads()
_tool_message = ToolMessage.__pydantic_validator__.validate_python  # (_answer: every call)
_ANSWER_FIELDS = fields_set("tool_call_id", "name", "content")  # the fields it gives


def _deliver(future: asyncio.Future[Any], value: Any, error: BaseException | None) -> None:
    if future.done():  # timed out or cancelled meanwhile: the result is discarded
        return
    if error is None:
        future.set_result(value)
    else:
        future.set_exception(error)


class _CarriedOut(Exception):
    """A ``BaseException`` a sync tool raised on its worker thread, carried to the loop as an
    ordinary failure (``original`` is what the tool raised)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(describe(original))
        self.original = original


def run_in_thread(fn: Callable[..., Any], kwargs: dict[str, Any]) -> asyncio.Future[Any]:
    """Run ``fn(**kwargs)`` on a daemon worker thread, in a copy of the current context.

    Cancelling the returned future abandons the call; it never blocks the loop or its exit.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def job() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            value = context.run(fn, **kwargs)
        except StopIteration as exc:  # a future cannot hold StopIteration
            error = RuntimeError(f"StopIteration: {exc}")
        except Exception as exc:
            error = exc
        except BaseException as exc:
            # The tool's own SystemExit, KeyboardInterrupt (raised on this thread, so never
            # the person's Ctrl-C) or CancelledError: awaited as they are, asyncio would
            # carry them out of the event loop.
            error = _CarriedOut(exc)
        # A closed loop raises RuntimeError: nobody waits for this result any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_deliver, future, value, error)

    _THREADS.submit(job)
    return future


def retry_delay(attempt: int, limits: Limits, jitter: Callable[[], float] = random.random) -> float:
    """Exponential backoff with jitter before retry number ``attempt`` (1-based): half to all
    of ``retry_backoff_s * 2**(attempt-1)``, capped at ``retry_backoff_max_s``.

    ``jitter`` gives a number in [0, 1): the model's retries pass the run's own
    (``RunConfig.random``); a tool's retries use the module's, drawn inside the call, whose
    answer records each delay (a durable runner records the whole call as one step)."""
    delay = min(limits.retry_backoff_max_s, limits.retry_backoff_s * 2.0 ** (attempt - 1))
    return delay * (0.5 + jitter() / 2)


class _Deadline:
    """A timeout for one await in the current task, as ``asyncio.timeout`` gives, at a
    fraction of its cost (it is on every tool call; see ``agent_fsm.watchdog``).

    When it expires it cancels the task; ``finish`` stops watching and, if it expired,
    withdraws that cancellation, telling whether it was the only one (a caller's own
    cancellation must still propagate), as ``asyncio.timeout`` does.
    """

    __slots__ = ("_base", "_task", "_watchdog", "expired", "when")

    def __init__(self, seconds: float) -> None:
        task = asyncio.current_task()
        assert task is not None, "tools run inside a task"
        loop = task.get_loop()
        self._task = task
        self._base = task.cancelling()
        self.expired = False
        self.when = loop.time() + seconds
        self._watchdog = watchdog = watchdog_for(loop)
        watchdog.watch(self, loop)

    def expire(self) -> None:
        self.expired = True
        self._task.cancel()

    def finish(self) -> bool:
        """Stop watching; True when it expired and no one else cancelled the task."""
        self._watchdog.forget(self)
        return self.expired and self._task.uncancel() <= self._base


@dataclass(slots=True)
class Executed:
    """A call's answer and how many attempts it took (0 when it never ran)."""

    result: ToolMessage
    attempts: int


async def execute(
    prepared: PreparedCall,
    limits: Limits,
    *,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    on_retry: RetryHandler | None = None,
) -> Executed:
    """Run a prepared call (retrying an idempotent tool on transient errors) and answer it.

    Must not raise, except ``asyncio.CancelledError`` when the caller cancels.
    """
    call, tool = prepared.call, prepared.tool
    if prepared.error is not None or tool is None:
        return Executed(error_result(call, prepared.error or "the call cannot run"), 0)
    values = prepared.values if prepared.values is not None else prepared.arguments or {}
    timeout_s = tool.timeout_s or limits.tool_timeout_s
    retries = 0
    if tool.idempotent:
        retries = limits.tool_max_retries if tool.max_retries is None else tool.max_retries
    history: tuple[JsonValue, ...] = ()  # a tuple: the usual call, never retried, makes no list
    abandoned = False  # an attempt's worker thread was abandoned (its answer says so)
    attempt = 0
    fn = tool.fn
    assert fn is not None
    while True:
        attempt += 1
        # One attempt, within ``timeout_s``, awaited here rather than in a coroutine of its
        # own: a coroutine per call is one more object the cyclic collector looks at while
        # the tool runs, in every live run (issue 39).
        deadline = _Deadline(timeout_s)
        try:
            if tool.receives_call:
                value = await fn(call, **values)
            else:
                value = await fn(**values) if tool.is_async else await run_in_thread(fn, values)
        except BaseException as exc:
            expired = deadline.finish()
            if not expired and not is_own_failure(exc):
                raise  # the run's own cancellation (abort, its deadline), or a KeyboardInterrupt
            outcome = _failure(call, tool, exc, expired, timeout_s)
            abandoned = abandoned or outcome.abandoned
        else:
            deadline.finish()
            break
        if attempt <= retries and isinstance(outcome.failure, tool.retry_on):
            delay = retry_delay(attempt, limits)
            history += ({"attempt": attempt, "error": outcome.message, "delay_s": delay},)
            if on_retry is not None:
                on_retry(call, attempt, outcome.message, delay)
            await sleep(delay)
            continue
        runtime = _runtime(abandoned, attempt, history)
        return Executed(_failed(call, outcome, attempt, history, runtime, timeout_s), attempt)
    runtime = _runtime(abandoned, attempt, history)
    return Executed(_answer(call, tool, value, limits, runtime), attempt)


def _runtime(
    abandoned: bool, attempts: int, history: tuple[JsonValue, ...]
) -> dict[str, JsonValue]:
    """The facts of the attempts for the answer's details (``runtime``), the answer adding
    its own: made once the attempts are over, so that no dict is held while the tool runs,
    in every live run (issue 39)."""
    runtime: dict[str, JsonValue] = {"abandoned": True} if abandoned else {}
    if history:
        runtime.update(attempts=attempts, retries=list(history))
    return runtime


@dataclass(slots=True)
class _Outcome:
    """A failed attempt: the failure and how it reads."""

    failure: BaseException
    message: str
    expired: bool = False
    """The attempt ran past its timeout."""
    traceback: str | None = None
    """Where the tool raised, for the people who run it (never shown to the model)."""
    abandoned: bool = False
    """The attempt of a sync tool ran past its timeout: its worker thread was abandoned."""


def _failure(
    call: ToolCall,
    tool: Tool,
    exc: BaseException,
    expired: bool,
    timeout_s: float,
) -> _Outcome:
    """How an attempt that raised ``exc`` (the tool's own failure) failed; a failure after
    the deadline expired (``expired``) counts as a timeout (the tool may have turned our
    cancellation into an error of its own)."""
    if expired:
        return _timed_out(call, tool, timeout_s)
    failure = exc.original if isinstance(exc, _CarriedOut) else exc
    message = f"Tool '{call.name}' failed: {describe(failure)}"
    where = failure_traceback(failure)[-TRACEBACK_CHARS:]
    return _Outcome(failure=failure, message=message, traceback=where)


def _timed_out(call: ToolCall, tool: Tool, timeout_s: float) -> _Outcome:
    message = f"Tool '{call.name}' timed out after {timeout_s:g} s."
    abandoned = not tool.is_async
    if abandoned:
        message += ABANDONED_NOTE
    return _Outcome(
        failure=TimeoutError(message), message=message, expired=True, abandoned=abandoned
    )


def _failed(
    call: ToolCall,
    outcome: _Outcome,
    attempts: int,
    history: tuple[JsonValue, ...],
    runtime: dict[str, JsonValue],
    timeout_s: float,
) -> ToolMessage:
    """The error answer of a call that failed for good, with its retries in the details
    (``runtime``: ``_runtime``'s facts)."""
    message = outcome.message
    if history:
        message += f" (gave up after {attempts} attempts)"
    if outcome.expired:
        runtime["timed_out_after_s"] = timeout_s
    if outcome.traceback is not None:
        runtime["traceback"] = outcome.traceback
    return error_result(call, message, merge_runtime_details(None, runtime))


def _answer(
    call: ToolCall, tool: Tool, value: Any, limits: Limits, runtime: dict[str, JsonValue]
) -> ToolMessage:
    """The message for a value the tool returned, cut to the tool's output limit."""
    details: JsonValue = None
    status = ToolStatus.OK
    parts: tuple[ContentPart, ...] = ()
    try:
        if isinstance(value, ToolResult):
            output, details, parts = value.output, value.details, value.parts
            if value.is_error:
                status = ToolStatus.ERROR
        elif isinstance(value, PART_CARRIERS) and (split := split_parts(value)) is not None:
            output, parts = split
        else:
            output = serialise_output(value)
    except (TypeError, ValueError) as exc:
        return error_result(
            call,
            f"Tool '{call.name}' returned a value that cannot be sent to the model "
            f"({type(value).__name__}: {exc}).",
            merge_runtime_details(None, runtime),
        )
    limit = tool.max_output_chars or limits.tool_max_output_chars
    if len(output) > limit:
        runtime["original_chars"] = len(output)
        runtime["shown_chars"] = limit
        output = truncate(output, limit, call.name)
    details = merge_runtime_details(details, runtime)
    if status is ToolStatus.OK and details is None:
        # Only the fields that differ from their defaults (the fields set a transcript shares,
        # ``records.share_fields_sets``), validated from a dict: the keyword call of
        # BaseModel.__init__ costs a quarter more, on every tool call.
        message: ToolMessage = _tool_message(
            {"tool_call_id": call.id, "name": call.name, "content": output}
        )
        give_fields_set(message, _ANSWER_FIELDS)
    else:
        message = ToolMessage(
            tool_call_id=call.id, name=call.name, content=output, status=status, details=details
        )
    if parts:
        message = message.model_copy(update={"parts": parts})
    return clean_message(message)
