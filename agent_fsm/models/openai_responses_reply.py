"""Assembling OpenAI Responses API replies into ``ModelResponse``s, whole or streamed.

Like ``openai_responses_convert``, it never imports ``openai``: it reads the SDK's objects by
attribute name, which is also why it accepts a plain ``dict`` wherever the SDK would hand over
a model. One ``ReplyAssembler`` serves both paths (a whole ``Response``, or the typed events
of a stream, whose terminal event carries the same ``Response``), so a streamed reply and the
same reply in one piece become the *same* ``ModelResponse``. The finish-reason table is in
``openai_responses``' module docstring.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelResponse,
    ReplyDelta,
    ToolCall,
    Usage,
)
from agent_fsm.models.adapter import ReplyReader
from agent_fsm.models.base import ModelCallError
from agent_fsm.models.common import field_of, malformed, optional_str
from agent_fsm.models.openai_responses_convert import PROVIDER_KEY, REASONING_FIELDS
from agent_fsm.models.openai_schema import without_strict_nulls

__all__ = [
    "ReplyAssembler",
    "TRANSIENT_ERROR_CODES",
    "error_failure",
    "finish_reason_from",
    "unreadable",
    "usage_from",
]

TRANSIENT_ERROR_CODES = frozenset({"server_error", "rate_limit_exceeded", "vector_store_timeout"})
"""``response.error.code`` values worth retrying; every other code names a problem with the
request or its content (``invalid_prompt``, ``insufficient_quota``, image errors, policies)."""


def finish_reason_from(
    status: object, incomplete_reason: object, *, has_calls: bool, refused: bool
) -> FinishReason:
    """Map a finished response's ``status`` and ``incomplete_details.reason`` (see the table in
    the module docstring). ``failed`` and ``cancelled`` never get here: they are errors."""
    if status == "incomplete":
        if incomplete_reason == "content_filter":
            return FinishReason.CONTENT_FILTER
        return FinishReason.LENGTH
    if has_calls:
        return FinishReason.TOOL_CALLS
    return FinishReason.REFUSAL if refused else FinishReason.STOP


def error_failure(code: object, message: object, *, where: str) -> ModelCallError:
    """The ModelCallError for a response the server failed (``response.error``, an ``error``
    stream event): transient for ``TRANSIENT_ERROR_CODES`` and for no code at all (a server
    hiccup), permanent for every other code."""
    code = code if isinstance(code, str) and code else None
    text = " ".join(message.split()) if isinstance(message, str) and message else "no message"
    transient = code is None or code in TRANSIENT_ERROR_CODES
    label = f" ({code})" if code else ""
    return ModelCallError(f"{where}{label}: {text[:500]}", transient=transient)


def usage_from(raw: object) -> Usage | None:
    """Convert the API's ``usage``, counting one request.

    ``input_tokens`` already counts the cached ones (``input_tokens_details.cached_tokens`` is
    a part of it), as ``Usage`` wants. Returns None when the server reported no usage, or counts
    that cannot be true (not integers, negative): the engine then estimates them and says so.
    """
    given = field_of(raw, "input_tokens"), field_of(raw, "output_tokens")
    if given == (None, None):
        return None
    counts = (
        *given,
        field_of(field_of(raw, "input_tokens_details"), "cached_tokens"),
        field_of(field_of(raw, "output_tokens_details"), "reasoning_tokens"),
    )
    if not all(c is None or (type(c) is int and c >= 0) for c in counts):
        return None
    inputs, outputs, cached, reasoning = (c or 0 for c in counts)
    return Usage(
        input_tokens=inputs,
        output_tokens=outputs,
        cached_tokens=cached,
        reasoning_tokens=reasoning,
        requests=1,
    )


@dataclass(slots=True)
class _Item:
    """One output item of a reply, as far as it has arrived."""

    kind: object
    """``message``, ``function_call``, ``reasoning``, or another type (ignored)."""
    item_id: str | None = None
    call_id: str | None = None
    name: str | None = None
    text: list[str] = field(default_factory=list)
    """A message's text, or a function call's argument text, in the pieces it came in."""
    refusal: list[str] = field(default_factory=list)
    reasoning: dict[str, JsonValue] | None = None
    """A reasoning item's replayable fields, once the item is complete."""
    position: int | None = None
    """A function call's position among the reply's calls."""
    announced: bool = False
    """Whether a function call's id and name went out in a ReplyDelta."""


_Deltas = Callable[[str], list[ReplyDelta]]
"""Makes the fragments that report a piece of text."""

_ENVELOPE_EVENTS = frozenset({"response.created", "response.in_progress", "response.queued"})
_TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ReplyAssembler(ReplyReader):
    """Builds one ``ModelResponse`` from a whole ``Response`` or from the events of a stream.

    Both paths settle each output item through the same code, and a stream's terminal event
    (``response.completed``, ``.incomplete``, ``.failed``) carries the whole ``Response``, which
    settles every item once more: the server's final word, so the result does not depend on
    how the text was cut into deltas. The text of several message items is joined by a blank
    line. A function call the server gave no ``call_id`` is named
    ``call_<response id>_<position>`` (``call_<fallback_id_prefix>_<position>`` without a
    response id), the same for both paths.

    ``strict_schemas`` holds the original parameter schemas of the tools sent in strict mode,
    by name: their calls' arguments go through ``openai_schema.without_strict_nulls``, so the
    nulls strict mode makes the model send do not fail the engine's validation;
    ``output_schema`` does the same for a typed reply's text.
    """

    def __init__(
        self,
        *,
        fallback_id_prefix: str,
        strict_schemas: Mapping[str, Mapping[str, Any]] | None = None,
        output_schema: Mapping[str, Any] | None = None,
    ) -> None:
        self._fallback_prefix = fallback_id_prefix
        self._strict_schemas: Mapping[str, Mapping[str, Any]] = strict_schemas or {}
        self._output_schema = output_schema
        self._items: dict[int, _Item] = {}
        self._by_id: dict[str, int] = {}
        """Output items by their id: where an event without ``output_index`` belongs."""
        self._calls = 0
        self._response_id: str | None = None
        self._model: str | None = None
        self._status: object = None
        self._incomplete_reason: object = None
        self._usage: Usage | None = None
        self._finished = False

    def add_reply(self, response: object) -> None:
        """Add a whole ``Response`` (a non-streamed reply).

        Raises:
            ModelCallError: for a failed or cancelled response (see ``error_failure``), and
                transient for a malformed one.
        """
        if not isinstance(field_of(response, "output"), list):
            raise malformed("the reply has no output list")
        self._finish(response)

    def add_event(self, event: object) -> list[ReplyDelta]:
        """Add one stream event; return the fragments to report, in order.

        Raises:
            ModelCallError: for an ``error`` event or a failed response (see
                ``error_failure``), and transient for a malformed event.
        """
        if field_of(event, "type") is None and field_of(event, "data") is not None:
            event = field_of(event, "data")  # older SDKs wrap an `event: error` as {event, data}
        kind = field_of(event, "type")
        if kind in _ENVELOPE_EVENTS:
            self._envelope(field_of(event, "response"))
        elif kind in _TERMINAL_EVENTS:
            return self._finish(field_of(event, "response"))
        elif kind in ("response.output_item.added", "response.output_item.done"):
            item = field_of(event, "item")
            if item is None:
                raise unreadable(f"{kind} has no item")
            index = self._index(event, field_of(item, "type"), new=kind.endswith("added"))
            return self._merge(index, item)
        elif kind in ("response.output_text.delta", "response.refusal.delta"):
            refusal = kind == "response.refusal.delta"
            index = self._index(event, "message")
            return self._text(index, _text(event, "delta"), refusal=refusal)
        elif kind == "response.function_call_arguments.delta":
            return self._arguments(self._index(event, "function_call"), _text(event, "delta"))
        elif kind == "response.function_call_arguments.done":
            call = self._item(self._index(event, "function_call"), "function_call")
            return self._announce(call) + self._settle_arguments(call, _text(event, "arguments"))
        elif kind == "error":
            # The API nests the details under "error"; the SDK's event type has them flat.
            details = field_of(event, "error") or event
            raise error_failure(
                field_of(details, "code") or field_of(details, "type"),
                field_of(details, "message"),
                where="the server failed the response while streaming",
            )
        return []

    def build(self) -> ModelResponse:
        """The assembled response.

        Raises:
            ModelCallError: transient, when a stream ended without its terminal event: a
                stream a proxy cut cleanly looks complete otherwise, and its partial text must
                not become a final answer.
        """
        if not self._finished:
            raise ModelCallError(
                "the stream ended before its final event (response.completed): "
                "the reply was cut off",
                transient=True,
            )
        items = [self._items[index] for index in sorted(self._items)]
        calls = tuple(self._tool_call(item) for item in items if item.kind == "function_call")
        texts = ["".join(item.text) for item in items if item.kind == "message" and item.text]
        refusal = "".join(part for item in items for part in item.refusal)
        content = "\n\n".join(texts) or refusal
        if self._output_schema is not None and texts:
            content = without_strict_nulls(content, self._output_schema)
        finish = finish_reason_from(
            self._status,
            self._incomplete_reason,
            has_calls=bool(calls),
            refused=bool(refusal) and not texts,
        )
        message = AssistantMessage(
            content=content, tool_calls=calls, provider_data=self._provider_data(items)
        )
        return ModelResponse(
            message=message, finish_reason=finish, usage=self._usage, model_name=self._model
        )

    # -- internals

    def _finish(self, response: object) -> list[ReplyDelta]:
        if response is None:
            raise malformed("the final event has no response")
        self._envelope(response)
        status = field_of(response, "status")
        if status == "failed":
            error = field_of(response, "error")
            raise error_failure(
                field_of(error, "code"),
                field_of(error, "message"),
                where="the server failed the response",
            )
        if status == "cancelled":
            raise ModelCallError("the server cancelled the response", transient=True)
        deltas: list[ReplyDelta] = []
        output = field_of(response, "output")
        if isinstance(output, list) and output:  # a server may leave it out of a final event
            for position, raw in enumerate(output):
                item_id = field_of(raw, "id")
                known = self._by_id.get(item_id) if isinstance(item_id, str) else None
                deltas += self._merge(position if known is None else known, raw)
        self._status = status
        self._incomplete_reason = field_of(field_of(response, "incomplete_details"), "reason")
        self._usage = usage_from(field_of(response, "usage"))
        self._finished = True
        return deltas

    def _envelope(self, response: object) -> None:
        response_id, model = field_of(response, "id"), field_of(response, "model")
        if self._response_id is None and isinstance(response_id, str) and response_id:
            self._response_id = response_id
        if isinstance(model, str) and model:
            self._model = model

    def _index(self, event: object, kind: object, *, new: bool = False) -> int:
        """The output item ``event`` is about: its ``output_index``; without one (llama-server
        leaves it out), the item its ``item_id`` names, else the latest item of ``kind``, else
        (and for a ``new`` item, announced by ``output_item.added``) the next one.

        Raises:
            ModelCallError: permanent (``unreadable``) for an index that is not a
                non-negative integer.
        """
        index = field_of(event, "output_index")
        if index is not None:
            if type(index) is not int or index < 0:
                raise unreadable("an event's output_index is not a non-negative integer")
            return index
        item_id = field_of(event, "item_id") or field_of(field_of(event, "item"), "id")
        if isinstance(item_id, str) and item_id in self._by_id:
            return self._by_id[item_id]
        if not new:
            latest = [i for i, item in self._items.items() if item.kind == kind]
            if latest:
                return max(latest)
        index = max(self._items, default=-1) + 1
        if isinstance(item_id, str) and item_id:
            self._by_id[item_id] = index
        return index

    def _item(self, index: int, kind: object) -> _Item:
        item = self._items.get(index)
        if item is None:
            item = self._items[index] = _Item(kind=kind)
        if item.kind != kind and kind in ("message", "function_call", "reasoning"):
            item.kind = kind  # an item first seen through a delta, then named by the server
        if item.kind == "function_call" and item.position is None:
            item.position, self._calls = self._calls, self._calls + 1
        return item

    def _merge(self, index: int, raw: object) -> list[ReplyDelta]:
        """Take in an output item, whole or as announced (``output_item.added``): what it
        says is final, and any text beyond the deltas already reported is reported now."""
        item = self._item(index, field_of(raw, "type"))
        item.item_id = item.item_id or optional_str(field_of(raw, "id"), "item id")
        if item.item_id:
            self._by_id.setdefault(item.item_id, index)
        if item.kind == "reasoning":
            item.reasoning = _reasoning_fields(raw)
            return []
        if item.kind == "function_call":
            item.call_id = item.call_id or optional_str(field_of(raw, "call_id"), "call_id")
            item.name = item.name or optional_str(field_of(raw, "name"), "function name")
            arguments = optional_str(field_of(raw, "arguments"), "arguments") or ""
            return self._announce(item) + self._settle_arguments(item, arguments)
        if item.kind != "message":
            return []
        parts = field_of(raw, "content")
        if parts is not None and not isinstance(parts, list):
            raise malformed("message content is not a list")
        text = "".join(
            _text(p, "text") for p in parts or () if field_of(p, "type") == "output_text"
        )
        refusal = "".join(
            _text(p, "refusal") for p in parts or () if field_of(p, "type") == "refusal"
        )
        deltas = self._settle(item.text, text, self._text_delta(index))
        return deltas + self._settle(item.refusal, refusal, _refusal_delta)

    def _text(self, index: int, delta: str, *, refusal: bool) -> list[ReplyDelta]:
        item = self._item(index, "message")
        if not delta:
            return []
        if refusal:
            item.refusal.append(delta)
            return _refusal_delta(delta)
        deltas = self._text_delta(index)(delta)
        item.text.append(delta)
        return deltas

    def _text_delta(self, index: int) -> _Deltas:
        """A maker of the deltas of message ``index``'s text: its first text comes after a
        blank line when an earlier message has text (as ``build`` joins them)."""
        # Pieces are never empty: a message's list is non-empty once it has text.
        apart = not self._items[index].text and any(
            item.text
            for other, item in self._items.items()
            if other != index and item.kind == "message"
        )

        def deltas(text: str) -> list[ReplyDelta]:
            return (
                [ReplyDelta(text="\n\n"), ReplyDelta(text=text)]
                if apart
                else [ReplyDelta(text=text)]
            )

        return deltas

    def _arguments(self, index: int, delta: str) -> list[ReplyDelta]:
        call = self._item(index, "function_call")
        deltas = self._announce(call)
        if delta:
            call.text.append(delta)
            deltas.append(ReplyDelta(tool_call_index=call.position, arguments=delta))
        return deltas

    def _settle_arguments(self, call: _Item, arguments: str) -> list[ReplyDelta]:
        position = call.position

        def deltas(text: str) -> list[ReplyDelta]:
            return [ReplyDelta(tool_call_index=position, arguments=text)]

        return self._settle(call.text, arguments, deltas)

    @staticmethod
    def _settle(pieces: list[str], final: str, deltas: _Deltas) -> list[ReplyDelta]:
        """Make ``pieces`` add up to ``final``: the missing end is reported; text that
        disagrees with what was reported replaces it (fragments cannot be taken back)."""
        have = "".join(pieces)
        if not final or final == have:
            return []
        if final.startswith(have):
            rest = final[len(have) :]
            pieces.append(rest)
            return deltas(rest)
        pieces[:] = [final]
        return []

    def _announce(self, call: _Item) -> list[ReplyDelta]:
        if call.announced:
            return []
        call.announced = True
        return [
            ReplyDelta(
                tool_call_index=call.position,
                tool_call_id=call.call_id or self._synthetic_id(call),
                tool_name=call.name,
            )
        ]

    def _tool_call(self, call: _Item) -> ToolCall:
        name = call.name or ""
        arguments = "".join(call.text)
        schema = self._strict_schemas.get(name)
        if schema is not None:
            arguments = without_strict_nulls(arguments, schema)
        return ToolCall(id=call.call_id or self._synthetic_id(call), name=name, arguments=arguments)

    def _synthetic_id(self, call: _Item) -> str:
        return f"call_{self._response_id or self._fallback_prefix}_{call.position}"

    @staticmethod
    def _provider_data(items: list[_Item]) -> dict[str, JsonValue] | None:
        """The reply's item layout, when it has reasoning items to send back later."""
        layout: list[JsonValue] = []
        for item in items:
            if item.kind == "reasoning" and item.reasoning:
                layout.append({**item.reasoning, "type": "reasoning"})
            elif item.kind == "message":
                layout.append({"type": "message", "id": item.item_id})
            elif item.kind == "function_call":
                layout.append({"type": "function_call", "index": item.position})
        if not any(isinstance(e, dict) and e["type"] == "reasoning" for e in layout):
            return None
        return {PROVIDER_KEY: {"output": layout}}


def unreadable(detail: str) -> ModelCallError:
    """The failure for a stream event that cannot be read: permanent, since the same server
    sends the same shape again (a retry only pays for another generation)."""
    return ModelCallError(f"malformed stream event from the server: {detail}", transient=False)


def _refusal_delta(text: str) -> list[ReplyDelta]:
    return [ReplyDelta(text=text)]


def _reasoning_fields(raw: object) -> dict[str, JsonValue]:
    """The replayable fields of a reasoning item (an SDK object or a mapping), as JSON."""
    if not isinstance(raw, Mapping):
        dump = getattr(raw, "model_dump", None)
        raw = dump(mode="json", exclude_none=True) if callable(dump) else {}
    if not isinstance(raw, Mapping):
        return {}
    return {key: copy.deepcopy(raw[key]) for key in REASONING_FIELDS if raw.get(key) is not None}


def _text(obj: object, name: str) -> str:
    return optional_str(field_of(obj, name), name) or ""
