"""Runs the ui drives, and who listens to them: the typed events of a run the ui resumed go
to every open event stream of that run, in the server's event loop.

An ``Agent`` subscribes ``LiveRuns.publish``; a stream ``listen``s to one run and gets each
of its events on an ``asyncio.Queue``. ``publish`` may be called from any thread (a sync
tool's worker), so it hands each event to the loop (``call_soon_threadsafe``). A run the ui
did not start is followed from its store instead (``app``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from agent_fsm.events import Event
from agent_fsm.state import RunResult

__all__ = ["LiveRuns"]


class LiveRuns:
    """The runs this server drives (their tasks) and the queues listening to them."""

    def __init__(self, keep: int = 2000) -> None:
        self.tasks: dict[str, asyncio.Task[RunResult]] = {}
        self._queues: dict[str, set[asyncio.Queue[Event]]] = {}
        self._history: dict[str, deque[Event]] = {}
        self._keep = keep
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop the server runs in: events are delivered there."""
        self._loop = loop

    def publish(self, event: Event) -> None:
        """An event handler (``Agent.subscribe``): must not raise."""
        if self._loop is not None and event.run_id in self._history:
            self._loop.call_soon_threadsafe(self._deliver, event)

    def _deliver(self, event: Event) -> None:
        """In the loop: keep the event for later listeners, and hand it to the present."""
        history = self._history.get(event.run_id)
        if history is not None:
            history.append(event)
        for queue in self._queues.get(event.run_id, ()):
            queue.put_nowait(event)

    def driving(self, run_id: str) -> bool:
        """This server drives ``run_id`` now."""
        task = self.tasks.get(run_id)
        return task is not None and not task.done()

    @contextmanager
    def listen(self, run_id: str) -> Iterator[asyncio.Queue[Event]]:
        """A queue of ``run_id``'s events while the block runs, from the start of this
        server's drive of it: a page that opens after the run went on misses nothing."""
        queue: asyncio.Queue[Event] = asyncio.Queue()
        for event in self._history.get(run_id, ()):
            queue.put_nowait(event)
        self._queues.setdefault(run_id, set()).add(queue)
        try:
            yield queue
        finally:
            listeners = self._queues.get(run_id, set())
            listeners.discard(queue)
            if not listeners:
                self._queues.pop(run_id, None)

    def start(self, run_id: str, task: asyncio.Task[RunResult]) -> None:
        """Keep the task of a run this server now drives."""
        self.tasks = {key: t for key, t in self.tasks.items() if not t.done()}
        self._history = {key: h for key, h in self._history.items() if key in self.tasks}
        self.tasks[run_id] = task
        self._history[run_id] = deque(maxlen=self._keep)

    async def stop_all(self, cancel: Callable[[str], object]) -> None:
        """Stop every run still driven (server shutdown) with ``cancel`` (``Agent.cancel``:
        the run ends ERROR aborted, resumable, its transcript valid), and wait for them."""
        pending = [(run_id, t) for run_id, t in self.tasks.items() if not t.done()]
        for run_id, _ in pending:
            try:
                cancel(run_id)
            except Exception:  # the run stopped meanwhile: nothing to cancel
                continue
        if pending:
            await asyncio.gather(*(task for _, task in pending), return_exceptions=True)
