"""Pure conversion between agent_fsm's transcript types and the Chat Completions wire format.

Kept apart from ``openai_chat`` so that it never imports ``openai``: everything here works on
plain JSON-shaped data, or on the SDK's reply objects read by attribute name, which is also why
it accepts a plain ``dict`` wherever the SDK would hand over a model.

The one rule that shapes this module: a streamed reply and the same reply returned in one piece
must become the *same* ``ModelResponse``. Both paths therefore go through ``ReplyAssembler``;
the non-streaming path simply feeds it the whole message as a single fragment.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_fsm.content import MB, FilePart, ImagePart, PartSupport, TextPart
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    Message,
    ModelResponse,
    OutputFormat,
    ReplyDelta,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from agent_fsm.models.adapter import ReplyReader
from agent_fsm.models.base import ModelCallError, replayable_arguments
from agent_fsm.models.common import field_of, malformed, optional_str
from agent_fsm.models.openai_schema import strict_schema, without_strict_nulls
from agent_fsm.models.parts import PartBudget, file_name

__all__ = [
    "CHAT_PARTS",
    "OPENAI_IMAGE_TYPES",
    "ReplyAssembler",
    "response_format",
    "finish_reason_from",
    "response_from_completion",
    "to_openai_messages",
    "to_openai_tool_choice",
    "to_openai_tools",
    "usage_from",
]

_FINISH_REASONS: Mapping[str, FinishReason] = {
    "stop": FinishReason.STOP,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "length": FinishReason.LENGTH,
    "content_filter": FinishReason.CONTENT_FILTER,
}


# --------------------------------------------------------------------------- requests


OPENAI_IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})
"""The image types OpenAI's APIs read (a GIF is read as its first frame)."""

CHAT_PARTS = PartSupport(
    provider="OpenAI Chat Completions",
    image_types=OPENAI_IMAGE_TYPES,
    file_types=frozenset({"application/pdf"}),
    image_urls=True,
    file_urls=False,
    max_image_bytes=20 * MB,
    max_file_bytes=32 * MB,
    max_request_bytes=50 * MB,
    tool_results=(
        "a tool message takes text only: the result's text goes in it, with a note, and its "
        "images and files follow in one user message after the turn's tool results"
    ),
)
"""What Chat Completions takes: images as ``image_url`` (a URL or a ``data:`` URL), PDFs as
``file`` parts with ``file_data`` (a ``data:`` URL) and a file name; a file by URL it does not
fetch. Its documented limits: 50 MB per request, 32 MB of files."""


def to_openai_messages(
    messages: Iterable[Message], *, support: PartSupport | None = None
) -> list[dict[str, Any]]:
    """Convert a transcript to Chat Completions ``messages``.

    ``ToolMessage.details`` and ``ToolMessage.status`` are never sent: the model sees only the
    content. Call arguments that are not a JSON object are sent as ``{}``
    (``replayable_arguments``). An assistant message with tool calls and no text is sent with
    ``content: null``, as the API itself returns it.

    A user message with ``parts`` is sent as a list of content parts. A tool message takes
    only text, so a tool result's images and files (``ToolMessage.parts``) follow in one user
    message after the turn's tool results, each introduced by the call it answers, and the
    tool message says they follow (``CHAT_PARTS.tool_results``): nothing is dropped.

    Args:
        support: what the server takes; each part is checked against it (``PartBudget``).

    Raises:
        TypeError: for an object that is not a transcript message (a programming error).
        ModelCallError: not transient: a part ``support`` says the server cannot take.
    """
    out: list[dict[str, Any]] = []
    budget: PartBudget | None = None
    shown: list[dict[str, Any]] = []  # tool results' images and files, for after the results
    for message in messages:
        if shown and not isinstance(message, ToolMessage):
            out.append({"role": "user", "content": shown})
            shown = []
        if isinstance(message, SystemMessage | UserMessage):
            if isinstance(message, UserMessage) and message.parts:
                budget = budget or PartBudget(support)
                content = _text_parts(message.content)
                content.extend(_chat_part(part, budget) for part in message.parts)
                out.append({"role": "user", "content": content})
            else:
                out.append({"role": message.role, "content": message.content})
        elif isinstance(message, AssistantMessage):
            wire: dict[str, Any] = {"role": "assistant"}
            wire["content"] = message.content or (None if message.tool_calls else "")
            if message.tool_calls:
                wire["tool_calls"] = [
                    {
                        "id": call.id,
                        "type": "function",
                        "function": {
                            "name": call.name,
                            "arguments": replayable_arguments(call.arguments),
                        },
                    }
                    for call in message.tool_calls
                ]
            out.append(wire)
        elif isinstance(message, ToolMessage):
            text = message.content
            if message.parts:
                budget = budget or PartBudget(support)
                text, media = _tool_parts(message, budget)
                shown.extend(media)
            out.append({"role": "tool", "tool_call_id": message.tool_call_id, "content": text})
        else:
            raise TypeError(f"not a transcript message: {type(message).__name__}")
    if shown:
        out.append({"role": "user", "content": shown})
    return out


def _text_parts(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}] if text else []


def _chat_part(part: TextPart | ImagePart | FilePart, budget: PartBudget) -> dict[str, Any]:
    """One part as a Chat Completions content part, checked against the request's budget."""
    budget.take(part)
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        url = part.url if part.url is not None else part.data_url()
        return {"type": "image_url", "image_url": {"url": url}}
    return {"type": "file", "file": {"file_data": part.data_url(), "filename": file_name(part, 1)}}


def _tool_parts(message: ToolMessage, budget: PartBudget) -> tuple[str, list[dict[str, Any]]]:
    """A tool result's text (its text parts included) and its images and files as the
    content of the user message that follows the turn's results."""
    texts = [message.content] if message.content else []
    media: list[dict[str, Any]] = []
    for part in message.parts:
        if isinstance(part, TextPart):
            texts.append(part.text)
        else:
            media.append(_chat_part(part, budget))
    if not media:
        return "\n\n".join(texts), []
    texts.append(f"[{len(media)} image(s) or file(s) follow in the next user message]")
    intro = {
        "type": "text",
        "text": f"Returned by the {message.name} call {message.tool_call_id}:",
    }
    return "\n\n".join(texts), [intro, *media]


def to_openai_tool_choice(choice: str) -> str | dict[str, Any]:
    """``ModelRequest.tool_choice`` as Chat Completions takes it: a mode as it is, a tool's
    name as ``{"type": "function", "function": {"name": ...}}``."""
    if choice in ("auto", "required", "none"):
        return choice
    return {"type": "function", "function": {"name": choice}}


def to_openai_tools(tools: Iterable[ToolSpec], *, strict: bool = False) -> list[dict[str, Any]]:
    """Convert tool specs to Chat Completions ``tools``, copying every schema.

    With ``strict=True`` each schema is adapted by ``openai_schema.strict_schema`` and sent
    with ``"strict": true``; a tool whose schema strict mode cannot express is sent unchanged
    and non-strict rather than with a silently different meaning. The caller's schemas are
    never modified.
    """
    out: list[dict[str, Any]] = []
    for spec in tools:
        function: dict[str, Any] = {"name": spec.name, "description": spec.description}
        adapted = strict_schema(spec.parameters) if strict else None
        if adapted is None:
            function["parameters"] = copy.deepcopy(spec.parameters)
        else:
            function["parameters"] = adapted
            function["strict"] = True
        out.append({"type": "function", "function": function})
    return out


def response_format(output: OutputFormat, *, strict: bool = False) -> dict[str, Any]:
    """The ``response_format`` that asks for a reply matching ``output``'s JSON Schema.

    With ``strict=True`` the schema is adapted as tools are (``strict_schema``) when strict
    mode can express it; otherwise it is sent as it is, which servers take as guidance.
    """
    adapted = strict_schema(output.schema) if strict else None
    name = re.sub(r"[^a-zA-Z0-9_-]", "_", output.name)[:64] or "output"
    json_schema: dict[str, Any] = {"name": name}
    if adapted is None:
        json_schema["schema"] = copy.deepcopy(output.schema)
    else:
        json_schema["schema"] = adapted
        json_schema["strict"] = True
    return {"type": "json_schema", "json_schema": json_schema}


# --------------------------------------------------------------------------- replies


def finish_reason_from(reason: object) -> FinishReason:
    """Map the API's ``finish_reason``; anything unknown, or None, counts as STOP.

    The legacy ``function_call`` reason is TOOL_CALLS. The engine sends any reply that
    carries tool calls to ACT whatever this says, so STOP is a safe default.
    """
    return (
        _FINISH_REASONS.get(reason, FinishReason.STOP)
        if isinstance(reason, str)
        else (FinishReason.STOP)
    )


def usage_from(raw: object) -> Usage | None:
    """Convert the API's ``usage`` object, counting one request.

    Returns None when the server reported no usage, or counts that cannot be true (not
    integers, negative): the engine then estimates them and says so.
    """
    prompt = field_of(raw, "prompt_tokens")
    completion = field_of(raw, "completion_tokens")
    if prompt is None and completion is None:
        return None
    counts = (
        prompt,
        completion,
        field_of(field_of(raw, "prompt_tokens_details"), "cached_tokens"),
        field_of(field_of(raw, "completion_tokens_details"), "reasoning_tokens"),
    )
    if not all(c is None or (type(c) is int and c >= 0) for c in counts):
        return None
    given = [c or 0 for c in counts]
    return Usage(
        input_tokens=given[0],
        output_tokens=given[1],
        cached_tokens=given[2],
        reasoning_tokens=given[3],
        requests=1,
    )


def response_from_completion(completion: object, *, fallback_id_prefix: str) -> ModelResponse:
    """Convert a whole (non-streamed) ``chat.completion`` reply.

    Args:
        completion: the SDK's ``ChatCompletion``, or the same data as a plain mapping.
        fallback_id_prefix: used to name tool calls the server gave no id (see
            ``ReplyAssembler``).

    Raises:
        ModelCallError: transient, when the reply has no choices or is malformed.
    """
    assembler = ReplyAssembler(fallback_id_prefix=fallback_id_prefix)
    assembler.add_reply(completion)
    return assembler.build()


@dataclass(slots=True)
class _CallParts:
    id: str | None = None
    name: str | None = None
    arguments: list[str] = field(default_factory=list)


class ReplyAssembler(ReplyReader):
    """Builds one ``ModelResponse`` from a reply given whole or in streamed chunks.

    Tool-call fragments are grouped by the server's ``index``; a call's first ``id`` and
    ``name`` win and its ``arguments`` pieces are concatenated, raw, whatever they contain.
    A call the server gave no id (some compatible servers; every legacy ``function_call``)
    is named ``call_<completion id>_<position>``, or ``call_<fallback_id_prefix>_<position>``
    when the reply has no id either: the same for both paths, so the transcript is stable.
    Only the first choice is read.

    ``strict_schemas`` holds the original parameter schemas of the tools sent in strict mode,
    by name: a call to one of them has its arguments passed through
    ``openai_schema.without_strict_nulls``, so the nulls strict mode makes the model send do
    not fail the engine's validation. Streamed fragments report the text as it arrived.
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
        self._id_prefix: str | None = None
        self._completion_id: str | None = None
        self._model: str | None = None
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._calls: list[_CallParts] = []
        self._positions: dict[object, int] = {}
        self._finish_reason: str | None = None
        self._usage: Usage | None = None
        self._saw_choice = False
        self._streamed = False

    def add_reply(self, completion: object) -> None:
        """Add a whole ``chat.completion`` reply.

        Raises:
            ModelCallError: transient, when the reply has no choices or is malformed.
        """
        self._add_envelope(completion)
        choices = field_of(completion, "choices")
        if not isinstance(choices, list) or not choices:
            raise malformed("the reply has no choices")
        choice = choices[0]
        message = field_of(choice, "message")
        if message is None:
            raise malformed("the first choice has no message")
        self._saw_choice = True
        self._add_part(message, whole=True)
        self._finish_reason = optional_str(field_of(choice, "finish_reason"), "finish_reason")

    def add_event(self, chunk: object) -> list[ReplyDelta]:
        """Add one ``chat.completion.chunk``; return the fragments to report, in order.

        Raises:
            ModelCallError: transient, when the chunk is malformed.
        """
        self._add_envelope(chunk)
        self._streamed = True
        choices = field_of(chunk, "choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            raise malformed("chunk choices is not a list")
        deltas: list[ReplyDelta] = []
        for choice in choices:
            if field_of(choice, "index") not in (0, None):
                continue
            self._saw_choice = True
            delta = field_of(choice, "delta")
            if delta is not None:
                deltas.extend(self._add_part(delta, whole=False))
            reason = optional_str(field_of(choice, "finish_reason"), "finish_reason")
            if reason is not None:
                self._finish_reason = reason
        return deltas

    def build(self) -> ModelResponse:
        """The assembled response.

        Raises:
            ModelCallError: transient, when no choice ever arrived, or a stream ended without
                a finish reason: a stream a proxy cut cleanly looks complete otherwise, and
                its partial text must not become a final answer.
        """
        if not self._saw_choice:
            raise malformed("the reply has no choices")
        if self._streamed and self._finish_reason is None:
            raise ModelCallError(
                "the stream ended without a finish reason: the reply was cut off", transient=True
            )
        calls = tuple(
            self._tool_call(position, parts) for position, parts in enumerate(self._calls)
        )
        # A refusal is the model's own explanation; show it rather than an empty reply, and
        # say so in the finish reason (the API reports "stop" for it).
        content = "".join(self._text) or "".join(self._refusal)
        if self._output_schema is not None and self._text:
            # the typed output was sent strict: take out the nulls strict mode added
            content = without_strict_nulls(content, self._output_schema)
        finish = finish_reason_from(self._finish_reason)
        if self._refusal and not calls and finish is FinishReason.STOP:
            finish = FinishReason.REFUSAL
        return ModelResponse(
            message=AssistantMessage(content=content, tool_calls=calls),
            finish_reason=finish,
            usage=self._usage,
            model_name=self._model,
        )

    # -- internals

    def _tool_call(self, position: int, parts: _CallParts) -> ToolCall:
        name = parts.name or ""
        arguments = "".join(parts.arguments)
        schema = self._strict_schemas.get(name)
        if schema is not None:
            arguments = without_strict_nulls(arguments, schema)
        return ToolCall(id=parts.id or self._synthetic_id(position), name=name, arguments=arguments)

    def _add_envelope(self, envelope: object) -> None:
        if envelope is None:
            raise malformed("empty reply")
        if self._completion_id is None:
            completion_id = field_of(envelope, "id")
            self._completion_id = completion_id if isinstance(completion_id, str) else None
        model = field_of(envelope, "model")
        if isinstance(model, str) and model:
            self._model = model
        raw_usage = field_of(envelope, "usage")
        if raw_usage is not None:
            # Servers that repeat usage on every chunk send running totals: the last one wins.
            self._usage = usage_from(raw_usage)

    def _add_part(self, part: object, *, whole: bool) -> list[ReplyDelta]:
        deltas: list[ReplyDelta] = []
        text = optional_str(field_of(part, "content"), "content")
        if text:
            self._text.append(text)
            deltas.append(ReplyDelta(text=text))
        refusal = optional_str(field_of(part, "refusal"), "refusal")
        if refusal:
            self._refusal.append(refusal)
            deltas.append(ReplyDelta(text=refusal))
        tool_calls = field_of(part, "tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise malformed("tool_calls is not a list")
        for position, raw in enumerate(tool_calls or ()):
            if raw is None:
                raise malformed("a tool call is null")
            index = position if whole else field_of(raw, "index")
            function = field_of(raw, "function")
            if function is None and field_of(raw, "type") == "custom":
                custom = field_of(raw, "custom")
                name, arguments = field_of(custom, "name"), field_of(custom, "input")
            else:
                name, arguments = field_of(function, "name"), field_of(function, "arguments")
            delta = self._add_call(index, field_of(raw, "id"), name, arguments)
            if delta is not None:
                deltas.append(delta)
        legacy = field_of(part, "function_call")
        if legacy is not None:
            delta = self._add_call(
                "function_call", None, field_of(legacy, "name"), field_of(legacy, "arguments")
            )
            if delta is not None:
                deltas.append(delta)
        return deltas

    def _add_call(
        self, index: object, call_id: object, name: object, arguments: object
    ) -> ReplyDelta | None:
        call_id = optional_str(call_id, "tool call id") or None
        name = optional_str(name, "tool name") or None
        arguments = optional_str(arguments, "tool arguments") or ""
        position = self._position(index, call_id)
        parts = self._calls[position]
        new_id = new_name = None
        if call_id is not None and parts.id is None:
            parts.id = new_id = call_id
        if index == "function_call" and parts.id is None:
            parts.id = new_id = self._synthetic_id(position)
        if name is not None and parts.name is None:
            parts.name = new_name = name
        if arguments:
            parts.arguments.append(arguments)
        if new_id is None and new_name is None and not arguments:
            return None
        return ReplyDelta(
            tool_call_index=position, tool_call_id=new_id, tool_name=new_name, arguments=arguments
        )

    def _position(self, index: object, call_id: str | None) -> int:
        if index is not None and not isinstance(index, int | str):
            raise malformed("tool call index is not an integer")
        position = self._positions.get(index) if index is not None else None
        if position is None and index is None and self._calls:
            position = len(self._calls) - 1  # no index at all: continue the latest call
        if position is not None:
            known = self._calls[position].id
            # A different id under a known index is a new call (servers that send index 0
            # for every call).
            if call_id is None or known is None or known == call_id:
                return position
        self._calls.append(_CallParts())
        position = len(self._calls) - 1
        if index is not None:
            self._positions[index] = position
        return position

    def _synthetic_id(self, position: int) -> str:
        if self._id_prefix is None:
            self._id_prefix = self._completion_id or self._fallback_prefix
        return f"call_{self._id_prefix}_{position}"
