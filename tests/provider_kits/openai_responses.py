"""The OpenAI Responses wire format (``OpenAIResponsesModel``), from the server's side.

The payload builders here write what ``POST /responses`` returns: a ``response`` object with
typed ``output`` items (``message`` with ``output_text`` or ``refusal`` parts, ``function_call``,
``reasoning``), and, streamed, the typed server-sent events the API sends for it
(``response.created``, ``response.output_item.added``, ``response.output_text.delta``,
``response.function_call_arguments.delta``/``.done``, ``response.output_item.done``, ...,
then ``response.completed`` or ``response.incomplete`` carrying the whole response), each
framed with its ``event:`` line and a ``sequence_number``. ``tests/test_openai_responses.py``
builds its replies with them too.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import openai

from agent_fsm.messages import FinishReason, ModelResponse, Usage
from agent_fsm.models.base import Model
from agent_fsm.models.openai_responses import OpenAIResponsesModel
from agent_fsm.models.openai_responses_convert import PROVIDER_KEY
from agent_fsm.testing.wire import WireReply
from tests.provider_kits.base import FAKE_KEY, sdk_target

RESPONSE_ID = "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b"
SERVED_MODEL = "gpt-4.1-mini-2025-04-14"
CREATED_AT = 1_741_476_542

USAGE: dict[str, Any] = {
    "input_tokens": 82,
    "input_tokens_details": {"cached_tokens": 64},
    "output_tokens": 17,
    "output_tokens_details": {"reasoning_tokens": 5},
    "total_tokens": 99,
}


# --------------------------------------------------------------------------- payloads


def message_item(
    text: str | None = None, *, refusal: str | None = None, item_id: str = "msg_0001"
) -> dict[str, Any]:
    """An assistant ``message`` output item: text, or a refusal."""
    if refusal is not None:
        part: dict[str, Any] = {"type": "refusal", "refusal": refusal}
    else:
        part = {"type": "output_text", "text": text or "", "annotations": [], "logprobs": []}
    return {
        "id": item_id,
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [part],
    }


def function_call_item(
    call_id: str, name: str, arguments: str, *, item_id: str | None = None
) -> dict[str, Any]:
    """A ``function_call`` output item."""
    return {
        "id": item_id or f"fc_{call_id}",
        "type": "function_call",
        "status": "completed",
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
    }


def reasoning_item(
    item_id: str = "rs_0001", *, encrypted: str | None = "gAAAAB-opaque", summary: str = ""
) -> dict[str, Any]:
    """A ``reasoning`` output item (``encrypted_content`` when ``include`` asked for it)."""
    item: dict[str, Any] = {
        "id": item_id,
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": summary}] if summary else [],
    }
    if encrypted is not None:
        item["encrypted_content"] = encrypted
    return item


def response_payload(
    output: list[dict[str, Any]],
    *,
    status: str | None = "completed",
    incomplete: str | None = None,
    usage: dict[str, Any] | None = USAGE,
    error: dict[str, Any] | None = None,
    model: str = SERVED_MODEL,
) -> dict[str, Any]:
    """A whole ``response`` object, as ``POST /responses`` returns it."""
    return {
        "id": RESPONSE_ID,
        "object": "response",
        "created_at": CREATED_AT,
        "status": status,
        "background": False,
        "error": error,
        "incomplete_details": None if incomplete is None else {"reason": incomplete},
        "instructions": None,
        "max_output_tokens": None,
        "model": model,
        "output": copy.deepcopy(output),
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "service_tier": "default",
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": copy.deepcopy(usage),
        "user": None,
        "metadata": {},
    }


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _message_events(index: int, item: dict[str, Any], piece: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    events = [{"type": "response.output_item.added", **where, "item": {**item, "content": []}}]
    for part_index, part in enumerate(item["content"]):
        kind = "refusal" if part["type"] == "refusal" else "output_text"
        key = "refusal" if kind == "refusal" else "text"
        at = {**where, "content_index": part_index}
        events.append({"type": "response.content_part.added", **at, "part": {**part, key: ""}})
        for text in _pieces(part[key], piece):
            events.append({"type": f"response.{kind}.delta", **at, "delta": text})
        events.append({"type": f"response.{kind}.done", **at, key: part[key]})
        events.append({"type": "response.content_part.done", **at, "part": part})
    return events


def _call_events(index: int, item: dict[str, Any], piece: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    added = {**item, "status": "in_progress", "arguments": ""}
    events = [{"type": "response.output_item.added", "output_index": index, "item": added}]
    for text in _pieces(item["arguments"], piece):
        events.append({"type": "response.function_call_arguments.delta", **where, "delta": text})
    events.append(
        {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]}
    )
    return events


def _reasoning_events(index: int, item: dict[str, Any], piece: int) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    added = {"id": item["id"], "type": "reasoning", "summary": []}
    events = [{"type": "response.output_item.added", "output_index": index, "item": added}]
    for summary_index, part in enumerate(item["summary"]):
        at = {**where, "summary_index": summary_index}
        for text in _pieces(part["text"], piece):
            events.append({"type": "response.reasoning_summary_text.delta", **at, "delta": text})
    return events


def events_for(payload: dict[str, Any], *, piece: int = 4) -> list[dict[str, Any]]:
    """The events a streaming server sends for ``payload`` (a ``response_payload(...)``):
    text and argument strings cut into ``piece``-character deltas."""
    opening = {**payload, "status": "in_progress", "output": [], "usage": None}
    opening["incomplete_details"] = None
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": opening},
        {"type": "response.in_progress", "response": opening},
    ]
    makers = {"message": _message_events, "function_call": _call_events}
    for index, item in enumerate(payload["output"]):
        events += makers.get(item["type"], _reasoning_events)(index, item, piece)
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    terminal = {"incomplete": "response.incomplete", "failed": "response.failed"}
    events.append(
        {"type": terminal.get(payload["status"], "response.completed"), "response": payload}
    )
    return [{**event, "sequence_number": n} for n, event in enumerate(events)]


def sse(events: list[dict[str, Any]]) -> bytes:
    """Server-sent events as the API frames them: an ``event:`` line naming each one's type.
    (The Responses API sends no ``[DONE]``: the terminal event ends the stream.)"""
    return "".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n" for event in events
    ).encode()


def api_error(message: str, *, type_: str, code: str | None = None) -> dict[str, Any]:
    """An error body as the API sends it with a 4xx/5xx status."""
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


# --------------------------------------------------------------------------- the kit


_STATUS = {
    FinishReason.STOP: ("completed", None),
    FinishReason.TOOL_CALLS: ("completed", None),
    FinishReason.REFUSAL: ("completed", None),  # a `refusal` content part says it
    FinishReason.LENGTH: ("incomplete", "max_output_tokens"),
    FinishReason.CONTENT_FILTER: ("incomplete", "content_filter"),
}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens},
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.input_tokens + usage.output_tokens,
    }


def output_for(response: ModelResponse) -> list[dict[str, Any]]:
    """The output items of ``response``: laid out as its ``provider_data`` says (reasoning
    items where they were), else its text first, then its calls."""
    message = response.message
    if response.finish_reason is FinishReason.REFUSAL:
        text = [message_item(refusal=message.content)]
    else:
        text = [message_item(message.content)] if message.content else []
    calls = [function_call_item(c.id, c.name, c.arguments) for c in message.tool_calls]
    data = (message.provider_data or {}).get(PROVIDER_KEY)
    layout = data.get("output") if isinstance(data, dict) else None
    if not isinstance(layout, list):
        return text + calls
    output: list[dict[str, Any]] = []
    for entry in layout:
        assert isinstance(entry, dict)
        if entry["type"] == "reasoning":
            output.append(dict(entry))
        elif entry["type"] == "message" and text:
            output.append({**text.pop(), "id": entry["id"]})
        elif entry["type"] == "function_call":
            index = entry["index"]
            assert isinstance(index, int)
            output.append(calls[index])
    return text + output


class OpenAIResponsesKit:
    name = "openai-responses"
    finish_reasons = frozenset(FinishReason)
    carries_raw_arguments = True  # `arguments` is the model's text, JSON or not
    can_omit_usage = True

    def build(self, where: Any, *, stream: bool = False, api_key: str = FAKE_KEY) -> Model:
        base_url, client = sdk_target(where, "https://api.test", "/v1")
        if client is None:  # the adapter builds its own client, one per event loop
            return OpenAIResponsesModel(
                "gpt-4.1-mini", base_url=base_url, api_key=api_key, stream=stream
            )
        sdk = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, http_client=client)
        return OpenAIResponsesModel("gpt-4.1-mini", client=sdk, stream=stream)

    def reply(self, response: ModelResponse, *, stream: bool = False) -> WireReply:
        status, reason = _STATUS[response.finish_reason]
        payload = response_payload(
            output_for(response),
            status=status,
            incomplete=reason,
            usage=_usage(response.usage),
            model=response.model_name or SERVED_MODEL,
        )
        if not stream:
            return WireReply.json(payload)
        return WireReply.events(sse(events_for(payload)))

    def error(self, status: int, message: str, *, retry_after: float | None = None) -> WireReply:
        kind, code = {
            401: ("invalid_request_error", "invalid_api_key"),
            429: ("requests", "rate_limit_exceeded"),
        }.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
        headers = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
        body = api_error(message, type_=kind, code=code)
        return WireReply.json(body, status=status, headers=headers)

    def tool_results(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        return [
            (item["call_id"], item["output"])
            for item in body["input"]
            if item.get("type") == "function_call_output"
        ]

    def system_prompt(self, body: dict[str, Any]) -> str | None:
        instructions = body.get("instructions")
        return instructions if isinstance(instructions, str) else None


KIT = OpenAIResponsesKit()
