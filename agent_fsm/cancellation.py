"""Stopping work in flight: ``StopEvent``, set once when a run is aborted or runs out of time,
and ``StopScope``, which cancels the awaits inside it when that happens.

Why a scope in the current task rather than a task per model or tool call: the awaits of a
turn (one model call, one tool call) usually finish without ever suspending, and a task per
call would make the event loop go round for each of them for nothing. The scope costs a
callback registration, and cancels exactly like ``asyncio.timeout``: the current task is
cancelled, the scope withdraws its own cancellation on exit (``Task.uncancel``), and a
cancellation that came from anyone else still propagates.

Cancellation is cooperative. An async function that suppresses ``CancelledError`` is cancelled
again every ``regrace_s``; one that suppresses it forever keeps its run waiting, as it would
keep ``asyncio.timeout`` or ``asyncio.run`` waiting. A sync tool's thread is abandoned by
whoever awaits it (``execution.run_in_thread``), so it never holds a run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from types import TracebackType
from typing import Any

__all__ = ["REGRACE_S", "StopEvent", "StopScope"]

REGRACE_S = 0.1
"""How often a scope whose work suppressed the cancellation cancels it again."""


class StopEvent:
    """A one-way flag: once set it stays set, and each registered callback runs once, at once.

    Callbacks run synchronously inside ``set``, in registration order; one that raises does
    not prevent the others (the error is re-raised after all ran).

    The first callback is kept in a slot of its own and the others in a list made for them,
    as ``asyncio.Future`` keeps its first callback: a run registers one at a time (the scope
    of its model or tool call), so a live run holds no list here for the cyclic collector
    to look at (issue 39).
    """

    __slots__ = ("_first", "_more", "_set")

    def __init__(self) -> None:
        self._set = False
        self._first: Callable[[], None] | None = None
        """The earliest callback registered and not removed; None when there is none."""
        self._more: list[Callable[[], None]] | None = None
        """The later ones, in registration order (None until there is a second)."""

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        if self._set:
            return
        self._set = True
        first, more = self._first, self._more
        self._first = self._more = None
        if first is None:
            return
        errors: list[Exception] = []
        for callback in (first, *more) if more else (first,):
            try:
                callback()
            except Exception as exc:  # the other callbacks must still run
                errors.append(exc)
        if errors:
            raise errors[0]

    def add_callback(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the event is set (now, if it already is)."""
        if self._set:
            callback()
        elif self._first is None:
            self._first = callback
        elif self._more is None:
            self._more = [callback]
        else:
            self._more.append(callback)

    def remove_callback(self, callback: Callable[[], None]) -> None:
        """Forget ``callback``; unknown callbacks are ignored."""
        first, more = self._first, self._more
        if first is None:
            return
        if first is callback or first == callback:
            self._first = more.pop(0) if more else None  # the next one keeps its turn
        elif more:
            if more[-1] is callback:  # the usual case: the latest one, by identity
                more.pop()
            else:
                with contextlib.suppress(ValueError):
                    more.remove(callback)
        if not more:
            self._more = None


class StopScope:
    """``with StopScope(stop) as scope: await work()`` — the await is cancelled once ``stop``
    is set, and the scope absorbs that cancellation: after the block, ``scope.stopped`` tells
    whether the cancellation reached the work (which may still have finished, if it ignored
    it). Work that finishes before the stop reaches it is not stopped: its result stands.

    The cancellation is delivered from the event loop, never synchronously inside
    ``stop.set()``: code in this very task (a tool, an event handler) may set the event, and
    the task must then be stopped at its next suspension, not interrupted mid-statement.
    Only one ``StopScope`` may be active per task at a time; scopes of other kinds (a tool's
    own timeout) may nest inside it.
    """

    __slots__ = (
        "_again",
        "_base",
        "_cancels",
        "_inside",
        "_registered",
        "_stop",
        "_task",
        "stopped",
    )

    def __init__(self, stop: StopEvent) -> None:
        self._stop = stop
        self.stopped = False
        self._inside = False
        self._cancels = 0
        self._again: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._registered = False

    # Entering and leaving run twice per turn, so they touch the event's callback slot
    # directly (same module) and ask the task for its loop only when a stop arrives.

    def __enter__(self) -> StopScope:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("StopScope must be used inside a task")
        self._task = task
        self._base = task.cancelling()
        self._inside = True
        stop = self._stop
        if stop._set:
            self()
        else:  # the scope is its own callback: no bound method made, removed by identity
            if stop._first is None:  # the usual case: the run's only one
                stop._first = self
            else:
                stop.add_callback(self)
            self._registered = True
        return self

    def __call__(self) -> None:
        """The stop arrived (``StopEvent`` calls the scope): cancel the work from the loop."""
        task = self._task
        if task is not None:
            task.get_loop().call_soon(self._cancel)

    def _cancel(self) -> None:
        task = self._task
        if not self._inside or task is None:  # the work finished before the stop reached it
            return  # its result stands
        self.stopped = True
        self._cancels += 1
        task.cancel()
        self._again = task.get_loop().call_later(REGRACE_S, self._cancel)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        self._inside = False
        if self._registered:  # the event held the scope, which holds the event: let go now
            self._registered = False
            stop = self._stop
            if stop._first is self and stop._more is None:  # the usual case: the only one
                stop._first = None
            else:
                stop.remove_callback(self)
        # The task held the scope in its frame: let it go now (no cycle for the collector).
        task, self._task = self._task, None
        if not self._cancels:  # the usual case: the stop never reached the work
            return False
        assert task is not None  # a cancel came while the scope was entered
        if self._again is not None:
            self._again.cancel()
            self._again = None
        remaining = task.cancelling()
        for _ in range(self._cancels):
            remaining = task.uncancel()
        # Absorb the CancelledError only when every cancellation it carries was ours.
        return exc_type is asyncio.CancelledError and remaining <= self._base
