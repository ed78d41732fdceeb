"""An earlier conversation as the start of a new run: checked, and repaired so that every
tool call in it has exactly one result, and every id names one call.

A history comes from anywhere: an earlier ``RunResult``, a stored run, a chat log the
application kept, an export from another framework. Providers refuse a transcript whose tool
call has no result (or whose result names no call), OpenAI refuses an empty call id, and
Gemini pairs a result with its call by the tool's name; so the history is repaired before the
first model call, never sent as it is:

* a call whose id is empty, or already taken by an earlier call of the history (two calls
  ``"a"`` in one reply), gets a new id, as a model's calls do (``run.thinking.with_call_ids``);
  its result is renamed with it;
* a result answers the first open call of the reply before it with the id it names (the one
  of the same tool first, when several share the id); one that names another tool than the
  call it answers gets the call's name; the results of a reply follow it in call order;
* a call with no result gets a synthesized "interrupted" error result, placed right after
  the calls of its reply (the call may or may not have run: the result says so);
* a result that answers no open call (a stray, or a second answer) is dropped;
* system messages are dropped: the agent's own system prompt leads every run.

What was repaired is reported (``HistoryRepair``, and the ``HistoryRepaired`` event).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

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
    ids: tuple[tuple[str, str], ...] = field(default=())
    """``(old, new)`` for each call given a new id (an empty one, or one taken)."""
    names: tuple[str, ...] = ()
    """Ids of the calls whose result named another tool: it now names the call's."""

    def __bool__(self) -> bool:
        return bool(self.answered or self.dropped or self.system_messages or self.ids or self.names)


@dataclass(slots=True)
class _Open:
    """A call of the last reply, and its result once one is found."""

    call: ToolCall
    given: str
    """The id the history gave it (its results name this one)."""
    result: ToolMessage | None = None


class _Repair:
    """The walk over the history, one message at a time."""

    def __init__(self) -> None:
        self.out: list[Message] = []
        self.open: list[_Open] = []
        self.taken: set[str] = set()
        self.answered: list[str] = []
        self.dropped: list[str] = []
        self.ids: list[tuple[str, str]] = []
        self.names: list[str] = []
        self.system = 0

    def take(self, message: Message) -> None:
        if isinstance(message, SystemMessage):
            self.system += 1
        elif isinstance(message, ToolMessage):
            self._result(message)
        else:
            self.close_open_calls()
            if isinstance(message, AssistantMessage) and message.tool_calls:
                message = self._reply(message)
            self.out.append(message)

    def _reply(self, message: AssistantMessage) -> AssistantMessage:
        """The reply with every call's id non-empty and unique in the history."""
        calls: list[ToolCall] = []
        for index, call in enumerate(message.tool_calls):
            given = call.id
            if not given or given in self.taken:
                new = f"call_h{len(self.out)}_{index}"
                attempt = 0
                while new in self.taken:
                    attempt += 1
                    new = f"call_h{len(self.out)}_{index}_{attempt}"
                self.ids.append((given, new))
                call = call.model_copy(update={"id": new})
            self.taken.add(call.id)
            self.open.append(_Open(call, given))
            calls.append(call)
        if all(new is old for new, old in zip(calls, message.tool_calls, strict=True)):
            return message
        return message.model_copy(update={"tool_calls": tuple(calls)})

    def _result(self, message: ToolMessage) -> None:
        """Answer the open call this result names (its tool's first), or drop it."""
        named = [
            item for item in self.open if item.result is None and item.given == message.tool_call_id
        ]
        if not named:
            self.dropped.append(message.tool_call_id)
            return
        item = next((i for i in named if i.call.name == message.name), named[0])
        update: dict[str, str] = {}
        if item.call.id != message.tool_call_id:
            update["tool_call_id"] = item.call.id
        if item.call.name != message.name:
            update["name"] = item.call.name
            self.names.append(item.call.id)
        item.result = message.model_copy(update=update) if update else message

    def close_open_calls(self) -> None:
        """The results of the last reply's calls, in call order; an "interrupted" one for
        each call the history did not answer."""
        for item in self.open:
            call = item.call
            if item.result is None:
                item.result = ToolMessage(
                    tool_call_id=call.id,
                    name=call.name,
                    content=INTERRUPTED,
                    status=ToolStatus.ERROR,
                )
                self.answered.append(call.id)
            self.out.append(item.result)
        self.open.clear()

    def repair(self) -> HistoryRepair:
        return HistoryRepair(
            tuple(self.answered),
            tuple(self.dropped),
            self.system,
            tuple(self.ids),
            tuple(self.names),
        )


def prepare_history(history: Sequence[Message] | RunResult) -> tuple[list[Message], HistoryRepair]:
    """The history as a valid transcript to start a run from, and what was repaired.

    Raises:
        ConfigError: ``history`` is not a sequence of transcript messages.
    """
    walk = _Repair()
    for message in _messages(history):
        walk.take(message)
    walk.close_open_calls()
    return walk.out, walk.repair()


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
