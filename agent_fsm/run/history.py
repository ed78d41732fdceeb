"""An earlier conversation as the start of a new run: checked, and repaired so that every
tool call in it has exactly one result.

A history comes from anywhere: an earlier ``RunResult``, a stored run, a chat log the
application kept, an export from another framework. Providers refuse a transcript whose tool
call has no result (or whose result names no call), so the history is repaired before the
first model call, never sent as it is:

* a call with no result gets a synthesized "interrupted" error result, placed right after
  the calls of its reply (the call may or may not have run: the result says so);
* a result that answers no open call (a stray, or a second answer) is dropped;
* system messages are dropped: the agent's own system prompt leads every run.

What was repaired is reported (``HistoryRepair``, and the ``HistoryRepaired`` event).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from agent_fsm.durable.checkpoint import MESSAGE_ADAPTER
from agent_fsm.errors import ConfigError
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    clean_message,
)
from agent_fsm.state import RunResult

__all__ = ["HistoryRepair", "INTERRUPTED", "prepare_history"]

INTERRUPTED = (
    "Interrupted: the conversation went on before this call was answered, so it may or may "
    "not have run. Call it again if its result is still needed."
)
"""The result synthesized for a call of the history that has none."""


@dataclass(frozen=True, slots=True)
class HistoryRepair:
    """What ``prepare_history`` changed."""

    answered: tuple[str, ...] = ()
    """Ids of the calls given an "interrupted" result."""
    dropped: tuple[str, ...] = ()
    """``tool_call_id`` of each result dropped because it answered no open call."""
    system_messages: int = 0
    """System messages dropped (the agent's own system prompt leads the run)."""

    def __bool__(self) -> bool:
        return bool(self.answered or self.dropped or self.system_messages)


def prepare_history(history: Sequence[Message] | RunResult) -> tuple[list[Message], HistoryRepair]:
    """The history as a valid transcript to start a run from, and what was repaired.

    Raises:
        ConfigError: ``history`` is not a sequence of transcript messages.
    """
    messages = _messages(history)
    out: list[Message] = []
    open_calls: dict[str, ToolCall] = {}
    answered: list[str] = []
    dropped: list[str] = []
    system = 0

    def close_open_calls() -> None:
        for call in open_calls.values():
            out.append(
                ToolMessage(
                    tool_call_id=call.id,
                    name=call.name,
                    content=INTERRUPTED,
                    status=ToolStatus.ERROR,
                )
            )
            answered.append(call.id)
        open_calls.clear()

    for message in messages:
        if isinstance(message, SystemMessage):
            system += 1
        elif isinstance(message, ToolMessage):
            if open_calls.pop(message.tool_call_id, None) is None:
                dropped.append(message.tool_call_id)
            else:
                out.append(message)
        else:
            close_open_calls()
            out.append(message)
            if isinstance(message, AssistantMessage):
                open_calls = {call.id: call for call in message.tool_calls}
    close_open_calls()
    return out, HistoryRepair(tuple(answered), tuple(dropped), system)


def _messages(history: Sequence[Message] | RunResult) -> list[Message]:
    if isinstance(history, RunResult):
        return list(history.messages)
    if isinstance(history, str | bytes) or not isinstance(history, Sequence):
        raise ConfigError(
            f"history must be a list of messages or a RunResult, got {type(history).__name__}"
        )
    messages: list[Message] = []
    for index, item in enumerate(history):
        try:
            message = MESSAGE_ADAPTER.validate_python(item)
        except ValidationError as exc:
            raise ConfigError(
                f"history[{index}] is not a transcript message: {exc.errors()[0]['msg']}"
            ) from None
        messages.append(clean_message(message))
    return messages
