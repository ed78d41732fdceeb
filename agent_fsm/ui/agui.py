"""The engine's typed events as AG-UI protocol events, so any AG-UI front end can follow a
run (the run page's live feed is one).

``agui_events(event)`` maps one ``agent_fsm.events`` event to the AG-UI events it stands
for, as JSON-ready dicts in AG-UI's camelCase: ``RUN_STARTED`` and ``RUN_FINISHED`` (with
AG-UI 1.0's interrupt outcome, the question or the pending calls, when the run paused for
a person: ask_user and approvals are AG-UI interrupts, answered by the next input's
``resume`` entries) or ``RUN_ERROR``; a reply's text as
``TEXT_MESSAGE_START/CONTENT/END``; each tool call as ``TOOL_CALL_START/ARGS/END`` and its
answer as ``TOOL_CALL_RESULT``; every transition as ``STATE_DELTA`` (a JSON Patch of the FSM
state: where the run is, the row taken, the turn), after one ``STATE_SNAPSHOT`` at the start.
Events AG-UI has no type for (context compaction, retries) are ``CUSTOM``. Pure: no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from agent_fsm.events import (
    Event,
    MessageUpdated,
    ModelFailed,
    ModelResponded,
    RunFinished,
    RunPaused,
    RunResumed,
    RunStarted,
    StateChanged,
    ToolFinished,
    ToolStarted,
)
from agent_fsm.messages import ToolCall
from agent_fsm.state import RunStatus
from agent_fsm.table import StopReason

__all__ = [
    "AgUiEvent",
    "AgUiStream",
    "agui_events",
    "fsm_snapshot",
    "interrupt",
    "interrupted",
    "run_error",
    "sse",
    "succeeded",
    "text_message",
    "tool_call",
    "tool_result",
]

AgUiEvent = dict[str, Any]


def fsm_snapshot(run_id: str, state: str, turn: int, stop: str | None = None) -> AgUiEvent:
    """A ``STATE_SNAPSHOT`` of the FSM state of a run."""
    return {
        "type": "STATE_SNAPSHOT",
        "snapshot": {"runId": run_id, "fsm": {"state": state, "turn": turn, "stop": stop}},
    }


def _message_id(run_id: str, turn: int) -> str:
    return f"{run_id}:reply:{turn}"


def _content(message_id: str, text: str) -> AgUiEvent:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": text}


def text_message(message_id: str, text: str) -> list[AgUiEvent]:
    """A whole reply's text as AG-UI's three text-message events."""
    return [
        {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"},
        _content(message_id, text),
        {"type": "TEXT_MESSAGE_END", "messageId": message_id},
    ]


def tool_call(call: ToolCall, parent: str) -> list[AgUiEvent]:
    """A tool call as AG-UI's start, arguments and end events."""
    return [
        {
            "type": "TOOL_CALL_START",
            "toolCallId": call.id,
            "toolCallName": call.name,
            "parentMessageId": parent,
        },
        {"type": "TOOL_CALL_ARGS", "toolCallId": call.id, "delta": call.arguments},
        {"type": "TOOL_CALL_END", "toolCallId": call.id},
    ]


def tool_result(message_id: str, call_id: str, content: str) -> AgUiEvent:
    """A tool call's answer."""
    return {
        "type": "TOOL_CALL_RESULT",
        "messageId": message_id,
        "toolCallId": call_id,
        "content": content,
        "role": "tool",
    }


def run_error(message: str, code: str) -> AgUiEvent:
    """A run that failed."""
    return {"type": "RUN_ERROR", "message": message, "code": code}


def interrupt(
    interrupt_id: str, stop: StopReason, question: str, calls: Sequence[ToolCall]
) -> dict[str, Any]:
    """What a paused run waits for, as one ``Interrupt`` of AG-UI 1.0: its ``id`` is the
    pause to answer (a resume entry's ``interruptId``), its ``reason`` the stop, its
    ``message`` the question or what awaits approval, and its ``payload`` the question and
    the calls awaiting approval."""
    pending = [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in calls]
    return {
        "id": interrupt_id,
        "reason": stop.value,
        "message": question,
        "payload": {"question": question, "pendingCalls": pending},
    }


def interrupted(asked: dict[str, Any]) -> AgUiEvent:
    """The fields of a ``RUN_FINISHED`` that ends a run at a pause: AG-UI 1.0's interrupt
    outcome, carrying the one interrupt an agent_fsm pause is."""
    return {"outcome": {"type": "interrupt", "interrupts": [asked]}}


def succeeded(result: str | None) -> AgUiEvent:
    """The fields of a ``RUN_FINISHED`` that ends a run: AG-UI 1.0's success outcome, with
    the result at the event's root."""
    return {"outcome": {"type": "success"}, "result": result}


class AgUiStream:
    """Maps one run's typed events to AG-UI events, keeping what the mapping needs to know
    across events: the pause announced before the run finished (its interrupt), and
    whether a streamed reply's text message was opened already."""

    def __init__(self, thread_id: str, run_ids: dict[str, str] | None = None) -> None:
        self.thread_id = thread_id
        self.run_ids = run_ids or {}
        """An agent_fsm run id -> the AG-UI run id its boundary events carry (an input's
        ``runId``, ``agui_input``); a run not named carries its own."""
        self._paused: RunPaused | None = None
        self._open: set[str] = set()

    def __call__(self, event: Event) -> list[AgUiEvent]:
        """The AG-UI events ``event`` stands for (none for some)."""
        return self._map(event)

    def _map(self, event: Event) -> list[AgUiEvent]:  # noqa: C901 - one branch per kind
        ids = {"threadId": self.thread_id, "runId": self.run_ids.get(event.run_id, event.run_id)}
        if isinstance(event, RunStarted):
            return [
                {"type": "RUN_STARTED", **ids, "input": event.input},
                fsm_snapshot(event.run_id, "OBSERVE", 0),
            ]
        if isinstance(event, RunResumed):
            return [
                {"type": "RUN_STARTED", **ids, "resumed": event.answered},
                fsm_snapshot(event.run_id, str(event.state), event.turn),
            ]
        if isinstance(event, StateChanged):
            return [
                {
                    "type": "STATE_DELTA",
                    "delta": [
                        {"op": "replace", "path": "/fsm/state", "value": str(event.dest)},
                        {"op": "replace", "path": "/fsm/turn", "value": event.turn},
                        {
                            "op": "add",
                            "path": "/fsm/lastTransition",
                            "value": {
                                "source": str(event.source),
                                "dest": str(event.dest),
                                "trigger": event.trigger,
                                "guards": list(event.guards),
                                "label": event.label,
                            },
                        },
                    ],
                }
            ]
        if isinstance(event, MessageUpdated):
            message_id = _message_id(event.run_id, event.turn)
            found: list[AgUiEvent] = []
            if message_id not in self._open:
                self._open.add(message_id)
                found.append(
                    {"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"}
                )
            text = event.delta.text
            if text:
                found.append(
                    {"type": "TEXT_MESSAGE_CONTENT", "messageId": message_id, "delta": text}
                )
            return found
        if isinstance(event, ModelResponded):
            message_id = _message_id(event.run_id, event.turn)
            found = []
            if message_id in self._open:
                self._open.discard(message_id)
                found.append({"type": "TEXT_MESSAGE_END", "messageId": message_id})
            elif event.text:
                found += text_message(message_id, event.text)
            found.append(
                {
                    "type": "CUSTOM",
                    "name": "usage",
                    "value": {"turn": event.turn, **event.usage.model_dump(mode="json")},
                }
            )
            return found
        if isinstance(event, ToolStarted):
            return tool_call(event.call, _message_id(event.run_id, event.turn))
        if isinstance(event, ToolFinished):
            message_id = f"{event.run_id}:result:{event.call_id}"
            return [tool_result(message_id, event.call_id, event.output)]
        if isinstance(event, RunPaused):
            self._paused = event
            return []
        if isinstance(event, RunFinished):
            return self._finished(event, ids)
        if isinstance(event, ModelFailed):
            return [{"type": "CUSTOM", "name": "model_failed", "value": {"message": event.message}}]
        return [{"type": "CUSTOM", "name": event.kind, "value": {}}]

    def _finished(self, event: RunFinished, ids: dict[str, str]) -> list[AgUiEvent]:
        snapshot = fsm_snapshot(
            event.run_id, str(event.final_state), event.turns, event.stop_reason.value
        )
        if event.status is RunStatus.FAILED:
            message = event.error or event.stop_reason.value
            return [
                snapshot,
                {"type": "RUN_ERROR", "message": message, "code": event.stop_reason.value},
            ]
        finished: AgUiEvent = {"type": "RUN_FINISHED", **ids}
        paused, self._paused = self._paused, None
        if paused is not None:
            calls = paused.pending_calls
            found = interrupt(
                paused.pause or paused.run_id, paused.stop_reason, paused.question, calls
            )
            finished.update(interrupted(found))
        else:
            finished.update(succeeded(event.output))
        return [snapshot, finished]


def agui_events(events: list[Event], thread_id: str = "agent_fsm") -> list[AgUiEvent]:
    """All the AG-UI events of ``events``, in order (one run's, or several's)."""
    stream = AgUiStream(thread_id)
    return [mapped for event in events for mapped in stream(event)]


def sse(event: AgUiEvent) -> str:
    """One event as a Server-Sent Events message (AG-UI's default transport)."""
    return f"data: {json.dumps(event, ensure_ascii=False, separators=(',', ':'))}\n\n"
