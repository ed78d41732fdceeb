"""``OpenAIResponsesModel`` against a server like llama-server's ``/v1/responses`` (issue 35,
point 4): through the openai SDK to ``tests.local_server`` on 127.0.0.1, which refuses an
input item without a ``type`` (HTTP 400, as llama-server does) and streams events without
``output_index``. Strict in what is sent, tolerant in what is read; a malformed stream is no
transient failure."""

from __future__ import annotations

from typing import Any

from agent_fsm import Agent, Limits, StopReason, tool
from agent_fsm.models.openai_responses import OpenAIResponsesModel
from tests.local_server import LocalServer
from tests.provider_kits.openai_responses import (
    api_error,
    events_for,
    function_call_item,
    message_item,
    response_payload,
    sse,
)

UNTYPED = "Cannot determine type of 'item'"


def typed_items_only(headers: dict[str, str], body: dict[str, Any]) -> tuple[int, Any] | None:
    """llama-server's check: every input item must say its type."""
    if any("type" not in item for item in body.get("input", [])):
        return 400, api_error(UNTYPED, type_="invalid_request_error")
    return None


def without_output_index(payload: dict[str, Any]) -> bytes:
    """The stream llama-server sends for ``payload``: no event has ``output_index``."""
    events = [
        {key: value for key, value in event.items() if key != "output_index"}
        for event in events_for(payload)
    ]
    return sse(events)


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


async def no_sleep(seconds: float) -> None:
    """Backoff that does not wait."""


def _agent(base_url: str, **limits: Any) -> Agent:
    model = OpenAIResponsesModel("local", base_url=base_url, api_key="sk-local", stream=True)
    return Agent(model=model, tools=[get_weather], sleep=no_sleep, limits=Limits(**limits))


async def test_a_tool_run_finishes_on_a_llama_like_responses_server() -> None:
    server = LocalServer(refuse=typed_items_only)
    async with server as base_url:
        call = function_call_item("call_1", "get_weather", '{"city": "Paris"}')
        server.raw(
            200,
            {"content-type": "text/event-stream"},
            without_output_index(response_payload([message_item("Checking."), call])),
        )
        server.raw(
            200,
            {"content-type": "text/event-stream"},
            without_output_index(response_payload([message_item("Sunny in Paris.")])),
        )
        agent = _agent(base_url)
        async with agent.model:  # type: ignore[attr-defined]
            result = await agent.run("Weather in Paris?")
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.output == "Sunny in Paris."
    assert len(server.seen) == 2
    second = server.bodies[1]["input"]
    assert all("type" in item for item in second)
    assert second[0] == {"type": "message", "role": "user", "content": "Weather in Paris?"}
    assert {"type": "message", "role": "assistant", "content": "Checking."} in second


async def test_a_malformed_stream_is_not_retried() -> None:
    server = LocalServer()
    async with server as base_url:
        events = events_for(response_payload([message_item("Hello.")]))
        bad = [
            {**event, "output_index": "zero"} if "output_index" in event else event
            for event in events
        ]
        for _ in range(3):
            server.raw(200, {"content-type": "text/event-stream"}, sse(bad))
        agent = _agent(base_url, model_retries=2)
        async with agent.model:  # type: ignore[attr-defined]
            result = await agent.run("Hi?")
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert "malformed" in (result.error or "")
    assert len(server.seen) == 1  # permanent: no generation paid for twice
