"""One timer per event loop behind every deadline of agent_fsm: each tool call's
(``tools.execution``) and each run's (``run.residence.loop_deadline``).

Almost every call and every run finishes long before its deadline, and a timer each
(``call_later`` then ``cancel``) leaves every cancelled timer in the loop's heap until its
deadline would have come: a process of quick tool calls and short runs grows that heap by
one entry per call and per run. A timer each is also two objects (the handle and the
context it copies) held by every live run for the cyclic collector to look at (issue 39).
So a deadline only registers itself with its loop's ``Watchdog``, whose one timer is armed
for the earliest deadline it has seen: a deadline that falls after the armed time costs no
timer operation at all. When the timer fires it expires what is due and re-arms itself for
the earliest deadline still watched, if any.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
import weakref
from typing import Protocol

__all__ = ["Expiring", "Watchdog", "watchdog_for"]


class Expiring(Protocol):
    """What a watchdog watches: a time on its loop's clock, and what to do when it comes.
    Compared and hashed by identity."""

    @property
    def when(self) -> float: ...

    def expire(self) -> None:
        """The time came (called from the loop, once; then no longer watched)."""
        ...


class Watchdog:
    """The single timer behind every deadline on one event loop (see the module).

    It refers to its loop and to its timer (which refers to the loop) only weakly: it is the
    value of a registry keyed weakly by the loop, and a strong path back to the key would keep
    every event loop that ever ran a tool alive. Its timer runs in a context of its own, not
    a copy of the context of whichever task armed it: that copy would keep that task's
    context variables (a request's, a parent run's) alive until the timer fires.
    """

    __slots__ = ("_active", "_armed_for", "_context", "_loop", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._active: set[Expiring] = set()
        self._timer: weakref.ref[asyncio.TimerHandle] | None = None
        self._armed_for = math.inf
        # One per loop: a loop runs its callbacks one at a time in one thread, so this
        # context is never entered twice at once (``Context.run`` refuses that).
        self._context = contextvars.Context()

    def watch(self, deadline: Expiring, loop: asyncio.AbstractEventLoop) -> None:
        self._active.add(deadline)
        if deadline.when < self._armed_for:
            self._arm(deadline.when, loop)

    def forget(self, deadline: Expiring) -> None:
        self._active.discard(deadline)

    def _arm(self, when: float, loop: asyncio.AbstractEventLoop) -> None:
        timer = self._timer() if self._timer is not None else None
        if timer is not None:
            timer.cancel()
        self._armed_for = when
        self._timer = weakref.ref(loop.call_at(when, self._fire, context=self._context))

    def _fire(self) -> None:
        self._timer = None
        self._armed_for = math.inf
        loop = self._loop()
        assert loop is not None, "the loop is running this callback"
        now = loop.time() + _CLOCK_RESOLUTION
        for deadline in [d for d in self._active if d.when <= now]:
            self._active.discard(deadline)
            try:
                deadline.expire()
            except Exception as exc:  # the others must still expire, as with a timer each
                loop.call_exception_handler(
                    {"message": "a deadline failed to expire", "exception": exc}
                )
        if self._active:
            self._arm(min(d.when for d in self._active), loop)


_CLOCK_RESOLUTION = time.get_clock_info("monotonic").resolution
"""asyncio runs a timer up to this early (its loop clock is ``time.monotonic``)."""
_WATCHDOGS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Watchdog] = (
    weakref.WeakKeyDictionary()
)


def watchdog_for(loop: asyncio.AbstractEventLoop) -> Watchdog:
    """The watchdog of ``loop`` (made the first time a deadline on it asks)."""
    watchdog = _WATCHDOGS.get(loop)
    if watchdog is None:
        watchdog = _WATCHDOGS[loop] = Watchdog(loop)
    return watchdog
