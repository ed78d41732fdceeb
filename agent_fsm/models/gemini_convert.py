"""Pure conversion between agent_fsm's transcript types and Gemini's ``generateContent``.

Kept apart from ``gemini`` so that it never imports ``google.genai``: requests are built as
plain dicts in the SDK's own field names (which the SDK validates and sends), and replies are
read by attribute name from the SDK's objects, or from plain mappings with the same names.

Two rules shape this module. A streamed reply and the same reply given whole become the *same*
``ModelResponse``: both go through ``ReplyAssembler``, the whole one as a single chunk. And a
call's ``thoughtSignature`` (Gemini 2.5+ thinking models put one on a function-call part) must
go back with that call on later turns, or Gemini 3 refuses the history: the assembler keeps
them in the reply's ``provider_data["gemini"]`` (base64 text, by call position, so they survive
checkpoints and the engine's renaming of call ids) and ``to_gemini_contents`` puts them back.

Finish reasons (``Candidate.finishReason``):

==============================  ====================================================
Gemini                          agent_fsm
==============================  ====================================================
STOP                            STOP, or TOOL_CALLS when the reply has function calls
MAX_TOKENS, CONTINUATION        LENGTH
SAFETY, RECITATION, BLOCKLIST,  CONTENT_FILTER
PROHIBITED_CONTENT, SPII,
LANGUAGE, IMAGE_*,
MODEL_ARMOR, ESCALATION,
PUP_LIMITED_DISABLED
prompt blocked (no candidates,  CONTENT_FILTER
promptFeedback.blockReason)
MALFORMED_FUNCTION_CALL,        ModelCallError, transient: the model produced no usable
UNEXPECTED_TOOL_CALL,           reply; a new sample usually does (a call Gemini could not
MALFORMED_RESPONSE, OTHER,      parse has no name or arguments to answer with an error)
TOO_MANY_TOOL_CALLS,
FINISH_REASON_UNSPECIFIED,
NO_IMAGE
MISSING_THOUGHT_SIGNATURE       ModelCallError, permanent: the same history fails again
(none, end of a stream)         ModelCallError, transient: the stream was cut
anything newer                  STOP / TOOL_CALLS
==============================  ====================================================

Gemini has no refusal stop: a refusal is an ordinary answer (STOP).
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import JsonValue

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
    ToolStatus,
    Usage,
    UserMessage,
)
from agent_fsm.models.adapter import ReplyReader
from agent_fsm.models.base import ModelCallError, replayable_arguments
from agent_fsm.models.common import field_of, malformed
from agent_fsm.models.gemini_schema import gemini_schema
from agent_fsm.models.parts import PartBudget, media_type_of

__all__ = [
    "GEMINI_PARTS",
    "PROVIDER_KEY",
    "SKIP_SIGNATURE",
    "GeminiRequest",
    "ReplyAssembler",
    "finish_reason_from",
    "needs_signatures",
    "output_config",
    "output_instruction",
    "takes_schema_with_tools",
    "to_gemini_contents",
    "to_gemini_tools",
    "usage_from",
]

PROVIDER_KEY = "gemini"
"""This adapter's key in ``AssistantMessage.provider_data``."""

SKIP_SIGNATURE = base64.urlsafe_b64decode("skip_thought_signature_validator")
"""The bytes of ``skip_thought_signature_validator`` (read as base64), the value Google
documents for a function call whose real signature is unknown (a history from another model,
or from before a restart): Gemini 3 then skips its check instead of refusing the request."""

_FILTERED = frozenset(
    {
        "SAFETY", "RECITATION", "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "LANGUAGE",
        "IMAGE_SAFETY", "IMAGE_PROHIBITED_CONTENT", "IMAGE_RECITATION", "MODEL_ARMOR",
        "ESCALATION", "PUP_LIMITED_DISABLED",
    }
)  # fmt: skip
_RETRYABLE = frozenset(
    {
        "MALFORMED_FUNCTION_CALL", "UNEXPECTED_TOOL_CALL", "MALFORMED_RESPONSE", "OTHER",
        "TOO_MANY_TOOL_CALLS", "FINISH_REASON_UNSPECIFIED", "NO_IMAGE", "IMAGE_OTHER",
    }
)  # fmt: skip
_MAX_DETAIL_CHARS = 300
# Gemini 1.x and 2.x, by name: they never refuse a call for its missing signature, and refuse
# a response schema next to function declarations.
_BEFORE_GEMINI_3 = re.compile(r"(^|/)gemini-(1|2)(\.|-)")


# --------------------------------------------------------------------------- requests

GEMINI_PARTS = PartSupport(
    provider="Gemini",
    image_types=frozenset({"image/png", "image/jpeg", "image/webp", "image/heic", "image/heif"}),
    file_types=frozenset(
        {"application/pdf", "text/plain", "text/csv", "text/html", "text/markdown", "text/xml"}
    ),
    image_urls=True,
    file_urls=True,
    max_image_bytes=20 * MB,
    max_file_bytes=20 * MB,
    max_request_bytes=20 * MB,
    tool_results=(
        "after the function responses, in the same user turn, as inline_data (or file_data) "
        "parts introduced by the call they belong to: every Gemini model takes that"
    ),
)
"""What the Gemini API takes: bytes as ``inline_data`` parts (20 MB per request, inline),
URLs as ``file_data`` parts (``gs://``, Files API and https URLs; the media type is taken
from the URL's extension unless given)."""


@dataclass(frozen=True, slots=True)
class GeminiRequest:
    """A transcript in Gemini's form: the system instruction and the turns."""

    system_instruction: str | None
    contents: list[dict[str, Any]]


def needs_signatures(model: str) -> bool:
    """Whether ``model`` may refuse a function call sent back without its thought signature
    (every model but Gemini 1.x and 2.x, which never do: they get no stand-in)."""
    return _BEFORE_GEMINI_3.search(model) is None


def to_gemini_contents(
    messages: Iterable[Message],
    *,
    run_id: str,
    stand_in_signature: bool = True,
    support: PartSupport | None = None,
) -> GeminiRequest:
    """Convert a transcript to ``systemInstruction`` and ``contents``.

    The leading system messages become the system instruction; a later one (a note the
    engine adds mid-run) is sent as user text, since Gemini has one instruction per request.
    Assistant messages become ``model`` turns (text, then one ``functionCall`` part per call,
    its arguments an object: ``replayable_arguments`` turns text that is not one into ``{}``);
    tool results become ``functionResponse`` parts ``{"output": text}``, or ``{"error": text}``
    for a call that failed or never ran. Consecutive turns of one role are merged, so the
    results of one reply go back in one user turn, as Gemini expects; empty turns are left out.

    A call's id goes on the wire unless the adapter made it up (``<run_id>_<turn>_<n>``, for a
    call Gemini sent without one). Thought signatures come from the message's
    ``provider_data["gemini"]`` (anything unreadable there counts as absent); when the first
    call of a turn has none and ``stand_in_signature`` is set, ``SKIP_SIGNATURE`` stands in.

    Images and files (``parts``) follow their message's text as ``inline_data`` or
    ``file_data`` parts, each checked against ``support``; a tool result's follow the
    function responses of its turn (``GEMINI_PARTS.tool_results``).

    Raises:
        TypeError: for an object that is not a transcript message (a programming error).
        ModelCallError: not transient: a part ``support`` says the server cannot take.
    """
    synthetic = re.compile(rf"{re.escape(run_id)}_\d+_\d+")
    budget: PartBudget | None = None
    shown = False  # a turn holds a tool result's parts: responses go first
    system: list[str] = []
    turns: list[tuple[str, list[dict[str, Any]]]] = []
    for message in messages:
        if isinstance(message, SystemMessage) and not turns:
            system.append(message.content)
            continue
        if isinstance(message, SystemMessage | UserMessage):
            role, parts = "user", _text_parts(message.content)
            if isinstance(message, UserMessage) and message.parts:
                budget = budget or PartBudget(support)
                parts.extend(_media_part(part, budget) for part in message.parts)
        elif isinstance(message, AssistantMessage):
            role, parts = "model", _model_parts(message, synthetic, stand_in_signature)
        elif isinstance(message, ToolMessage):
            role, parts = "user", [_result_part(message, synthetic)]
            if message.parts:
                budget, shown = budget or PartBudget(support), True
                intro = f"Returned by the {message.name} call {message.tool_call_id}:"
                parts.append({"text": intro})
                parts.extend(_media_part(part, budget) for part in message.parts)
        else:
            raise TypeError(f"not a transcript message: {type(message).__name__}")
        if not parts:
            continue
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(parts)
        else:
            turns.append((role, parts))
    if shown:  # stable: every function response of a turn first, then what follows them
        for _, parts in turns:
            parts.sort(key=lambda part: "function_response" not in part)
    instruction = "\n\n".join(text for text in system if text) or None
    return GeminiRequest(instruction, [{"role": role, "parts": parts} for role, parts in turns])


def _media_part(part: TextPart | ImagePart | FilePart, budget: PartBudget) -> dict[str, Any]:
    """One part as a Gemini part, checked against the request's budget."""
    budget.take(part)
    if isinstance(part, TextPart):
        return {"text": part.text}
    if part.data is not None:
        return {"inline_data": {"mime_type": part.media_type, "data": part.data}}
    return {"file_data": {"file_uri": part.url, "mime_type": media_type_of(part, "Gemini")}}


def _text_parts(text: str) -> list[dict[str, Any]]:
    return [{"text": text}] if text else []


def _model_parts(
    message: AssistantMessage, synthetic: re.Pattern[str], stand_in: bool
) -> list[dict[str, Any]]:
    kept = _kept_signatures(message)
    parts = _text_parts(message.content)
    text_signature = kept.get("text")
    if parts and text_signature is not None:
        parts[0]["thought_signature"] = text_signature
    for position, call in enumerate(message.tool_calls):
        function: dict[str, Any] = {
            "name": call.name,
            "args": json.loads(replayable_arguments(call.arguments)),
        }
        if call.id and not synthetic.fullmatch(call.id):
            function["id"] = call.id
        part: dict[str, Any] = {"function_call": function}
        signature = kept.get(position)
        if signature is None and stand_in and position == 0:
            signature = SKIP_SIGNATURE  # Gemini signs the first call of a turn only
        if signature is not None:
            part["thought_signature"] = signature
        parts.append(part)
    return parts


def _kept_signatures(message: AssistantMessage) -> dict[int | str, bytes]:
    """The signatures ``ReplyAssembler`` kept with ``message``: by call position, and
    ``"text"`` for its text. Lenient: a checkpoint may hold anything."""
    data = (message.provider_data or {}).get(PROVIDER_KEY)
    if not isinstance(data, dict):
        return {}
    kept: dict[int | str, bytes] = {}
    calls = data.get("calls")
    for position, raw in enumerate(calls if isinstance(calls, list) else ()):
        signature = _from_base64(raw)
        if signature is not None:
            kept[position] = signature
    text = _from_base64(data.get("text"))
    if text is not None:
        kept["text"] = text
    return kept


def _from_base64(raw: object) -> bytes | None:
    if not isinstance(raw, str) or not raw:
        return None
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        return None


def _result_part(message: ToolMessage, synthetic: re.Pattern[str]) -> dict[str, Any]:
    key = "output" if message.status is ToolStatus.OK else "error"
    response: dict[str, Any] = {"name": message.name, "response": {key: message.content}}
    if message.tool_call_id and not synthetic.fullmatch(message.tool_call_id):
        response["id"] = message.tool_call_id
    return {"function_response": response}


def to_gemini_tools(tools: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """One Gemini ``Tool`` holding a function declaration per spec, each schema a sanitised
    copy (``gemini_schema``); the caller's schemas are never modified. A tool whose schema
    Gemini cannot express at all is left out: ``Agent`` refuses such a tool at construction
    (``GeminiModel.tool_schema_issues``), so only a direct caller can meet this."""
    declarations: list[dict[str, Any]] = []
    for spec in tools:
        converted = gemini_schema(spec.parameters)
        if converted.fatal:
            continue
        declaration: dict[str, Any] = {"name": spec.name, "description": spec.description}
        if converted.parameters is not None:
            declaration["parameters"] = converted.parameters
        declarations.append(declaration)
    return [{"function_declarations": declarations}] if declarations else []


# --------------------------------------------------------------------------- typed output


def output_config(output: OutputFormat) -> dict[str, Any]:
    """The ``GenerateContentConfig`` fields that hold a reply to ``output``: JSON as the
    ``response_mime_type``, and a copy of the schema, unchanged, as ``response_json_schema``.

    That field takes JSON Schema itself (``$defs``/``$ref``, ``anyOf``, ``enum``, bounds,
    ``additionalProperties``, ...), so the schema needs none of the rewriting ``gemini_schema``
    does for ``response_schema`` and tool parameters, which take Gemini's OpenAPI subset.
    Gemini documents that a whole schema may be sent and the keywords it does not support are
    not enforced; the engine validates every reply against the whole schema anyway."""
    return {
        "response_mime_type": "application/json",
        "response_json_schema": copy.deepcopy(output.schema),
    }


def takes_schema_with_tools(model: str) -> bool:
    """Whether ``model`` takes a response schema and function declarations in one request.

    Gemini 1.x and 2.x refuse the pair with HTTP 400 ("Function calling with a response mime
    type: 'application/json' is unsupported"); Gemini 3 takes it, and so is assumed of any
    other name, as with thought signatures."""
    return _BEFORE_GEMINI_3.search(model) is None


def output_instruction(output: OutputFormat) -> str:
    """``output``'s schema as an instruction, for a request that cannot carry it in its
    config (tools offered to a model that refuses both at once)."""
    schema = json.dumps(output.schema, ensure_ascii=False, separators=(",", ":"))
    return (
        "When you give your final answer (a reply without function calls), reply with only a "
        f"JSON value matching this JSON Schema, with no other text and no code fence: {schema}"
    )


# --------------------------------------------------------------------------- replies


def finish_reason_from(reason: str | None, *, has_calls: bool) -> FinishReason:
    """Map a ``finishReason`` that ends a usable reply (see the module's table); the reasons
    that fail the call are ``ReplyAssembler.build``'s business."""
    if reason in ("MAX_TOKENS", "CONTINUATION"):
        return FinishReason.LENGTH
    if reason in _FILTERED:
        return FinishReason.CONTENT_FILTER
    return FinishReason.TOOL_CALLS if has_calls else FinishReason.STOP


def usage_from(raw: object) -> Usage | None:
    """Convert ``usageMetadata``, counting one request.

    ``input_tokens`` is ``promptTokenCount`` (which includes the cached part,
    ``cachedContentTokenCount``) plus ``toolUsePromptTokenCount``; ``output_tokens`` is
    ``candidatesTokenCount`` plus ``thoughtsTokenCount``, since Gemini bills thinking as output
    but counts it apart, and ``reasoning_tokens`` is the thinking alone. None when no count is
    reported, or a count is not a non-negative integer (the engine then estimates).
    """
    names = (
        "prompt_token_count",
        "tool_use_prompt_token_count",
        "candidates_token_count",
        "thoughts_token_count",
        "cached_content_token_count",
    )
    counts = [field_of(raw, name) for name in names]
    if all(count is None for count in counts[:4]):
        return None
    if not all(count is None or (type(count) is int and count >= 0) for count in counts):
        return None
    prompt, tool_use, candidates, thoughts, cached = (count or 0 for count in counts)
    return Usage(
        input_tokens=prompt + tool_use,
        output_tokens=candidates + thoughts,
        cached_tokens=min(cached, prompt + tool_use),
        reasoning_tokens=thoughts,
        requests=1,
    )


@dataclass(slots=True)
class _Call:
    id: str
    name: str
    arguments: str
    signature: bytes | None


class ReplyAssembler(ReplyReader):
    """Builds one ``ModelResponse`` from ``GenerateContentResponse`` chunks (a whole reply is
    one chunk).

    Text parts are concatenated (thought summaries, ``thought: true``, are not the answer and
    are left out); each ``functionCall`` part, always whole on Gemini's wire, becomes a call
    whose arguments are the JSON text of its ``args`` object. A call without an id is named
    ``<fallback_id_prefix>_<position>`` (``<run_id>_<turn>_<n>``), the same on both paths.
    Usage is the last reported (streams repeat running totals); only the first candidate is
    read. Thought signatures go in ``provider_data["gemini"]``: ``{"calls": [base64 or None
    per call], "text": base64}`` (the text's is the last one on a part that is no call).
    """

    def __init__(self, *, fallback_id_prefix: str) -> None:
        self._prefix = fallback_id_prefix
        self._text: list[str] = []
        self._calls: list[_Call] = []
        self._text_signature: bytes | None = None
        self._finish: str | None = None
        self._finish_message: str | None = None
        self._blocked: str | None = None
        self._usage: Usage | None = None
        self._model: str | None = None
        self._saw_candidate = False
        self._chunks = 0
        self._streamed = False

    def add_reply(self, reply: object) -> None:
        """Add a whole reply: one chunk that is all of it.

        Raises:
            ModelCallError: transient, when the reply is malformed.
        """
        self._add(reply)

    def add_event(self, chunk: object) -> list[ReplyDelta]:
        """Add one streamed chunk; return the fragments to report, in order.

        Raises:
            ModelCallError: transient, when the chunk is malformed.
        """
        self._streamed = True
        return self._add(chunk)

    def _add(self, chunk: object) -> list[ReplyDelta]:
        if chunk is None:
            raise _malformed("empty reply")
        self._chunks += 1
        model = field_of(chunk, "model_version")
        if isinstance(model, str) and model:
            self._model = model
        usage = field_of(chunk, "usage_metadata")
        if usage is not None:
            self._usage = usage_from(usage)
        blocked = _enum_name(field_of(field_of(chunk, "prompt_feedback"), "block_reason"))
        if blocked is not None:
            self._blocked = blocked
        candidates = field_of(chunk, "candidates")
        if candidates is None:
            return []
        if not isinstance(candidates, list):
            raise _malformed("candidates is not a list")
        deltas: list[ReplyDelta] = []
        for candidate in candidates:
            if field_of(candidate, "index") in (0, None):
                deltas.extend(self._add_candidate(candidate))
                break
        return deltas

    def build(self) -> ModelResponse:
        """The assembled response.

        Raises:
            ModelCallError: transient for a reply without candidates (and no blocked prompt),
                a stream that ended without a finish reason (a cut stream looks complete
                otherwise, and its partial text must not become an answer), and the finish
                reasons that leave no usable reply; permanent for MISSING_THOUGHT_SIGNATURE.
        """
        if not self._saw_candidate:
            if self._blocked is not None:
                return self._response(FinishReason.CONTENT_FILTER)
            raise _malformed("the reply has no candidates")
        if self._finish is None and self._streamed:
            raise ModelCallError(
                "the stream ended without a finish reason: the reply was cut off", transient=True
            )
        if self._finish == "MISSING_THOUGHT_SIGNATURE":
            raise ModelCallError(
                self._stopped("a function call lacks its signature"), transient=False
            )
        if self._finish in _RETRYABLE:
            raise ModelCallError(self._stopped("no usable reply"), transient=True)
        return self._response(finish_reason_from(self._finish, has_calls=bool(self._calls)))

    # -- internals

    def _response(self, finish: FinishReason) -> ModelResponse:
        calls = tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments) for c in self._calls)
        message = AssistantMessage(
            content="".join(self._text), tool_calls=calls, provider_data=self._provider_data()
        )
        return ModelResponse(
            message=message,
            finish_reason=finish,
            usage=self._usage,
            model_name=self._model,
        )

    def _provider_data(self) -> dict[str, JsonValue] | None:
        signed: dict[str, JsonValue] = {}
        if any(c.signature is not None for c in self._calls):
            signed["calls"] = [_to_base64(c.signature) for c in self._calls]
        if self._text_signature is not None and self._text:
            signed["text"] = _to_base64(self._text_signature)
        return {PROVIDER_KEY: signed} if signed else None

    def _stopped(self, what: str) -> str:
        message = f"Gemini stopped with {self._finish}: {what}"
        if self._finish_message:
            detail = " ".join(self._finish_message.split())[:_MAX_DETAIL_CHARS]
            message += f" ({detail})"
        return message

    def _add_candidate(self, candidate: object) -> list[ReplyDelta]:
        self._saw_candidate = True
        finish = _enum_name(field_of(candidate, "finish_reason"))
        if finish is not None:
            self._finish = finish
        message = field_of(candidate, "finish_message")
        if isinstance(message, str) and message:
            self._finish_message = message
        parts = field_of(field_of(candidate, "content"), "parts")
        if parts is None:
            return []
        if not isinstance(parts, list):
            raise _malformed("content parts is not a list")
        deltas: list[ReplyDelta] = []
        for part in parts:
            delta = self._add_part(part)
            if delta is not None:
                deltas.append(delta)
        return deltas

    def _add_part(self, part: object) -> ReplyDelta | None:
        call = field_of(part, "function_call")
        signature = field_of(part, "thought_signature")
        if call is not None:
            return self._add_call(call, signature)
        if isinstance(signature, bytes) and signature:
            self._text_signature = signature
        text = field_of(part, "text")
        if text is None or field_of(part, "thought") is True:
            return None
        if not isinstance(text, str):
            raise _malformed("text is not a string")
        if not text:
            return None
        self._text.append(text)
        return ReplyDelta(text=text)

    def _add_call(self, call: object, signature: object) -> ReplyDelta:
        name = field_of(call, "name")
        call_id = field_of(call, "id")
        args = field_of(call, "args")
        if not isinstance(name, str) or not name:
            raise _malformed("a function call has no name")
        if call_id is not None and not isinstance(call_id, str):
            raise _malformed("a function call id is not a string")
        if args is not None and not isinstance(args, Mapping):
            raise _malformed("function call args is not an object")
        position = len(self._calls)
        call_id = call_id or f"{self._prefix}_{position}"
        arguments = json.dumps(dict(args or {}), ensure_ascii=False)
        signed = signature if isinstance(signature, bytes) and signature else None
        self._calls.append(_Call(call_id, name, arguments, signed))
        return ReplyDelta(
            tool_call_index=position, tool_call_id=call_id, tool_name=name, arguments=arguments
        )


def _to_base64(signature: bytes | None) -> str | None:
    return None if signature is None else base64.b64encode(signature).decode("ascii")


def _enum_name(value: object) -> str | None:
    """The name of an SDK enum member (``FinishReason.STOP``), or the string itself."""
    if value is None:
        return None
    name = getattr(value, "value", value)
    if not isinstance(name, str):
        raise _malformed(f"unreadable enum value {value!r}")
    return name.upper()


def _malformed(detail: str) -> ModelCallError:
    return malformed(detail, source="Gemini")
