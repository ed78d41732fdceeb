"""AG-UI's ``RunAgentInput`` read, checked and turned into what the ui does with it: start a
run, or resume a paused one (``POST /agui``, ``app``).

An AG-UI thread is an agent_fsm run: ``threadId`` is the run's id, and each input to it
(each AG-UI run, ``runId``) drives it once, until it stops. So:

- a thread the store does not hold starts a run under that id, with the last ``user``
  message as its input and the messages before it as its history (``Agent.start``);
- a thread whose run stopped is resumed (``Agent.reopen``): a pause on ask_user with the
  answer of the interrupt's resume entry (a string, or ``{"answer": ...}``), else the last
  user message; a pause on approvals with the entry's decisions (``true``/``false`` for
  every pending call, or ``{"decisions": {call_id: bool | {"allow", "reason",
  "arguments"}}}``; ``"cancelled"`` denies them all); any other stop with the last user
  message as extra input, when the table lets it go on.

Pure: ``read_input`` parses and validates the body, ``plan`` decides from the input and the
stored run. Whatever does not fit raises ``InputError`` with the HTTP status and a message
saying what to change: the store is not touched, so a bad input loses nothing. Nothing in
the input is executed: AG-UI front-end ``tools`` (tools the client would run) are refused,
``state``, ``context`` and ``forwardedProps`` are accepted and not read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter, ValidationError

from agent_fsm.messages import Message
from agent_fsm.state import Approval, ControlKind, RunState
from agent_fsm.table import TERMINAL_STATES

__all__ = ["InputError", "Resume", "RunInput", "Start", "plan", "read_input"]

MAX_BODY = 1_000_000
"""The largest input read, in bytes."""


class InputError(Exception):
    """An input the ui cannot act on: ``status`` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Loose(BaseModel):
    """AG-UI objects may carry fields this version does not know: they are ignored."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class _Function(_Loose):
    name: str
    arguments: str = "{}"


class _ToolCall(_Loose):
    id: str
    type: Literal["function"] = "function"
    function: _Function


class AgUiMessage(_Loose):
    """One message of the thread, as AG-UI sends it."""

    id: str
    role: Literal["user", "assistant", "system", "developer", "tool", "reasoning", "activity"]
    content: JsonValue = None
    """Text; AG-UI also allows a list of parts (text, images...), of which the text is read."""
    toolCalls: list[_ToolCall] = Field(default_factory=list)
    toolCallId: str | None = None


class ResumeEntry(_Loose):
    """The answer to one interrupt of the run this input continues."""

    interruptId: str
    status: Literal["resolved", "cancelled"] = "resolved"
    payload: JsonValue = None


class RunInput(_Loose):
    """AG-UI's ``RunAgentInput``."""

    threadId: str = Field(min_length=1)
    runId: str = Field(min_length=1)
    parentRunId: str | None = None
    state: JsonValue = None
    messages: list[AgUiMessage] = Field(default_factory=list)
    tools: list[dict[str, JsonValue]] = Field(default_factory=list)
    context: list[JsonValue] = Field(default_factory=list)
    forwardedProps: JsonValue = None
    resume: list[ResumeEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Start:
    """Start run ``run_id`` on ``user_input``, after ``history`` (transcript messages)."""

    run_id: str
    user_input: str
    history: list[Message] | None


@dataclass(frozen=True, slots=True)
class Resume:
    """Reopen run ``run_id`` with this answer (``Agent.reopen``'s arguments)."""

    run_id: str
    reply: str | None
    approvals: dict[str, bool | Approval] | bool | None
    pause: str | None


def read_input(body: bytes, content_type: str | None) -> RunInput:
    """The input in ``body``.

    Raises:
        InputError: 413 too large, 415 not JSON, 400 JSON that does not parse, 422 JSON
            that is no ``RunAgentInput`` (naming the fields), or one with front-end tools.
    """
    if len(body) > MAX_BODY:
        raise InputError(413, f"the input is larger than {MAX_BODY:,} bytes")
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise InputError(415, "send the RunAgentInput as JSON (Content-Type: application/json)")
    try:
        decoded = json.loads(body)
    except ValueError as exc:  # UnicodeDecodeError included
        raise InputError(400, f"the input is not JSON: {exc}") from None
    try:
        found = RunInput.model_validate(decoded)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or 'the input'}: {error['msg']}"
            for error in exc.errors()[:5]
        )
        raise InputError(422, f"not an AG-UI RunAgentInput: {problems}") from None
    if found.tools:
        names = ", ".join(str(tool.get("name", "?")) for tool in found.tools[:5])
        raise InputError(
            422,
            f"front-end tools are not offered to this agent ({names}): it runs its own tools;"
            " send tools: []",
        )
    return found


def plan(given: RunInput, stored: RunState | None, *, driving: bool) -> Start | Resume:
    """What to do with ``given``: its thread's run is ``stored`` (None: no such run), which
    this server drives now when ``driving``.

    Raises:
        InputError: 409 for a run going on (here or elsewhere), 422 for an input that does
            not answer the run's pause.
    """
    run_id = given.threadId
    if stored is None:
        user_input, history = _opening(given.messages)
        return Start(run_id, user_input, history)
    if driving or stored.state not in TERMINAL_STATES:
        raise InputError(
            409, f"run {run_id} is going on: follow it at /runs/{run_id}/events, or wait"
        )
    control = stored.control
    entry = _entry(given.resume, control.pause if control is not None else None, run_id)
    if control is not None and control.waits_for is ControlKind.APPROVAL:
        if entry is None:
            raise InputError(
                422,
                f"run {run_id} waits for approvals: answer interrupt {control.pause!r} in"
                " resume with true/false or {'decisions': {call_id: ...}}",
            )
        return Resume(run_id, None, _decisions(entry), control.pause or None)
    pause = control.pause if control is not None else None
    reply: str | None
    if entry is not None:
        if entry.status == "cancelled":
            raise InputError(422, f"run {run_id} asked a question: answer it, or abort the run")
        reply = _answer(entry.payload)
    else:
        reply = _last_user_text(given.messages)
        if reply is None and control is not None:
            raise InputError(
                422, f"run {run_id} asked a question: send the answer as a user message"
            )
    return Resume(run_id, reply, None, pause or None)


def _entry(entries: list[ResumeEntry], pause: str | None, run_id: str) -> ResumeEntry | None:
    if not entries:
        return None
    for entry in entries:
        if entry.interruptId != pause:
            raise InputError(
                422,
                f"interrupt {entry.interruptId!r} is not what run {run_id} waits for"
                + (f" (it waits on {pause!r})" if pause else " (it waits on none)"),
            )
    return entries[-1]


def _decisions(entry: ResumeEntry) -> dict[str, bool | Approval] | bool:
    if entry.status == "cancelled":
        return False
    payload = entry.payload
    if isinstance(payload, bool):
        return payload
    if isinstance(payload, dict) and isinstance(payload.get("approved"), bool):
        return bool(payload["approved"])
    if not isinstance(payload, dict) or not isinstance(payload.get("decisions"), dict):
        raise InputError(
            422, "an approval's resume payload is true, false or {'decisions': {call_id: ...}}"
        )
    decisions = payload["decisions"]
    assert isinstance(decisions, dict)
    decided: dict[str, bool | Approval] = {}
    for call_id, decision in decisions.items():
        if isinstance(decision, bool):
            decided[call_id] = decision
            continue
        try:
            decided[call_id] = Approval.model_validate(decision)
        except ValidationError as exc:
            problem = exc.errors()[0]["msg"]
            raise InputError(422, f"the decision for {call_id} is not one: {problem}") from None
    return decided


def _answer(payload: JsonValue) -> str:
    if isinstance(payload, str):
        return payload
    if isinstance(payload, dict) and isinstance(payload.get("answer"), str):
        return str(payload["answer"])
    raise InputError(422, "an ask_user's resume payload is the answer: a string or {'answer': ...}")


def _text(content: JsonValue) -> str | None:
    """A message's text: its content, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
            if isinstance(part.get("text"), str)
        ]
        return "\n".join(str(part) for part in parts) if parts else None
    return None


def _last_user_text(messages: list[AgUiMessage]) -> str | None:
    for message in reversed(messages):
        if message.role == "user":
            return _text(message.content)
    return None


def _opening(messages: list[AgUiMessage]) -> tuple[str, list[Message] | None]:
    """A new run's input (the last user message's text) and history (what came before,
    as transcript messages)."""
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "user"), None)
    text = None if last is None else _text(messages[last].content)
    if last is None or not text:
        raise InputError(422, "a new thread needs a user message with text to start from")
    names: dict[str, str] = {}
    history: list[dict[str, Any]] = []
    for message in messages[:last]:
        content = _text(message.content) or ""
        if message.role == "user":
            history.append({"role": "user", "content": content})
        elif message.role == "assistant":
            calls = [
                {"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                for c in message.toolCalls
            ]
            names.update((c["id"], c["name"]) for c in calls)
            history.append({"role": "assistant", "content": content, "tool_calls": calls})
        elif message.role == "tool" and message.toolCallId is not None:
            history.append(
                {
                    "role": "tool",
                    "tool_call_id": message.toolCallId,
                    "name": names.get(message.toolCallId, "unknown"),
                    "content": content,
                }
            )
        # system and developer messages: the agent's own prompt stands; reasoning and
        # activity messages are the front end's
    try:
        return text, _HISTORY.validate_python(history) or None
    except ValidationError as exc:
        raise InputError(422, f"the thread's messages are no transcript: {exc}") from None


_HISTORY: TypeAdapter[list[Message]] = TypeAdapter(list[Message])
