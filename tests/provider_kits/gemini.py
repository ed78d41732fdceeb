"""The Gemini ``generateContent`` wire format (``GeminiModel``), from the server's side.

Replies are written the way the Gemini API writes them: camelCase JSON, a ``model`` turn of
``text`` and ``functionCall`` parts (arguments as an object, an ``id`` only when the call has
one, a ``thoughtSignature`` on the first call, as thinking models send), ``finishReason`` and
``usageMetadata`` with thinking counted apart from the answer; streamed as server-sent events
(``?alt=sse``, CRLF-separated), each a whole ``GenerateContentResponse``, text in pieces and
the finish reason with the last. Errors are ``{"error": {code, message, status, details}}``,
a rate limit's delay in a ``google.rpc.RetryInfo`` detail.

What the wire cannot say: Gemini has no refusal stop (a refusal is an answer: ``STOP``) and
no tool-calls stop (``STOP`` with calls); arguments that are not a JSON object cannot be
written either, so a reply with such a call is sent as Gemini's own answer to a call it could
not parse: ``MALFORMED_FUNCTION_CALL``, with no content.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from google import genai
from google.genai import types

from agent_fsm.messages import FinishReason, ModelResponse, ToolCall, Usage
from agent_fsm.models.base import Model
from agent_fsm.models.gemini import GeminiModel
from agent_fsm.testing.wire import WireReply
from tests.provider_kits.base import FAKE_KEY, http, sdk_target

BASE_URL = "https://gemini.test"
SERVED_MODEL = "gemini-2.5-flash"
RESPONSE_ID = "gJb2aLrSMqC2nvgPz6-Y4Qk"
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"

FINISH = {
    FinishReason.STOP: "STOP",
    FinishReason.TOOL_CALLS: "STOP",
    FinishReason.LENGTH: "MAX_TOKENS",
    FinishReason.CONTENT_FILTER: "SAFETY",
    FinishReason.REFUSAL: "STOP",
}
STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def signature_for(call: ToolCall) -> str:
    """The (fake, deterministic) thought signature the kit puts on a reply's first call:
    opaque bytes in standard base64, as the API writes them."""
    return base64.b64encode(b"\xfb\xff" + f"sig:{call.name}:{call.id}".encode()).decode()


def usage_metadata(usage: Usage) -> dict[str, Any]:
    """``usageMetadata`` as Gemini reports it: thinking apart from the answer, zero counts
    left out, and ``promptTokenCount`` including the cached part."""
    thoughts = min(usage.reasoning_tokens, usage.output_tokens)
    candidates = usage.output_tokens - thoughts
    meta: dict[str, Any] = {"promptTokenCount": usage.input_tokens}
    if candidates:
        meta["candidatesTokenCount"] = candidates
    meta["totalTokenCount"] = usage.input_tokens + usage.output_tokens
    if usage.cached_tokens:
        meta["cachedContentTokenCount"] = usage.cached_tokens
    if thoughts:
        meta["thoughtsTokenCount"] = thoughts
    return meta


def call_part(call: ToolCall, *, first: bool) -> dict[str, Any] | None:
    """A ``functionCall`` part, or None when the arguments are no JSON object."""
    try:
        args = json.loads(call.arguments)
    except ValueError:
        return None
    if type(args) is not dict:
        return None
    function: dict[str, Any] = {"name": call.name, "args": args}
    if call.id:
        function["id"] = call.id
    part: dict[str, Any] = {"functionCall": function}
    if first:
        part["thoughtSignature"] = signature_for(call)
    return part


def candidate(
    parts: list[dict[str, Any]], finish: str | None, *, message: str | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if parts:
        out["content"] = {"parts": parts, "role": "model"}
    if finish is not None:
        out["finishReason"] = finish
    if message is not None:
        out["finishMessage"] = message
    out["index"] = 0
    return out


def chunk(cand: dict[str, Any], usage: dict[str, Any] | None, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {"candidates": [cand]}
    if usage is not None:
        body["usageMetadata"] = usage
    body["modelVersion"] = model
    body["responseId"] = RESPONSE_ID
    return body


def sse(chunks: list[dict[str, Any]]) -> bytes:
    """Gemini's server-sent events: ``data: <json>`` frames separated by CRLF CRLF."""
    return "".join(f"data: {json.dumps(c)}\r\n\r\n" for c in chunks).encode()


def pieces(text: str) -> list[str]:
    """``text`` cut in up to three pieces, as a stream delivers it."""
    if len(text) < 3:
        return [text] if text else []
    third = len(text) // 3
    return [text[:third], text[third : 2 * third], text[2 * third :]]


def reply_chunks(response: ModelResponse, *, stream: bool) -> list[dict[str, Any]]:
    """The ``GenerateContentResponse`` objects for ``response``: one whole, or a stream."""
    message = response.message
    model = response.model_name or SERVED_MODEL
    usage = None if response.usage is None else usage_metadata(response.usage)
    calls = [call_part(c, first=i == 0) for i, c in enumerate(message.tool_calls)]
    if any(part is None for part in calls):
        bad = next(c for c, p in zip(message.tool_calls, calls, strict=True) if p is None)
        text = f"Malformed function call: {bad.name}({bad.arguments})"
        return [chunk(candidate([], "MALFORMED_FUNCTION_CALL", message=text), usage, model)]
    finish = FINISH[response.finish_reason]
    call_parts = [part for part in calls if part is not None]
    if not stream:
        parts = ([{"text": message.content}] if message.content else []) + call_parts
        return [chunk(candidate(parts, finish), usage, model)]
    running = None if usage is None else {"promptTokenCount": usage["promptTokenCount"]}
    steps: list[list[dict[str, Any]]] = [[{"text": p}] for p in pieces(message.content)]
    steps += [[part] for part in call_parts]
    if not steps:
        steps = [[]]
    out = [chunk(candidate(parts, None), running, model) for parts in steps[:-1]]
    out.append(chunk(candidate(steps[-1], finish), usage, model))
    return out


def duration(seconds: float) -> str:
    """A protobuf JSON duration: ``"7s"``, ``"0.5s"``."""
    return f"{seconds:.9f}".rstrip("0").rstrip(".") + "s"


def sdk_http(client: Any) -> Any:
    """``client`` as the installed SDK can take it: itself, or, for an SDK built on httpx
    alone (google-genai before 3.0) given an httpx2 client, an httpx client that forwards
    every request to it."""
    try:
        types.HttpOptions(httpx_async_client=client)
    except ValueError:  # pydantic's ValidationError: not the HTTP library the SDK knows
        import httpx

        return httpx.AsyncClient(transport=_Forward(client, httpx))
    return client


class _Forward:
    """An httpx transport that sends each request through another HTTP library's client
    (the kit's ``http``), translating the request, the response and its errors."""

    def __init__(self, client: Any, httpx: Any) -> None:
        self._client = client
        self._httpx = httpx

    async def handle_async_request(self, request: Any) -> Any:
        inner = http.Request(
            request.method,
            str(request.url),
            headers=list(request.headers.multi_items()),
            content=await request.aread(),
        )
        try:
            response = await self._client.send(inner)
        except http.HTTPError as exc:
            kind = getattr(self._httpx, type(exc).__name__, self._httpx.TransportError)
            raise kind(str(exc), request=request) from None
        return self._httpx.Response(
            response.status_code,
            headers=list(response.headers.multi_items()),
            content=await response.aread(),
        )

    async def aclose(self) -> None:
        await self._client.aclose()


class GeminiKit:
    name = "gemini"
    finish_reasons = frozenset(
        {
            FinishReason.STOP,
            FinishReason.TOOL_CALLS,
            FinishReason.LENGTH,
            FinishReason.CONTENT_FILTER,
        }
    )
    carries_raw_arguments = False
    can_omit_usage = True

    def build(self, where: Any, *, stream: bool = False, api_key: str = FAKE_KEY) -> Model:
        base_url, client = sdk_target(where, BASE_URL)
        if client is None:  # the adapter builds its own client, one per event loop
            return GeminiModel(SERVED_MODEL, base_url=base_url, api_key=api_key, stream=stream)
        options = types.HttpOptions(base_url=base_url, httpx_async_client=sdk_http(client))
        sdk = genai.Client(vertexai=False, api_key=api_key, http_options=options)
        return GeminiModel(SERVED_MODEL, client=sdk, stream=stream)

    def reply(self, response: ModelResponse, *, stream: bool = False) -> WireReply:
        chunks = reply_chunks(response, stream=stream)
        if not stream:
            return WireReply.json(chunks[0])
        return WireReply.events(sse(chunks))

    def error(self, status: int, message: str, *, retry_after: float | None = None) -> WireReply:
        error: dict[str, Any] = {
            "code": status,
            "message": message,
            "status": STATUS.get(status, "UNKNOWN"),
        }
        if retry_after is not None:
            error["details"] = [{"@type": RETRY_INFO, "retryDelay": duration(retry_after)}]
        return WireReply.json({"error": error}, status=status)

    def tool_results(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        results = []
        for content in body["contents"]:
            for part in content["parts"]:
                response = part.get("functionResponse")
                if response is not None:
                    payload = response["response"]
                    text = payload.get("output", payload.get("error"))
                    results.append((response.get("id", response["name"]), str(text)))
        return results

    def system_prompt(self, body: dict[str, Any]) -> str | None:
        instruction = body.get("systemInstruction")
        if instruction is None:
            return None
        return "".join(part.get("text", "") for part in instruction["parts"])


KIT = GeminiKit()
