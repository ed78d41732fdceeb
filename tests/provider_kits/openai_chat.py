"""The Chat Completions wire format (``OpenAIChatModel``), from the server's side."""

from __future__ import annotations

from typing import Any

import openai

from agent_fsm.messages import FinishReason, ModelResponse, Usage
from agent_fsm.models.base import Model
from agent_fsm.models.openai_chat import OpenAIChatModel
from agent_fsm.testing.wire import WireReply
from tests.openai_payloads import api_error, chunks_for, completion, sse, tool_call
from tests.provider_kits.base import FAKE_KEY, sdk_target

_FINISH = {
    FinishReason.STOP: "stop",
    FinishReason.TOOL_CALLS: "tool_calls",
    FinishReason.LENGTH: "length",
    FinishReason.CONTENT_FILTER: "content_filter",
    FinishReason.REFUSAL: "stop",  # the API says "stop", and puts the text in `refusal`
}


def _usage(usage: Usage | None) -> dict[str, Any] | None:
    if usage is None:
        return None
    return {
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    }


class OpenAIChatKit:
    name = "openai"
    finish_reasons = frozenset(FinishReason)
    carries_raw_arguments = True
    can_omit_usage = True

    def build(self, where: Any, *, stream: bool = False, api_key: str = FAKE_KEY) -> Model:
        base_url, client = sdk_target(where, "https://api.test", "/v1")
        if client is None:  # the adapter builds its own client, one per event loop
            return OpenAIChatModel("gpt-4o-mini", base_url=base_url, api_key=api_key, stream=stream)
        sdk = openai.AsyncOpenAI(api_key=api_key, base_url=base_url, http_client=client)
        return OpenAIChatModel("gpt-4o-mini", client=sdk, stream=stream)

    def reply(self, response: ModelResponse, *, stream: bool = False) -> WireReply:
        message = response.message
        refused = response.finish_reason is FinishReason.REFUSAL
        payload = completion(
            None if refused else (message.content or None),
            refusal=message.content if refused else None,
            tool_calls=[tool_call(c.id, c.name, c.arguments) for c in message.tool_calls] or None,
            finish_reason=_FINISH[response.finish_reason],
            usage=_usage(response.usage),
        )
        if response.model_name is not None:
            payload["model"] = response.model_name
        if not stream:
            return WireReply.json(payload)
        return WireReply.events(sse(chunks_for(payload)))

    def error(self, status: int, message: str, *, retry_after: float | None = None) -> WireReply:
        kind = {401: "invalid_request_error", 429: "rate_limit_error"}.get(status, "api_error")
        headers = {} if retry_after is None else {"retry-after": f"{retry_after:g}"}
        return WireReply.json(api_error(message, type_=kind), status=status, headers=headers)

    def tool_results(self, body: dict[str, Any]) -> list[tuple[str, str]]:
        return [(m["tool_call_id"], m["content"]) for m in body["messages"] if m["role"] == "tool"]

    def system_prompt(self, body: dict[str, Any]) -> str | None:
        first = body["messages"][0]
        return str(first["content"]) if first["role"] == "system" else None


KIT = OpenAIChatKit()
