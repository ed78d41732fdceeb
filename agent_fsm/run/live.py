"""The runs a residence holds in this process, by id: how ``Agent.cancel`` reaches a run this
process drives, at once and from any thread.

Each keeper has a ``RunStop``: it learns the run's ``abort`` and event loop when the run is
activated (``RunKeeper.activated``) and asks for the abort on that loop
(``call_soon_threadsafe``), so a cancel from another thread, or another task, stops the run
as ``Run.abort`` does, at its next transition. A request that comes before the activation
waits for it, and is carried out as the run is activated (a new run then stops at its first
transition, before any model call). A run reopened at a stop (paused, aborted) is not
running: a request is refused until its first step leaves the stop (``left_stop``), as a
store refuses to cancel a run that stopped (``durable.queue``).

``LiveRuns`` maps run ids to the stops of the keepers alive in this process, weakly: a
``Run`` dropped without being driven to its end takes its entry with it once it is garbage
collected (until then, a cancel of it is answered as if it would be carried out).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from collections.abc import Callable

__all__ = ["LiveRuns", "RunStop"]

_STOPS_LOCK = threading.Lock()
"""Guards the fields of every ``RunStop`` (a few assignments, never held across a call): one
lock for all of them, not one per live run for the cyclic collector to look at (issue 39)."""


class RunStop:
    """How one run is stopped from outside this process's driver of it (see the module)."""

    __slots__ = (
        "__weakref__",
        "_abort",
        "_at_stop",
        "_from_stop",
        "_loop",
        "_pending",
    )

    def __init__(self, *, at_stop: bool = False) -> None:
        self._abort: Callable[[str], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: str | None = None
        self._at_stop = at_stop
        """The run was reopened at a stop and has not left it yet."""
        self._from_stop = at_stop
        """The run was reopened at a stop: its first step takes the resume row after its
        activation, and that row forgets an abort made before it."""

    def activated(self, abort: Callable[[str], None]) -> None:
        """The run's activation (from its event loop): a request that came before is
        carried out now, or (a run reopened at a stop) once the resume row is taken."""
        loop = asyncio.get_running_loop()
        with _STOPS_LOCK:
            self._abort, self._loop = abort, loop
            pending, self._pending = self._pending, None
        if pending is None:
            return
        if self._from_stop:
            loop.call_soon(abort, pending)
        else:
            abort(pending)

    def let_go(self) -> None:
        """The run's driver let it go: forget its abort. Kept, that bound method of the
        ``Run`` would make the finished run a reference cycle (``Run`` -> keeper -> this ->
        ``Run.abort``), for the cyclic collector to find."""
        with _STOPS_LOCK:
            self._abort, self._loop = None, None

    def left_stop(self) -> None:
        """The run's first step is taking it out of the stop it was reopened at."""
        with _STOPS_LOCK:
            self._at_stop = False

    def request(self, reason: str) -> bool:
        """Ask for the run's abort with ``reason``, from any thread; False when the run is
        at a stop (there is nothing to abort)."""
        with _STOPS_LOCK:
            if self._at_stop:
                return False
            abort, loop = self._abort, self._loop
            if abort is None or loop is None:
                if self._pending is None:  # the first reason stays, as in a store
                    self._pending = reason
                return True
        with contextlib.suppress(RuntimeError):  # its loop closed: the run is gone with it
            loop.call_soon_threadsafe(abort, reason)
        return True


class LiveRuns:
    """The ``RunStop`` of every run a residence's keepers hold in this process, by run id."""

    __slots__ = ("_lock", "_runs")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: weakref.WeakValueDictionary[str, RunStop] = weakref.WeakValueDictionary()

    def add(self, run_id: str, stop: RunStop) -> None:
        with self._lock:
            self._runs[run_id] = stop

    def remove(self, run_id: str, stop: RunStop) -> None:
        """Forget ``stop`` (the run let go), unless another keeper holds the run since;
        ``stop`` forgets its run (``RunStop.let_go``) in any case."""
        with self._lock:
            if self._runs.get(run_id) is stop:
                del self._runs[run_id]
        stop.let_go()

    def request(self, run_id: str, reason: str) -> bool:
        """Ask the run held here to stop (``RunStop.request``); False when no keeper here
        holds it, or it is at a stop."""
        with self._lock:
            stop = self._runs.get(run_id)
        return stop is not None and stop.request(reason)
