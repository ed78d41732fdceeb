"""Reading Anthropic Messages replies: stop reasons, usage, and ``AnthropicReply``, which
builds one ``ModelResponse`` from a reply given whole or streamed, over one or more requests.

Like ``anthropic_convert``, this module never imports ``anthropic``: it reads the SDK's
objects by attribute name, or the same data as plain mappings.

Stop reasons (``stop_reason``) and what they become:

=================================  ==========================================================
``end_turn``, ``stop_sequence``    ``FinishReason.STOP``
``tool_use``                       ``FinishReason.TOOL_CALLS``
``max_tokens``                     ``FinishReason.LENGTH``
``model_context_window_exceeded``  ``FinishReason.LENGTH``: the reply was cut where the
                                   context window filled up. It is a truncated reply, as
                                   with ``max_tokens`` (the API sends it with HTTP 200 and the
                                   partial content), not a failure: retrying the same request
                                   would fill the window again, and an error would throw the
                                   text away.
``refusal``                        ``FinishReason.REFUSAL``; the tool calls of a refused reply
                                   are dropped, since the model was stopped mid-turn and its
                                   calls are not a finished intent.
``pause_turn``                     not a finish: a server tool paused a long turn, and the
                                   turn continues when its content is sent back.
                                   ``AnthropicModel`` does that itself (``MAX_CONTINUATIONS``
                                   times at most), so the model call returns the whole turn,
                                   usage summed; a turn still paused after that is
                                   ``FinishReason.LENGTH`` (cut short, with what it has).
anything else, or none             ``FinishReason.STOP``: the engine sends a reply with tool
                                   calls to ACT whatever the reason says.
=================================  ==========================================================

A stream that ends without ``message_stop`` is a transient ``ModelCallError``: a proxy that
cuts a stream cleanly leaves one that looks complete otherwise, and its partial text must not
become a final answer. An ``error`` event inside a stream is raised by the SDK itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
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
from agent_fsm.models.anthropic_convert import PROVIDER, tool_use_block
from agent_fsm.models.base import ModelCallError
from agent_fsm.models.common import field_of, malformed, optional_str

__all__ = ["PAUSE_TURN", "STOP_REASONS", "AnthropicReply", "finish_reason_from", "usage_from"]

STOP_REASONS: Mapping[str, FinishReason] = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "tool_use": FinishReason.TOOL_CALLS,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "refusal": FinishReason.REFUSAL,
}
PAUSE_TURN = "pause_turn"

_COUNTS = (
    "input_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "output_tokens",
)


def finish_reason_from(reason: object) -> FinishReason:
    """Map a ``stop_reason`` (see the module's table); unknown or None is STOP, and so is
    ``pause_turn`` here: only ``AnthropicReply`` knows whether the pause was continued."""
    return (
        STOP_REASONS.get(reason, FinishReason.STOP)
        if isinstance(reason, str)
        else (FinishReason.STOP)
    )


def usage_from(raw: object) -> Usage | None:
    """Convert the API's ``usage``, counting one request.

    The API counts cached input apart: ``input_tokens`` is only the uncached part, and
    ``cache_read_input_tokens`` and ``cache_creation_input_tokens`` the rest, so
    ``Usage.input_tokens`` is their sum and ``cached_tokens`` the cache reads.
    ``output_tokens_details.thinking_tokens`` (newer servers) is ``reasoning_tokens``.
    Returns None when the server reported no usage, or counts that cannot be true.
    """
    counts: dict[str, object] = {}
    _merge_usage(counts, raw)
    return _usage(counts)


def _merge_usage(counts: dict[str, object], raw: object) -> None:
    """Take the counts ``raw`` reports; a stream's ``message_delta`` repeats cumulative
    counts, so a later value replaces an earlier one."""
    for name in _COUNTS:
        value = field_of(raw, name)
        if value is not None:
            counts[name] = value
    thinking = field_of(field_of(raw, "output_tokens_details"), "thinking_tokens")
    if thinking is not None:
        counts["thinking_tokens"] = thinking


def _usage(counts: Mapping[str, object]) -> Usage | None:
    if "input_tokens" not in counts and "output_tokens" not in counts:
        return None
    if not all(type(value) is int and value >= 0 for value in counts.values()):
        return None
    given: dict[str, int] = {name: value for name, value in counts.items() if type(value) is int}
    read = given.get("cache_read_input_tokens", 0)
    return Usage(
        input_tokens=given.get("input_tokens", 0)
        + read
        + given.get("cache_creation_input_tokens", 0),
        output_tokens=given.get("output_tokens", 0),
        cached_tokens=read,
        reasoning_tokens=given.get("thinking_tokens", 0),
        requests=1,
    )


@dataclass(slots=True)
class _Block:
    """One content block as it arrives: the block that opened it, then its deltas."""

    start: dict[str, Any]
    pieces: list[str] = field(default_factory=list)
    signature: list[str] = field(default_factory=list)
    call: int | None = None
    """The block's position among the reply's tool calls, for a ``tool_use`` block."""


@dataclass(frozen=True, slots=True)
class _Final:
    """A finished block: as it goes back to the API, and the call it is, if one."""

    wire: dict[str, Any]
    call: ToolCall | None = None


class AnthropicReply(ReplyReader):
    """Builds one ``ModelResponse`` from the replies to one model call.

    Each reply (a whole ``Message`` through ``add_reply``, or a stream's events through
    ``add_event`` and then ``end_stream``) is a part; more than one when a turn was paused and
    continued (``paused``, ``continuation``). Both paths turn the same blocks into the same
    response: the text of the text blocks, one ToolCall per ``tool_use`` block (the argument
    text of a stream is the JSON object it spells, written as a whole reply's ``input`` is;
    text that is not a JSON object stays as it came, for the engine to answer), and, when the
    reply had thinking or server-tool blocks, the reply's block order with those blocks
    verbatim in ``provider_data["anthropic"]["content"]`` (see
    ``anthropic_convert.assistant_blocks``). A call the server gave no id is named
    ``toolu_<fallback_id_prefix>_<position>``. Streamed text and argument fragments are
    returned for reporting as they arrive; thinking is not reported (it is not the reply).
    """

    def __init__(self, *, fallback_id_prefix: str) -> None:
        self._prefix = fallback_id_prefix
        self._done: list[_Final] = []
        self._blocks: dict[int, _Block] = {}
        self._counts: dict[str, object] = {}
        self._usage: Usage | None = None
        self._calls = 0
        self._model: str | None = None
        self._stop_reason: str | None = None
        self._stopped = False
        self._parts = 0

    # -- input

    def add_reply(self, message: object) -> None:
        """Add a whole ``Message`` as one part.

        Raises:
            ModelCallError: transient, when the reply is malformed.
        """
        if message is None:
            raise malformed("empty reply")
        self._envelope(message)
        self._stop_reason = optional_str(field_of(message, "stop_reason"), "stop_reason")
        content = field_of(message, "content")
        if not isinstance(content, list):
            raise malformed("the reply's content is not a list")
        for index, block in enumerate(content):
            self._start(index, block)
        self._close_part()

    def add_event(self, event: object) -> list[ReplyDelta]:
        """Add one streamed event; return the fragments to report, in order. Unknown events
        (``ping``, ones added later) are ignored.

        Raises:
            ModelCallError: transient, when the event is malformed.
        """
        kind = field_of(event, "type")
        if kind == "message_start":
            self._stop_reason = None  # a continuation's own reason, not the pause before it
            self._envelope(field_of(event, "message"))
        elif kind == "content_block_start":
            return self._start(_index(event), field_of(event, "content_block"))
        elif kind == "content_block_delta":
            return self._delta(_index(event), field_of(event, "delta"))
        elif kind == "message_delta":
            reason = optional_str(field_of(field_of(event, "delta"), "stop_reason"), "stop_reason")
            self._stop_reason = reason or self._stop_reason
            _merge_usage(self._counts, field_of(event, "usage"))
        elif kind == "message_stop":
            self._stopped = True
        return []

    def end_stream(self) -> None:
        """Close the part the events since the last one streamed (a whole reply closes
        itself).

        Raises:
            ModelCallError: transient, when the stream never reached ``message_stop``.
        """
        if not self._stopped:
            raise ModelCallError(
                "the stream ended before message_stop: the reply was cut off", transient=True
            )
        self._close_part()

    def _close_part(self) -> None:
        self._done.extend(self._final(block) for _, block in sorted(self._blocks.items()))
        usage = _usage(self._counts)
        if usage is not None:
            self._usage = usage if self._usage is None else self._usage + usage
        self._blocks, self._counts = {}, {}
        self._stopped = False
        self._parts += 1

    # -- output

    @property
    def paused(self) -> bool:
        """Whether the last part ended with ``pause_turn``: the turn is not over."""
        return self._stop_reason == PAUSE_TURN

    def continuation(self) -> list[dict[str, Any]]:
        """The content of every part so far, as the assistant message that continues the
        paused turn when sent back."""
        return [final.wire for final in self._done]

    def build(self) -> ModelResponse:
        """The assembled response (see the module's table for the finish reason).

        Raises:
            ModelCallError: transient, when no part was completed.
        """
        if self._parts == 0:
            raise malformed("no reply")
        finish = FinishReason.LENGTH if self.paused else finish_reason_from(self._stop_reason)
        calls = (
            ()
            if finish is FinishReason.REFUSAL
            else tuple(final.call for final in self._done if final.call is not None)
        )
        text = "".join(f.wire["text"] for f in self._done if f.wire["type"] == "text")
        provider_data: dict[str, JsonValue] | None = None
        if any(f.wire["type"] not in ("text", "tool_use") for f in self._done):
            layout: list[JsonValue] = [_placeholder(final) for final in self._done]
            provider_data = {PROVIDER: {"content": layout}}
        usage = self._usage.model_copy(update={"requests": 1}) if self._usage else None
        return ModelResponse(
            message=AssistantMessage(content=text, tool_calls=calls, provider_data=provider_data),
            finish_reason=finish,
            usage=usage,
            model_name=self._model,
        )

    # -- internals

    def _envelope(self, message: object) -> None:
        model = field_of(message, "model")
        if isinstance(model, str) and model:
            self._model = model
        _merge_usage(self._counts, field_of(message, "usage"))

    def _start(self, index: int, raw: object) -> list[ReplyDelta]:
        start = _plain(raw)
        kind = start.get("type")
        if not isinstance(kind, str):
            raise malformed("a content block has no type")
        if index in self._blocks:
            raise malformed(f"content block {index} started twice")
        block = self._blocks[index] = _Block(start)
        if kind == "tool_use":
            block.call = self._calls
            self._calls += 1
            name = optional_str(start.get("name"), "tool name") or ""
            return [
                ReplyDelta(tool_call_index=block.call, tool_call_id=self._id(block), tool_name=name)
            ]
        text = start.get("text")
        return [ReplyDelta(text=text)] if kind == "text" and isinstance(text, str) and text else []

    def _delta(self, index: int, delta: object) -> list[ReplyDelta]:
        block = self._blocks.get(index)
        if block is None:
            raise malformed(f"a delta for content block {index}, which never started")
        kind = field_of(delta, "type")
        if kind == "text_delta":
            text = optional_str(field_of(delta, "text"), "text") or ""
            block.pieces.append(text)
            return [ReplyDelta(text=text)] if text and block.start["type"] == "text" else []
        if kind == "input_json_delta":
            piece = optional_str(field_of(delta, "partial_json"), "partial_json") or ""
            block.pieces.append(piece)
            if piece and block.call is not None:
                return [ReplyDelta(tool_call_index=block.call, arguments=piece)]
        elif kind == "thinking_delta":
            block.pieces.append(optional_str(field_of(delta, "thinking"), "thinking") or "")
        elif kind == "signature_delta":
            block.signature.append(optional_str(field_of(delta, "signature"), "signature") or "")
        return []  # citations and deltas added later: the block's text is what counts

    def _final(self, block: _Block) -> _Final:
        start, kind = block.start, block.start["type"]
        if kind == "text":
            text = (optional_str(start.get("text"), "text") or "") + "".join(block.pieces)
            return _Final({"type": "text", "text": text})
        if kind == "tool_use":
            call = ToolCall(
                id=self._id(block),
                name=optional_str(start.get("name"), "tool name") or "",
                arguments=_arguments(start.get("input"), block.pieces),
            )
            return _Final(tool_use_block(call), call)
        wire = dict(start)
        if kind == "thinking":
            wire["thinking"] = str(start.get("thinking") or "") + "".join(block.pieces)
            wire["signature"] = str(start.get("signature") or "") + "".join(block.signature)
        elif block.pieces:  # a server tool's input, streamed as JSON
            parsed = _json_object("".join(block.pieces))
            if parsed is not None:
                wire["input"] = parsed
        return _Final(wire)

    def _id(self, block: _Block) -> str:
        given = optional_str(block.start.get("id"), "tool call id")
        return given or f"toolu_{self._prefix}_{block.call}"


def _placeholder(final: _Final) -> dict[str, Any]:
    """A block's place in the layout ``provider_data`` records: text and calls are in the
    transcript already, so they are only named; every other block is kept whole."""
    if final.call is not None:
        return {"type": "tool_use", "id": final.call.id}
    if final.wire["type"] == "text":
        return {"type": "text"}
    return final.wire


def _arguments(given: object, pieces: list[str]) -> str:
    raw = "".join(pieces)
    if not raw:  # a whole reply, or a stream that sent its (empty) input whole
        return json.dumps(given if given is not None else {}, ensure_ascii=False)
    parsed = _json_object(raw)
    return raw if parsed is None else json.dumps(parsed, ensure_ascii=False)


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _plain(raw: object) -> dict[str, Any]:
    """A content block as plain JSON data: what the server sent, not the SDK's defaults."""
    if isinstance(raw, Mapping):
        value: object = json.loads(json.dumps(raw))
    else:
        dump = getattr(raw, "model_dump", None)
        # warnings off: the SDK builds blocks it does not know (or whose shape changed) loosely,
        # and pydantic warns while it dumps them as they came
        value = dump(mode="json", exclude_unset=True, warnings=False) if callable(dump) else None
    if not isinstance(value, dict):
        raise malformed("a content block is not an object")
    return value


def _index(event: object) -> int:
    index = field_of(event, "index")
    if type(index) is not int:
        raise malformed("a content block event has no index")
    return index
