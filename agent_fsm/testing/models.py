"""Fake models for tests and offline demos: ScriptedModel and FunctionModel.

They are products, not stubs: ``ScriptedModel`` records every request it saw, raises the
exceptions placed in its script, and says exactly which request found the script empty;
``FunctionModel`` lets a function (sync or async) decide each reply from the request.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from agent_fsm.errors import ScriptExhaustedError
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelRequest,
    ModelResponse,
    ToolCall,
    Usage,
)

__all__ = ["FunctionModel", "ScriptItem", "ScriptedModel", "call", "raw_call", "reply"]


def call(name: str, /, **arguments: Any) -> ToolCall:
    """A tool call with JSON arguments; the engine assigns its id."""
    return ToolCall(id="", name=name, arguments=json.dumps(arguments))


def raw_call(name: str, arguments: str, /, *, id: str = "") -> ToolCall:
    """A tool call whose argument text is given verbatim (for malformed JSON)."""
    return ToolCall(id=id, name=name, arguments=arguments)


def reply(
    text: str = "",
    /,
    *calls: ToolCall,
    finish_reason: FinishReason | None = None,
    usage: Usage | tuple[int, int] | None = None,
) -> ModelResponse:
    """A model reply: optional text, then tool calls.

    Args:
        text: the visible text.
        calls: tool calls, e.g. ``call("get_weather", city="Paris")``.
        finish_reason: defaults to ``tool_calls`` when there are calls, else ``stop``.
        usage: a Usage, or ``(input_tokens, output_tokens)``; None lets the engine estimate.
    """
    if finish_reason is None:
        finish_reason = FinishReason.TOOL_CALLS if calls else FinishReason.STOP
    if isinstance(usage, tuple):
        usage = Usage(input_tokens=usage[0], output_tokens=usage[1], requests=1)
    return ModelResponse(
        message=AssistantMessage(content=text, tool_calls=calls),
        finish_reason=finish_reason,
        usage=usage,
    )


ScriptItem = ModelResponse | str | BaseException
"""One scripted reply: a ModelResponse, plain text (a final answer), or an exception to raise."""


class ScriptedModel:
    """Answers requests from a fixed script, in order.

    Args:
        script: the replies; a ``str`` is a plain text reply, an exception is raised.
        name: the model name reported in events.

    The requests it received are in ``requests`` (each holds a zero-copy snapshot of the
    transcript as it was sent). Asking for more replies than the script holds raises
    ``ScriptExhaustedError`` naming the request, which ends the run in ERROR model_error.
    """

    supports_native_output = True
    """It replies whatever it was given, so it can stand in for a model that constrains its
    text to ``ModelRequest.output`` (``Agent(output_mode="native")``)."""

    def __init__(self, script: Iterable[ScriptItem], *, name: str = "scripted") -> None:
        self._script: list[ScriptItem] = list(script)
        self._name = name
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def remaining(self) -> int:
        """Replies not yet used."""
        return len(self._script) - len(self.requests)

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        index = len(self.requests) - 1
        if index >= len(self._script):
            raise ScriptExhaustedError(
                f"ScriptedModel {self._name!r} has {len(self._script)} replies but received "
                f"request {index + 1} (run {request.run_id}, turn {request.turn}); last message: "
                f"{_last_message(request)}"
            )
        item = self._script[index]
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, str):
            return reply(item)
        return item


def _last_message(request: ModelRequest) -> str:
    if not request.messages:
        return "(none)"
    last = request.messages[-1]
    text = last.content if last.content else repr(last)
    return f"{last.role}: {text[:120]}"


ReplyFunction = Callable[[ModelRequest], ModelResponse | str | Awaitable[ModelResponse | str]]


class FunctionModel:
    """A model whose every reply is decided by ``fn(request)`` (sync or async).

    ``fn`` may return a ModelResponse or plain text, and may raise to simulate failures.
    """

    supports_native_output = True
    """Its function sees ``ModelRequest.output`` and can honour it."""

    def __init__(self, fn: ReplyFunction, *, name: str = "function") -> None:
        self._fn = fn
        self._name = name
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        return self._name

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        result = self._fn(request)
        if inspect.isawaitable(result):
            result = await result
        return reply(result) if isinstance(result, str) else result
