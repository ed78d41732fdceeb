"""Chat Completions payloads shaped like the real API's, for tests/test_openai_chat.py.

``completion(...)`` builds a whole ``chat.completion`` reply; ``chunks_for(...)`` splits the
same reply into the ``chat.completion.chunk`` sequence a streaming server sends for it (role
chunk, text pieces, tool-call fragments with id and name first, a finish chunk, then the
``include_usage`` chunk with empty choices), so a test can check both paths agree.
"""

from __future__ import annotations

import copy
import json
from typing import Any

COMPLETION_ID = "chatcmpl-AgentFsmTest0001"
SERVED_MODEL = "gpt-4o-mini-2024-07-18"
CREATED = 1_733_000_000
FINGERPRINT = "fp_0aa8d3e20b"

USAGE: dict[str, Any] = {
    "prompt_tokens": 82,
    "completion_tokens": 17,
    "total_tokens": 99,
    "prompt_tokens_details": {"cached_tokens": 64, "audio_tokens": 0},
    "completion_tokens_details": {
        "reasoning_tokens": 5,
        "audio_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    },
}


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """One entry of ``message.tool_calls``."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def completion(
    content: str | None = None,
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    function_call: dict[str, str] | None = None,
    refusal: str | None = None,
    finish_reason: str | None = "stop",
    usage: dict[str, Any] | None = USAGE,
) -> dict[str, Any]:
    """A whole ``chat.completion`` reply, as the API returns it."""
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": refusal,
        "annotations": [],
    }
    if tool_calls is not None:
        message["tool_calls"] = tool_calls
    if function_call is not None:
        message["function_call"] = function_call
    return {
        "id": COMPLETION_ID,
        "object": "chat.completion",
        "created": CREATED,
        "model": SERVED_MODEL,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}
        ],
        "usage": copy.deepcopy(usage),
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
    }


def _chunk(delta: dict[str, Any] | None, finish_reason: str | None = None) -> dict[str, Any]:
    choices = (
        []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    )
    return {
        "id": COMPLETION_ID,
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": SERVED_MODEL,
        "service_tier": "default",
        "system_fingerprint": FINGERPRINT,
        "choices": choices,
        "usage": None,
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def chunks_for(reply: dict[str, Any], *, piece: int = 4) -> list[dict[str, Any]]:
    """The chunks a streaming server sends for ``reply`` (a ``completion(...)`` result).

    Text and argument strings are cut into ``piece``-character fragments, so a tool call's
    arguments always span several chunks.
    """
    choice = reply["choices"][0]
    message = choice["message"]
    chunks = [_chunk({"role": "assistant", "content": "", "refusal": None})]
    for text in _pieces(message.get("content") or "", piece):
        chunks.append(_chunk({"content": text}))
    for text in _pieces(message.get("refusal") or "", piece):
        chunks.append(_chunk({"refusal": text}))
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        head = {"name": function["name"], "arguments": ""}
        first = {"index": index, "id": call["id"], "type": "function", "function": head}
        chunks.append(_chunk({"tool_calls": [first]}))
        for text in _pieces(function["arguments"], piece):
            chunks.append(
                _chunk({"tool_calls": [{"index": index, "function": {"arguments": text}}]})
            )
    legacy = message.get("function_call")
    if legacy is not None:
        chunks.append(_chunk({"function_call": {"name": legacy["name"], "arguments": ""}}))
        for text in _pieces(legacy["arguments"], piece):
            chunks.append(_chunk({"function_call": {"arguments": text}}))
    chunks.append(_chunk({}, choice["finish_reason"]))
    if reply.get("usage") is not None:
        final = _chunk(None)
        final["usage"] = copy.deepcopy(reply["usage"])
        chunks.append(final)
    return chunks


def sse(events: list[dict[str, Any]], *, done: bool = True) -> bytes:
    """Server-sent events as the API frames them, ending with ``[DONE]``."""
    body = "".join(f"data: {json.dumps(event)}\n\n" for event in events)
    if done:
        body += "data: [DONE]\n\n"
    return body.encode()


def api_error(message: str, *, type_: str, code: str | None = None) -> dict[str, Any]:
    """An error body as the API sends it with a 4xx/5xx status."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}
