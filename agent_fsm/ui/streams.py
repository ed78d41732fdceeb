"""A run as a stream of AG-UI events (``/runs/{id}/events``), from one of two sources.

- ``driven``: a run this server drives, from the engine's typed events (``live.LiveRuns``,
  mapped by ``agui.AgUiStream``), replayed from the start of the drive for a late page;
- ``followed``: a run driven elsewhere (a worker, another process), from its checkpoints:
  a snapshot, then what each new save adds (messages as text and tool-call events, a
  state change as a ``STATE_DELTA``), read every ``POLL_S`` seconds.

Both end, once the run stops, with its last snapshot and ``RUN_FINISHED`` (a pause as its
interrupt) or ``RUN_ERROR``; both stop when the page goes away (``disconnected``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from agent_fsm.messages import AssistantMessage, ToolMessage
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, AgentState, StopReason
from agent_fsm.ui.agui import (
    AgUiEvent,
    AgUiStream,
    fsm_snapshot,
    interrupt,
    interrupted,
    run_error,
    sse,
    succeeded,
    text_message,
    tool_call,
    tool_result,
)
from agent_fsm.ui.live import LiveRuns
from agent_fsm.ui.runs import PAUSES, RunSource

__all__ = ["POLL_S", "THREAD", "driven", "followed"]

THREAD = "agent_fsm"
"""The AG-UI thread id of every run's stream (agent_fsm's runs are their own threads)."""
POLL_S = 0.25
"""How often a stream of a run driven elsewhere reads its checkpoint."""

StopOf = Callable[[RunState], StopReason | None]
Disconnected = Callable[[], Awaitable[bool]]


def _derived(state: RunState, seen: int) -> list[AgUiEvent]:
    """The AG-UI events of the messages a checkpoint added after the first ``seen``."""
    found: list[AgUiEvent] = []
    for number, message in enumerate(state.messages[seen:], start=seen):
        message_id = f"{state.run_id}:message:{number}"
        if isinstance(message, AssistantMessage):
            if message.content:
                found += text_message(message_id, message.content)
            for call in message.tool_calls:
                found += tool_call(call, message_id)
        elif isinstance(message, ToolMessage):
            found.append(tool_result(message_id, message.tool_call_id, message.content))
    return found


def _ending(
    stop_of: StopOf, state: RunState, thread: str = THREAD, agui_run: str | None = None
) -> list[AgUiEvent]:
    """How a stopped run's stream ends: its last snapshot, and RUN_FINISHED (an interrupt
    for a pause) or RUN_ERROR; in AG-UI thread ``thread``, as AG-UI run ``agui_run`` (the
    run's own id by default)."""
    stop = stop_of(state)
    snapshot = fsm_snapshot(
        state.run_id, str(state.state), state.turns, stop.value if stop else None
    )
    if state.state is AgentState.ERROR or stop is None:
        return [snapshot, run_error(state.error or "", stop.value if stop else "")]
    finished: AgUiEvent = {
        "type": "RUN_FINISHED",
        "threadId": thread,
        "runId": agui_run or state.run_id,
    }
    control = state.control
    if stop in PAUSES and control is not None:
        asked = interrupt(control.pause or state.run_id, stop, control.text, control.pending_calls)
        finished.update(interrupted(asked))
    else:
        finished.update(succeeded(state.output))
    return [snapshot, finished]


async def followed(
    store: RunSource, live: LiveRuns, stop_of: StopOf, disconnected: Disconnected, run_id: str
) -> AsyncIterator[str]:
    """A run driven elsewhere, from its checkpoints: a snapshot, then what each new save
    adds, until the run stops (or the page goes away)."""
    state = store.load(run_id)
    yield sse({"type": "RUN_STARTED", "threadId": THREAD, "runId": run_id})
    yield sse(fsm_snapshot(run_id, str(state.state), state.turns))
    seen, where = len(state.messages), (str(state.state), len(state.trace))
    while state.state not in TERMINAL_STATES:
        if live.driving(run_id):  # the ui took it over meanwhile (a resume)
            async for line in driven(store, live, stop_of, disconnected, run_id):
                yield line
            return
        if await disconnected():
            return
        await asyncio.sleep(POLL_S)
        state = await asyncio.to_thread(store.load, run_id)
        for event in _derived(state, seen):
            yield sse(event)
        seen = len(state.messages)
        now = (str(state.state), len(state.trace))
        if now != where:
            where = now
            yield sse(
                {
                    "type": "STATE_DELTA",
                    "delta": [
                        {"op": "replace", "path": "/fsm/state", "value": now[0]},
                        {"op": "replace", "path": "/fsm/turn", "value": state.turns},
                    ],
                }
            )
    for event in _ending(stop_of, state):
        yield sse(event)


async def driven(
    store: RunSource,
    live: LiveRuns,
    stop_of: StopOf,
    disconnected: Disconnected,
    run_id: str,
    *,
    thread: str = THREAD,
    agui_run: str | None = None,
) -> AsyncIterator[str]:
    """A run this server drives, from the engine's typed events; in AG-UI thread
    ``thread``, its boundary events as AG-UI run ``agui_run`` (an input's ``runId``; the
    run's own id by default). With ``agui_run``, the stream was opened with the drive, whose
    every event it gets (``LiveRuns.start`` keeps them from the start): the drive's own
    start gives the first snapshot. Without, a page may join late, and is first told where
    the run stands."""
    stream = AgUiStream(thread, {run_id: agui_run} if agui_run else None)
    with live.listen(run_id) as queue:
        yield sse({"type": "RUN_STARTED", "threadId": thread, "runId": agui_run or run_id})
        if agui_run is None:  # a page that may join late: where the run stands
            state = store.load(run_id)
            yield sse(fsm_snapshot(run_id, str(state.state), state.turns))
        while live.driving(run_id) or not queue.empty():
            try:
                event = await asyncio.wait_for(queue.get(), timeout=1.0)
            except TimeoutError:
                if await disconnected():
                    return
                continue
            for mapped in stream(event):
                if mapped["type"] == "RUN_STARTED":  # said once, above
                    continue
                yield sse(mapped)
            if event.kind == "run_finished":
                return
    for ending in _ending(stop_of, store.load(run_id), thread, agui_run):
        yield sse(ending)
