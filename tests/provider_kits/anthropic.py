"""The Anthropic Messages wire format (``AnthropicModel``), from the server's side.

Replies are written the way ``POST /v1/messages`` writes them: a ``message`` object whose
``content`` is a text block and one ``tool_use`` block per call (``input`` an object),
``stop_reason`` and ``usage`` with the cached input counted apart from ``input_tokens``
(``cache_read_input_tokens``) and thinking in ``output_tokens_details``. Streamed, they are
named server-sent events: ``message_start`` (input counts), per block ``content_block_start``
/ ``content_block_delta`` (``text_delta`` pieces; ``input_json_delta`` pieces of the argument
text, the first one empty as the API sends it) / ``content_block_stop``, a ``ping``, then
``message_delta`` (stop reason, output counts) and ``message_stop``. Errors are
``{"type": "error", "error": {"type", "message"}, "request_id"}`` with a ``request-id``
header, and ``retry-after`` when the server gives one.

What the wire cannot say: Anthropic has no content-filter stop (a stop by its classifiers is
``refusal``), so CONTENT_FILTER is written as ``refusal``. A whole reply's ``input`` is always
an object: a call whose arguments are no JSON object (a cut stream) is written with ``{}``;
a stream carries the raw text, as it does when ``max_tokens`` cuts a call.
The API always reports usage; a reply given none is written without it, as a compatible
server that counts nothing would.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from agent_fsm.messages import FinishReason, ModelResponse, ToolCall, Usage
from agent_fsm.models.anthropic_messages import AnthropicModel
from agent_fsm.models.base import Model
from agent_fsm.testing.wire import WireReply
from tests.provider_kits.base import FAKE_KEY, sdk_target, sse_body

BASE_URL = "https://anthropic.test"
SERVED_MODEL = "claude-sonnet-4-6"
MESSAGE_ID = "msg_01XFDUDYJgAACzvnptvVoYEL"
REQUEST_ID = "req_011CSHoEeqs5C35K2UUqR7Fy"

STOP_REASON = {
    FinishReason.STOP: "end_turn",
    FinishReason.TOOL_CALLS: "tool_use",
    FinishReason.LENGTH: "max_tokens",
    FinishReason.CONTENT_FILTER: "refusal",
    FinishReason.REFUSAL: "refusal",
}
ERROR_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def usage_json(usage: Usage) -> dict[str, Any]:
    """``usage`` as the API reports it: ``input_tokens`` without the cached part."""
    out: dict[str, Any] = {
        "input_tokens": max(usage.input_tokens - usage.cached_tokens, 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
        "output_tokens": usage.output_tokens,
        "service_tier": "standard",
    }
    if usage.reasoning_tokens:
        out["output_tokens_details"] = {"thinking_tokens": usage.reasoning_tokens}
    return out


def tool_input(call: ToolCall) -> dict[str, Any]:
    """A call's ``input`` object; ``{}`` for arguments that are no JSON object."""
    try:
        value = json.loads(call.arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def message_json(
    content: list[dict[str, Any]],
    stop_reason: str | None,
    usage: dict[str, Any] | None,
    *,
    model: str = SERVED_MODEL,
) -> dict[str, Any]:
    """A whole ``message`` object."""
    body: dict[str, Any] = {
        "id": MESSAGE_ID,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
    }
    if stop_reason == "refusal":
        body["stop_details"] = {"type": "refusal", "category": None, "explanation": None}
    if usage is not None:
        body["usage"] = usage
    return body


def pieces(text: str) -> list[str]:
    """``text`` cut in up to three pieces, as a stream delivers it."""
    if len(text) < 3:
        return [text] if text else []
    third = len(text) // 3
    return [text[:third], text[third : 2 * third], text[2 * third :]]


def stream_events(
    message: dict[str, Any], *, raw_arguments: list[str] | None = None
) -> list[tuple[str | None, dict[str, Any]]]:
    """The events that stream ``message`` (a ``message_json``); ``raw_arguments`` gives the
    argument text of each call in order, streamed as it is (default: its ``input`` as JSON)."""
    raw = list(raw_arguments or [])
    usage = message.get("usage")
    start = {**message, "content": [], "stop_reason": None}
    start.pop("stop_details", None)
    if usage is not None:
        start["usage"] = {**usage, "output_tokens": 1}
        start["usage"].pop("output_tokens_details", None)
    events: list[tuple[str | None, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start})
    ]
    for index, block in enumerate(message["content"]):
        text = None
        if block["type"] == "tool_use":
            text = raw.pop(0) if raw else json.dumps(block["input"])
        events += _block_events(index, block, text)
        if index == 0:
            events.append(("ping", {"type": "ping"}))
    delta: dict[str, Any] = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    if "stop_details" in message:
        delta["stop_details"] = message["stop_details"]
    final: dict[str, Any] = {"type": "message_delta", "delta": delta}
    if usage is not None:
        final["usage"] = {
            key: usage[key] for key in ("output_tokens", "output_tokens_details") if key in usage
        }
    events += [("message_delta", final), ("message_stop", {"type": "message_stop"})]
    return events


def _block_events(
    index: int, block: dict[str, Any], arguments: str | None
) -> list[tuple[str | None, dict[str, Any]]]:
    kind = block["type"]
    if kind == "text":
        opening: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": p} for p in pieces(block["text"])]
    elif kind == "tool_use":
        opening = {**block, "input": {}}
        parts = ["", *pieces(arguments or "")]
        deltas = [{"type": "input_json_delta", "partial_json": p} for p in parts]
    elif kind == "thinking":
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [{"type": "thinking_delta", "thinking": p} for p in pieces(block["thinking"])]
        deltas.append({"type": "signature_delta", "signature": block["signature"]})
    else:
        opening, deltas = block, []
    events: list[tuple[str | None, dict[str, Any]]] = [
        (
            "content_block_start",
            {"type": "content_block_start", "index": index, "content_block": opening},
        )
    ]
    events += [
        ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": d})
        for d in deltas
    ]
    events.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    return events


def sse_response(events: list[tuple[str | None, dict[str, Any]]]) -> WireReply:
    return WireReply.events(sse_body(events), headers={"request-id": REQUEST_ID})


class AnthropicKit:
    name = "anthropic"
    finish_reasons = frozenset(
        {FinishReason.STOP, FinishReason.TOOL_CALLS, FinishReason.LENGTH, FinishReason.REFUSAL}
    )
    carries_raw_arguments = True  # in a stream, as partial_json
    can_omit_usage = False

    def build(self, where: Any, *, stream: bool = False, api_key: str = FAKE_KEY) -> Model:
        base_url, client = sdk_target(where, BASE_URL)
        if client is None:  # the adapter builds its own client, one per event loop
            return AnthropicModel(SERVED_MODEL, base_url=base_url, api_key=api_key, stream=stream)
        sdk = anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, http_client=client)
        return AnthropicModel(SERVED_MODEL, client=sdk, stream=stream)

    def reply(self, response: ModelResponse, *, stream: bool = False) -> WireReply:
        message = response.message
        content: list[dict[str, Any]] = []
        if message.content:
            content.append({"type": "text", "text": message.content})
        for call in message.tool_calls:
            content.append(
                {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call)}
            )
        usage = None if response.usage is None else usage_json(response.usage)
        body = message_json(
            content,
            STOP_REASON[response.finish_reason],
            usage,
            model=response.model_name or SERVED_MODEL,
        )
        if not stream:
            return WireReply.json(body, headers={"request-id": REQUEST_ID})
        raw = [call.arguments for call in message.tool_calls]
        return sse_response(stream_events(body, raw_arguments=raw))

    def error(self, status: int, message: str, *, retry_after: float | None = None) -> WireReply:
        body = {
            "type": "error",
            "error": {"type": ERROR_TYPE.get(status, "api_error"), "message": message},
            "request_id": REQUEST_ID,
        }
        headers = {"request-id": REQUEST_ID}
        if retry_after is not None:
            headers["retry-after"] = f"{retry_after:g}"
        return WireReply.json(body, status=status, headers=headers)

    def tool_results(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        results = []
        for message in body["messages"]:
            if message["role"] != "user" or isinstance(message["content"], str):
                continue
            for block in message["content"]:
                if block["type"] == "tool_result":
                    content = block.get("content", "")
                    if isinstance(content, list):
                        content = "".join(part.get("text", "") for part in content)
                    results.append((block["tool_use_id"], content))
        return results

    def system_prompt(self, body: dict[str, Any]) -> str | None:
        system = body.get("system")
        if system is None or isinstance(system, str):
            return system
        return "".join(block.get("text", "") for block in system)


KIT = AnthropicKit()
