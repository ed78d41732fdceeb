"""The Anthropic Messages adapter, exercised through the real SDK and a mock transport.

No test touches the network: the SDK gets an HTTP client whose transport is a FakeServer
(or, for the lazily built client, a tiny server on 127.0.0.1), answering in the API's own
shapes (``tests/provider_kits/anthropic.py``). The live test runs only when
AGENT_FSM_LIVE_ANTHROPIC_API_KEY is set.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import os
import traceback
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import pytest
from structlog.testing import capture_logs

from agent_fsm import Agent, Limits, StopReason, tool
from agent_fsm.errors import ConfigError, ToolSchemaWarning
from agent_fsm.events import Event, MessageUpdated, ModelFailed
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelRequest,
    ModelResponse,
    ReplyDelta,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSpec,
    ToolStatus,
    TranscriptView,
    Usage,
    UserMessage,
)
from agent_fsm.models.anthropic_convert import anthropic_schema, to_anthropic_prompt, wire_id
from agent_fsm.models.anthropic_messages import (
    DEFAULT_MAX_TOKENS,
    MAX_CONTINUATIONS,
    AnthropicModel,
)
from agent_fsm.models.anthropic_reply import AnthropicReply, finish_reason_from, usage_from
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.models.stainless import parameter_names
from agent_fsm.tools.tool import Tool
from tests.local_server import LocalServer
from tests.provider_kits.anthropic import (
    KIT,
    REQUEST_ID,
    SERVED_MODEL,
    message_json,
    sse_response,
    stream_events,
    usage_json,
)
from tests.provider_kits.base import FAKE_KEY, FakeServer, http

USAGE = Usage(input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1)
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"


def make_request(
    *messages: Any, tools: tuple[ToolSpec, ...] = (WEATHER,), on_delta: Any = None
) -> ModelRequest:
    transcript = list(messages) or [UserMessage(content="Weather in Paris?")]
    return ModelRequest(
        messages=TranscriptView(transcript), tools=tools, run_id="run1", turn=1, on_delta=on_delta
    )


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
async def sdk_client(server: FakeServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(
        api_key=FAKE_KEY,
        base_url="https://anthropic.test",
        max_retries=3,  # the adapter must turn these off
        http_client=server.client(),
    )
    yield client
    await client.close()


@pytest.fixture
def make_model(sdk_client: anthropic.AsyncAnthropic) -> Callable[..., AnthropicModel]:
    def make(**options: Any) -> AnthropicModel:
        return AnthropicModel(SERVED_MODEL, client=sdk_client, **options)

    return make


def whole(
    content: list[dict[str, Any]], stop_reason: str | None = "end_turn", usage: Any = USAGE
) -> Any:
    usage_body = usage_json(usage) if isinstance(usage, Usage) else usage
    return http.Response(200, json=message_json(content, stop_reason, usage_body))


def streamed(
    content: list[dict[str, Any]],
    stop_reason: str | None = "end_turn",
    usage: Any = USAGE,
    **kw: Any,
) -> Any:
    usage_body = usage_json(usage) if isinstance(usage, Usage) else usage
    return sse_response(stream_events(message_json(content, stop_reason, usage_body), **kw))


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(call_id: str, name: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": value}


def thinking(value: str = "Paris first, then Oslo.") -> dict[str, Any]:
    return {"type": "thinking", "thinking": value, "signature": SIGNATURE}


async def failure_of(model: Model, request: ModelRequest | None = None) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        await model.request(request or make_request())
    return caught.value


def reply_to(server: FakeServer, response: Any, *, stream: bool) -> None:
    """Queue ``response`` (content, stop reason) whole or streamed."""
    content, stop = response
    server.then(streamed(content, stop) if stream else whole(content, stop))


# --------------------------------------------------------------------------- replies


async def test_a_plain_reply(server: FakeServer, make_model: Callable[..., AnthropicModel]) -> None:
    server.then(whole([text("It is sunny in Paris.")]))
    model = make_model()
    response = await model.request(make_request())
    assert response == ModelResponse(
        message=AssistantMessage(content="It is sunny in Paris."),
        finish_reason=FinishReason.STOP,
        usage=USAGE,
        model_name=SERVED_MODEL,
    )
    assert isinstance(model, Model)
    assert model.name == SERVED_MODEL
    assert server.requests[0].url.path == "/v1/messages"


STOP_REASONS = [
    ("end_turn", FinishReason.STOP),
    ("stop_sequence", FinishReason.STOP),
    ("tool_use", FinishReason.TOOL_CALLS),
    ("max_tokens", FinishReason.LENGTH),
    ("model_context_window_exceeded", FinishReason.LENGTH),
    ("refusal", FinishReason.REFUSAL),
    ("a_reason_added_later", FinishReason.STOP),
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(("reason", "expected"), STOP_REASONS)
async def test_every_stop_reason_is_mapped(
    server: FakeServer,
    make_model: Callable[..., AnthropicModel],
    reason: str,
    expected: FinishReason,
    stream: bool,
) -> None:
    reply_to(server, ([text("The weather in Par")], reason), stream=stream)
    response = await make_model(stream=stream).request(make_request())
    assert response.finish_reason is expected
    assert response.message.content == "The weather in Par"


def test_finish_reason_helper_covers_what_no_server_sends() -> None:
    assert finish_reason_from(None) is FinishReason.STOP
    assert finish_reason_from(3) is FinishReason.STOP
    assert finish_reason_from("pause_turn") is FinishReason.STOP  # only the assembler knows


async def test_a_refusal_drops_its_unfinished_calls(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    server.then(whole([text("I can't"), tool_use("toolu_1", "get_weather", {})], "refusal"))
    response = await make_model().request(make_request())
    assert response.finish_reason is FinishReason.REFUSAL
    assert response.message.tool_calls == ()
    assert response.message.content == "I can't"


async def test_parallel_calls_keep_order_ids_and_arguments(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    content = [
        text("Checking both."),
        tool_use("toolu_A", "get_weather", {"city": "Paris"}),
        tool_use("toolu_B", "get_weather", {"city": "Oslo", "days": [1, 2]}),
        tool_use("toolu_C", "get_time", {}),
    ]
    server.then(whole(content, "tool_use"))
    response = await make_model().request(make_request())
    assert response.message.tool_calls == (
        ToolCall(id="toolu_A", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="toolu_B", name="get_weather", arguments='{"city": "Oslo", "days": [1, 2]}'),
        ToolCall(id="toolu_C", name="get_time", arguments="{}"),
    )
    assert response.message.provider_data is None  # nothing beyond the transcript to keep


def test_calls_without_ids_are_named_stably() -> None:
    reply = AnthropicReply(fallback_id_prefix="run9_3")
    reply.add_reply(message_json([tool_use("", "a", {}), tool_use("", "b", {})], "tool_use", None))
    assert [c.id for c in reply.build().message.tool_calls] == ["toolu_run9_3_0", "toolu_run9_3_1"]


@pytest.mark.parametrize(
    "body",
    [
        {"content": "not a list", "stop_reason": "end_turn"},
        {"content": [{"text": "no type"}], "stop_reason": "end_turn"},
        {"content": ["not an object"], "stop_reason": "end_turn"},
        {"content": [], "stop_reason": 7},
    ],
)
async def test_malformed_replies_are_transient(
    server: FakeServer, make_model: Callable[..., AnthropicModel], body: dict[str, Any]
) -> None:
    server.then(
        http.Response(200, json={"id": "m", "type": "message", "role": "assistant", **body})
    )
    failure = await failure_of(make_model())
    assert failure.transient
    assert "malformed" in str(failure)


async def test_a_body_that_is_no_json_is_transient(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    server.then(
        http.Response(
            200, content=b"<html>gateway</html>", headers={"content-type": "application/json"}
        )
    )
    assert (await failure_of(make_model())).transient


# --------------------------------------------------------------------------- usage


def test_usage_counts_cached_input_in_the_input() -> None:
    raw = {
        "input_tokens": 10,
        "cache_read_input_tokens": 64,
        "cache_creation_input_tokens": 8,
        "output_tokens": 17,
        "output_tokens_details": {"thinking_tokens": 5},
    }
    assert usage_from(raw) == Usage(
        input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1
    )
    assert usage_from({"input_tokens": 3, "output_tokens": 4}) == Usage(
        input_tokens=3, output_tokens=4, requests=1
    )
    assert usage_from(None) is None
    assert usage_from({"service_tier": "standard"}) is None
    assert usage_from({"input_tokens": -1, "output_tokens": 4}) is None
    assert usage_from({"input_tokens": 2, "output_tokens": True}) is None


async def test_absent_usage_is_none(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    server.then(whole([text("ok")], usage=None), streamed([text("ok")], usage=None))
    assert (await make_model().request(make_request())).usage is None
    assert (await make_model(stream=True).request(make_request())).usage is None


async def test_streamed_usage_takes_the_latest_cumulative_counts(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    events = stream_events(message_json([text("hello")], "end_turn", usage_json(USAGE)))
    # Newer servers repeat every count, cumulatively, in message_delta: the last one wins.
    delta = next(data for name, data in events if name == "message_delta")
    delta["usage"] = {
        "input_tokens": 30,
        "cache_read_input_tokens": 64,
        "cache_creation_input_tokens": 6,
        "output_tokens": 40,
        "output_tokens_details": {"thinking_tokens": 12},
    }
    server.then(sse_response(events))
    usage = (await make_model(stream=True).request(make_request())).usage
    assert usage == Usage(
        input_tokens=100, output_tokens=40, cached_tokens=64, reasoning_tokens=12, requests=1
    )


# --------------------------------------------------------------------------- streaming

STREAM_CASES: dict[str, tuple[list[dict[str, Any]], str]] = {
    "text": ([text("Sunny, 21 degrees, light wind from the north.")], "end_turn"),
    "call": (
        [tool_use("toolu_1", "get_weather", {"city": "Paris", "unit": "celsius"})],
        "tool_use",
    ),
    "parallel": (
        [
            text("Let me check."),
            tool_use("toolu_1", "get_weather", {"city": "Paris"}),
            tool_use("toolu_2", "get_weather", {"city": "Oslo"}),
        ],
        "tool_use",
    ),
    "empty_input": ([tool_use("toolu_1", "get_time", {})], "tool_use"),
    "thinking": (
        [thinking(), text("Checking."), tool_use("toolu_1", "get_weather", {"city": "Paris"})],
        "tool_use",
    ),
    "redacted": (
        [{"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}, text("Hi.")],
        "end_turn",
    ),
    "length": ([text("This answer was cut off in the mid")], "max_tokens"),
    "refusal": ([text("I can't help with that.")], "refusal"),
    "nothing": ([], "end_turn"),
}


@pytest.mark.parametrize("case", sorted(STREAM_CASES))
async def test_a_streamed_reply_equals_the_whole_reply(
    server: FakeServer, make_model: Callable[..., AnthropicModel], case: str
) -> None:
    reply_to(server, STREAM_CASES[case], stream=False)
    reply_to(server, STREAM_CASES[case], stream=True)
    deltas: list[ReplyDelta] = []
    whole_reply = await make_model().request(make_request())
    streamed_reply = await make_model(stream=True).request(make_request(on_delta=deltas.append))
    assert streamed_reply == whole_reply
    assert server.body(-1)["stream"] is True
    assert "".join(d.text for d in deltas) == whole_reply.message.content
    for index, call in enumerate(whole_reply.message.tool_calls):
        mine = [d for d in deltas if d.tool_call_index == index]
        assert (mine[0].tool_call_id, mine[0].tool_name) == (call.id, call.name)
        assert json.loads("".join(d.arguments for d in mine) or "{}") == json.loads(call.arguments)


async def test_stream_deltas_arrive_in_order(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    reply_to(server, STREAM_CASES["thinking"], stream=True)
    deltas: list[ReplyDelta] = []
    await make_model(stream=True).request(make_request(on_delta=deltas.append))
    assert deltas == [  # thinking is not the reply: it is never reported
        ReplyDelta(text="Che"),
        ReplyDelta(text="cki"),
        ReplyDelta(text="ng."),
        ReplyDelta(tool_call_index=0, tool_call_id="toolu_1", tool_name="get_weather"),
        ReplyDelta(tool_call_index=0, arguments='{"cit'),
        ReplyDelta(tool_call_index=0, arguments='y": "'),
        ReplyDelta(tool_call_index=0, arguments='Paris"}'),
    ]


async def test_streamed_arguments_that_are_no_json_stay_raw(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    content = [tool_use("toolu_1", "get_weather", {})]
    server.then(streamed(content, "max_tokens", raw_arguments=['{"city": "Par']))
    response = await make_model(stream=True).request(make_request())
    assert response.message.tool_calls[0].arguments == '{"city": "Par'
    assert response.finish_reason is FinishReason.LENGTH


async def test_a_stream_cut_before_message_stop_is_transient(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    events = stream_events(message_json([text("Half an ans")], "end_turn", usage_json(USAGE)))
    server.then(sse_response(events[:-1]), sse_response([]))
    for _ in range(2):
        failure = await failure_of(make_model(stream=True))
        assert failure.transient
        assert "message_stop" in str(failure)


@pytest.mark.parametrize(
    ("kind", "transient"),
    [("overloaded_error", True), ("api_error", True), ("invalid_request_error", False)],
)
async def test_an_error_event_mid_stream(
    server: FakeServer, make_model: Callable[..., AnthropicModel], kind: str, transient: bool
) -> None:
    events = stream_events(message_json([text("Half an answer")], "end_turn", usage_json(USAGE)))
    error = {"type": "error", "error": {"type": kind, "message": f"Overloaded {FAKE_KEY}"}}
    server.then(sse_response([*events[:4], ("error", error)]))
    deltas: list[ReplyDelta] = []
    failure = await failure_of(make_model(stream=True), make_request(on_delta=deltas.append))
    assert failure.transient is transient
    assert kind in str(failure)
    assert "while streaming" in str(failure)
    assert FAKE_KEY not in str(failure)
    assert failure.__context__ is None
    assert deltas  # what arrived before the error was reported


async def test_unknown_events_are_ignored_and_a_stray_delta_is_malformed(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    events = stream_events(message_json([text("Fine.")], "end_turn", usage_json(USAGE)))
    events.insert(2, ("some_future_event", {"type": "some_future_event", "x": 1}))
    stray = {
        "type": "content_block_delta",
        "index": 9,
        "delta": {"type": "text_delta", "text": "?"},
    }
    server.then(sse_response(events), sse_response([events[0], ("content_block_delta", stray)]))
    assert (await make_model(stream=True).request(make_request())).message.content == "Fine."
    failure = await failure_of(make_model(stream=True))
    assert failure.transient
    assert "never started" in str(failure)


async def test_on_delta_that_raises_does_not_break_the_stream(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    def broken(delta: ReplyDelta) -> None:
        raise RuntimeError("listener bug")

    reply_to(server, STREAM_CASES["parallel"], stream=True)
    with capture_logs() as logs:
        response = await make_model(stream=True).request(make_request(on_delta=broken))
    assert len(response.message.tool_calls) == 2
    assert [entry["event"] for entry in logs] == ["on_delta_failed"]


# --------------------------------------------------------------------------- pause_turn

SEARCH = {
    "type": "server_tool_use",
    "id": "srvtoolu_1",
    "name": "web_search",
    "input": {"query": "Paris weather"},
}
FOUND = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [{"type": "web_search_result", "url": "https://meteo.test", "title": "Paris"}],
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_paused_turn_is_continued_and_its_usage_summed(
    server: FakeServer, make_model: Callable[..., AnthropicModel], stream: bool
) -> None:
    reply_to(server, ([text("Let me search. "), SEARCH, FOUND], "pause_turn"), stream=stream)
    reply_to(server, ([text("It is sunny.")], "end_turn"), stream=stream)
    deltas: list[ReplyDelta] = []
    response = await make_model(stream=stream).request(make_request(on_delta=deltas.append))
    assert response.finish_reason is FinishReason.STOP
    assert response.message.content == "Let me search. It is sunny."
    assert response.usage == USAGE + USAGE.model_copy(update={"requests": 0})
    assert response.usage is not None
    assert response.usage.requests == 1
    sent = server.body(1)["messages"]
    assert sent[:-1] == server.body(0)["messages"]
    assert sent[-1] == {"role": "assistant", "content": [text("Let me search. "), SEARCH, FOUND]}
    assert response.message.provider_data == {
        "anthropic": {"content": [{"type": "text"}, SEARCH, FOUND, {"type": "text"}]}
    }
    if stream:
        assert "".join(d.text for d in deltas) == response.message.content


async def test_a_turn_still_paused_after_the_continuations_is_length(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    for n in range(MAX_CONTINUATIONS + 1):
        server.then(whole([text(f"part {n}. ")], "pause_turn"))
    response = await make_model().request(make_request())
    assert response.finish_reason is FinishReason.LENGTH
    assert len(server.requests) == MAX_CONTINUATIONS + 1
    assert response.message.content.startswith("part 0. part 1.")
    assert response.usage is not None
    assert response.usage.output_tokens == (MAX_CONTINUATIONS + 1) * USAGE.output_tokens


# --------------------------------------------------------------------------- request shape


async def test_the_request_body_has_the_wire_shape(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    calls = (
        ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="toolu_2", name="get_weather", arguments='{"city": "Osl'),  # cut off
    )
    transcript = [
        SystemMessage(content="Be brief."),
        SystemMessage(content="Answer in French."),
        UserMessage(content="Weather in Paris and Oslo?"),
        AssistantMessage(content="Checking.", tool_calls=calls),
        ToolMessage(tool_call_id="toolu_1", name="get_weather", content="sunny", details={"x": 1}),
        ToolMessage(
            tool_call_id="toolu_2",
            name="get_weather",
            content="error: arguments are not JSON",
            status=ToolStatus.ERROR,
        ),
        SystemMessage(content="Note: one call failed."),
        UserMessage(content=""),
        AssistantMessage(content="Il fait beau à Paris."),
        UserMessage(content="Merci."),
    ]
    server.then(whole([text("De rien.")]))
    model = make_model(stop_sequences=["###"], metadata={"user_id": "u1"}, timeout=30.0)
    await model.request(make_request(*transcript))
    assert server.body() == {
        "model": SERVED_MODEL,
        "max_tokens": DEFAULT_MAX_TOKENS,
        "system": "Be brief.\n\nAnswer in French.",
        "stop_sequences": ["###"],
        "metadata": {"user_id": "u1"},
        "messages": [
            {"role": "user", "content": [text("Weather in Paris and Oslo?")]},
            {
                "role": "assistant",
                "content": [
                    text("Checking."),
                    tool_use("toolu_1", "get_weather", {"city": "Paris"}),
                    tool_use("toolu_2", "get_weather", {}),
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_2",
                        "content": "error: arguments are not JSON",
                        "is_error": True,
                    },
                    text("Note: one call failed."),
                ],
            },
            {"role": "assistant", "content": [text("Il fait beau à Paris.")]},
            {"role": "user", "content": [text("Merci.")]},
        ],
        "tools": [
            {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "input_schema": WEATHER.parameters,
            }
        ],
    }
    assert KIT.system_prompt(server.body()) == "Be brief.\n\nAnswer in French."


async def test_results_go_before_text_even_when_text_came_first(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    call = ToolCall(id="toolu_1", name="get_weather", arguments="{}")
    transcript = [
        UserMessage(content="hi"),
        AssistantMessage(tool_calls=(call,)),
        UserMessage(content="(steering) hurry"),
        ToolMessage(
            tool_call_id="toolu_1", name="get_weather", content="", status=ToolStatus.SKIPPED
        ),
    ]
    server.then(whole([text("ok")]))
    await make_model().request(make_request(*transcript))
    assert server.body()["messages"][-1] == {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}, text("(steering) hurry")],
    }


async def test_a_call_without_tools_declares_the_history_s_tools_unusable(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    call = ToolCall(id="toolu_1", name="get_weather", arguments="{}")
    transcript = [
        UserMessage(content="hi"),
        AssistantMessage(tool_calls=(call,)),
        ToolMessage(tool_call_id="toolu_1", name="get_weather", content="sunny"),
        UserMessage(content="Answer now."),
    ]
    server.then(whole([text("ok")]), whole([text("ok")]))
    model = make_model(tool_choice={"type": "any"})
    await model.request(make_request(*transcript, tools=()))
    body = server.body()
    assert [tool["name"] for tool in body["tools"]] == ["get_weather"]
    assert body["tool_choice"] == {"type": "none"}
    await model.request(make_request(tools=()))
    assert "tools" not in server.body()
    assert "tool_choice" not in server.body()


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ("auto", {"type": "auto"}),
        ("required", {"type": "any"}),
        ("none", {"type": "none"}),
        ("get_weather", {"type": "tool", "name": "get_weather"}),
        (None, {"type": "auto", "disable_parallel_tool_use": True}),
    ],
)
async def test_the_request_s_tool_choice_wins_over_the_setting(
    server: FakeServer,
    make_model: Callable[..., AnthropicModel],
    choice: str | None,
    sent: dict[str, Any],
) -> None:
    server.then(whole([text("ok")]), whole([text("ok")]))
    model = make_model(tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    request = make_request()
    await model.request(dataclasses.replace(request, tool_choice=choice))
    assert server.body()["tool_choice"] == sent
    await model.request(dataclasses.replace(request, tools=(), tool_choice=choice))
    assert "tool_choice" not in server.body()


async def test_ids_the_api_would_refuse_are_replaced_consistently(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    call = ToolCall(id="functions.get_weather:0", name="get_weather", arguments="{}")
    transcript = [
        UserMessage(content="hi"),
        AssistantMessage(tool_calls=(call,)),
        ToolMessage(tool_call_id=call.id, name="get_weather", content="sunny"),
    ]
    server.then(whole([text("ok")]))
    await make_model().request(make_request(*transcript))
    sent = server.body()["messages"]
    assert sent[1]["content"][0]["id"] == sent[2]["content"][0]["tool_use_id"] == wire_id(call.id)
    assert wire_id(call.id).startswith("toolu_")
    assert wire_id("toolu_01Abc-_9") == "toolu_01Abc-_9"


# --------------------------------------------------------------------------- thinking


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_thinking_blocks_go_back_unchanged_in_their_places(
    server: FakeServer, make_model: Callable[..., AnthropicModel], stream: bool
) -> None:
    redacted = {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}
    content = [
        thinking(),
        tool_use("toolu_1", "get_weather", {"city": "Paris"}),
        redacted,
        text("And Oslo."),
        tool_use("toolu_2", "get_weather", {"city": "Oslo"}),
    ]
    reply_to(server, (content, "tool_use"), stream=stream)
    model = make_model(stream=stream, thinking={"type": "enabled", "budget_tokens": 2048})
    first = await model.request(make_request())
    assert first.message.provider_data == {
        "anthropic": {
            "content": [
                thinking(),
                {"type": "tool_use", "id": "toolu_1"},
                redacted,
                {"type": "text"},
                {"type": "tool_use", "id": "toolu_2"},
            ]
        }
    }
    results = [
        ToolMessage(tool_call_id=c.id, name=c.name, content="sunny")
        for c in first.message.tool_calls
    ]
    reply_to(server, ([text("Sunny in both.")], "end_turn"), stream=stream)
    await model.request(make_request(UserMessage(content="Weather?"), first.message, *results))
    body = server.body()
    assert body["messages"][1] == {"role": "assistant", "content": content}
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}


def test_an_edited_or_foreign_layout_never_breaks_the_request() -> None:
    call = ToolCall(id="toolu_9", name="f", arguments="{}")
    odd = AssistantMessage(
        content="text the layout does not place",
        tool_calls=(call,),
        provider_data={
            "anthropic": {
                "content": [thinking(), 3, {"type": "tool_use", "id": "gone"}, {"no": "type"}]
            },
            "gemini": {"signatures": ["x"]},
        },
    )
    [turn] = to_anthropic_prompt([odd]).messages
    assert turn["content"] == [
        thinking(),
        text("text the layout does not place"),
        {"type": "tool_use", "id": "toolu_9", "name": "f", "input": {}},
    ]
    for junk in ({"anthropic": "x"}, {"anthropic": {"content": "x"}}, {"other": {}}):
        plain = AssistantMessage(content="hi", provider_data=junk)
        assert to_anthropic_prompt([plain]).messages[0]["content"] == [text("hi")]


# --------------------------------------------------------------------------- schemas


def test_schemas_are_sanitised_on_a_copy() -> None:
    union = {
        "anyOf": [
            {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city", "unit"],
            },
            {"$ref": "#/$defs/Place"},
        ],
        "$defs": {
            "Place": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "unit": {"type": "string"}},
                "required": ["lat", "unit"],
            }
        },
    }
    original = copy.deepcopy(union)
    converted = anthropic_schema(union)
    assert union == original
    assert converted.schema == {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "lat": {"type": "number"},
            "unit": {"type": "string"},
        },
        "required": ["unit"],  # what every branch requires
        "$defs": original["$defs"],
    }
    assert [(p.keyword, p.fatal) for p in converted.problems] == [("anyOf", False)]
    merged = anthropic_schema(
        {
            "type": ["object", "null"],
            "properties": {"a": {"type": "integer"}},
            "allOf": [
                {"required": ["a"]},
                {"properties": {"b": {"type": "string"}}, "required": ["b"]},
            ],
        }
    )
    assert merged.schema["type"] == "object"
    assert merged.schema["required"] == ["a", "b"]  # what any branch requires
    assert set(merged.schema["properties"]) == {"a", "b"}
    assert anthropic_schema({"$ref": "#/$defs/X", "$defs": {"X": {}}}).schema["type"] == "object"
    assert anthropic_schema({"type": "array"}).fatal
    assert anthropic_schema(WEATHER.parameters) == type(converted)(WEATHER.parameters)


async def test_the_tools_sent_are_sanitised_and_the_tool_keeps_its_schema(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    schema = {"oneOf": [{"properties": {"city": {"type": "string"}}, "required": ["city"]}]}
    spec = ToolSpec(name="lookup", description="", parameters=schema)
    server.then(whole([text("ok")]))
    model = make_model()
    await model.request(make_request(tools=(spec,)))
    assert server.body()["tools"] == [
        {
            "name": "lookup",
            "input_schema": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        }
    ]
    assert spec.parameters == {
        "oneOf": [{"properties": {"city": {"type": "string"}}, "required": ["city"]}]
    }
    [issue] = model.tool_schema_issues([spec, WEATHER])
    assert (issue.tool, issue.keyword, issue.provider, issue.fatal) == (
        "lookup",
        "oneOf",
        "anthropic",
        False,
    )


def test_an_agent_warns_of_a_merged_schema() -> None:
    """The warning names the tool, the keyword and the provider. A fatal issue (a top-level
    type other than object) cannot come from a ``Tool``, which insists on an object schema
    itself, so ``Agent``'s ConfigError path is only reachable with a hand-made ToolSpec."""
    model = AnthropicModel(SERVED_MODEL, api_key=FAKE_KEY)

    def find(**kwargs: Any) -> str:
        return "found"

    either = {
        "type": "object",
        "anyOf": [{"properties": {"id": {"type": "integer"}}, "required": ["id"]}],
    }
    with pytest.warns(ToolSchemaWarning, match=r"'find'.*anthropic.*anyOf"):
        Agent(model=model, tools=[Tool("find", "Find.", either, find)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Agent(model=model, tools=[Tool("find", "Find.", WEATHER.parameters, find)])
    spec = ToolSpec(name="bad", description="", parameters={"type": "string"})
    issues = model.tool_schema_issues([spec])
    assert [(i.tool, i.keyword, i.provider, i.fatal) for i in issues] == [
        ("bad", "type", "anthropic", True)
    ]
    assert "object" in issues[0].detail


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("status", "transient"),
    [
        (400, False),
        (401, False),
        (402, False),
        (403, False),
        (404, False),
        (413, False),
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (503, True),
        (504, True),
        (529, True),
    ],
)
async def test_http_errors_are_mapped(
    server: FakeServer, make_model: Callable[..., AnthropicModel], status: int, transient: bool
) -> None:
    server.then(KIT.error(status, "something went wrong"))
    failure = await failure_of(make_model())
    assert failure.transient is transient
    assert f"HTTP {status}" in str(failure)
    assert REQUEST_ID in str(failure)
    assert "something went wrong" in str(failure)
    assert len(server.requests) == 1, "the SDK's own retries are off"


@pytest.mark.parametrize("status", [429, 529])
async def test_retry_after_is_honoured(
    server: FakeServer, make_model: Callable[..., AnthropicModel], status: int
) -> None:
    server.then(KIT.error(status, "slow down", retry_after=12))
    failure = await failure_of(make_model())
    assert (failure.transient, failure.retry_after_s) == (True, 12.0)
    assert ("overloaded_error" if status == 529 else "rate_limit_error") in str(failure)


async def test_a_permanent_error_ignores_retry_after(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    server.then(KIT.error(400, "prompt is too long", retry_after=5))
    failure = await failure_of(make_model())
    assert (failure.transient, failure.retry_after_s) == (False, None)


@pytest.mark.parametrize("stream", [False, True])
async def test_timeouts_and_dropped_connections_are_transient(
    server: FakeServer, make_model: Callable[..., AnthropicModel], stream: bool
) -> None:
    async def time_out(request: Any) -> Any:
        raise http.ReadTimeout("read timed out", request=request)

    async def drop(request: Any) -> Any:
        raise http.RemoteProtocolError("peer closed connection", request=request)

    server.then(time_out, drop)
    timed_out = await failure_of(make_model(stream=stream, timeout=7.5))
    assert timed_out.transient
    assert "timed out" in str(timed_out)
    assert "7.5 s" in str(timed_out)
    dropped = await failure_of(make_model(stream=stream))
    assert dropped.transient
    assert "anthropic.test/v1/messages" in str(dropped)


async def test_the_key_never_leaks(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    server.then(KIT.error(401, f"invalid x-api-key: {FAKE_KEY}"))
    model = make_model()
    with capture_logs() as logs:
        failure = await failure_of(model)
    assert not failure.transient
    assert "invalid x-api-key" in str(failure)
    assert failure.__cause__ is None
    assert failure.__context__ is None
    text = "".join(traceback.format_exception(failure)) + repr(failure) + str(failure.args)
    assert FAKE_KEY not in text + repr(model) + repr(logs)
    lazy = AnthropicModel(
        SERVED_MODEL,
        api_key=FAKE_KEY,
        base_url="https://user:pw@proxy.test/anthropic?key=1",
        extra_headers={"x-secret": FAKE_KEY},
    )
    assert FAKE_KEY not in repr(lazy)
    assert "pw" not in repr(lazy)
    assert "key=1" not in repr(lazy)
    assert "extra_headers" in repr(lazy)


def test_a_missing_key_is_found_when_the_model_is_built(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ANTHROPIC_CONFIG_DIR", str(tmp_path))  # no profile on disk either
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        AnthropicModel(SERVED_MODEL, base_url="https://anthropic.test")


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "options",
    [
        {"model": ""},
        {"model": SERVED_MODEL, "timeout": 0},
        {"model": SERVED_MODEL, "max_tokens": 0},
        {"model": SERVED_MODEL, "max_tokens": True},
        {"model": SERVED_MODEL, "context_window": 0},
        {"model": SERVED_MODEL, "system": "no"},
        {"model": SERVED_MODEL, "messages": []},
        {"model": SERVED_MODEL, "stream_options": {}},
    ],
)
def test_bad_configuration_raises_at_construction(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        AnthropicModel(**options)


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("stop_sequence", "did you mean 'stop_sequences'"),
        ("max_retries", "Limits"),
        ("default_headers", "client=anthropic.AsyncAnthropic"),
    ],
)
def test_a_wrong_setting_says_what_was_meant(key: str, hint: str) -> None:
    with pytest.raises(ConfigError, match=hint):
        AnthropicModel(SERVED_MODEL, **{key: 1})


async def test_temperature_follows_what_the_sdk_can_send(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    accepted = parameter_names(anthropic.resources.messages.AsyncMessages.create)
    assert accepted is not None
    if "temperature" in accepted:  # an SDK before 2.0, speaking API version 2023-06-01
        server.then(whole([text("ok")]))
        await make_model(temperature=0.3).request(make_request())
        assert server.body()["temperature"] == 0.3
    else:
        with pytest.raises(ConfigError, match=r"extra_body=\{'temperature'"):
            make_model(temperature=0.3)
    server.then(whole([text("ok")]))
    await make_model(extra_body={"top_k": 5}, max_tokens=99).request(make_request())
    assert (server.body()["top_k"], server.body()["max_tokens"]) == (5, 99)


async def test_client_and_key_together_are_rejected(sdk_client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(ConfigError):
        AnthropicModel(SERVED_MODEL, client=sdk_client, api_key=FAKE_KEY)


async def test_a_given_client_is_never_closed(
    server: FakeServer, sdk_client: anthropic.AsyncAnthropic
) -> None:
    server.then(whole([text("ok")]))
    async with AnthropicModel(SERVED_MODEL, client=sdk_client, context_window=200_000) as model:
        await model.request(make_request())
        assert model.context_window == 200_000
    assert not sdk_client.is_closed()
    assert sdk_client.max_retries == 3  # the adapter retries through a copy, with none


# --------------------------------------------------------------------------- lazy client


async def test_the_lazy_client_reads_the_environment_and_never_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = LocalServer()
    async with local as base_url:
        monkeypatch.setenv("ANTHROPIC_API_KEY", FAKE_KEY)
        monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url.removesuffix("/v1"))
        local.reply(message_json([text("from env")], "end_turn", usage_json(USAGE)))
        local.reply(json.loads(KIT.error(500, "boom").body), status=500)
        async with AnthropicModel(SERVED_MODEL) as model:
            assert (await model.request(make_request())).message.content == "from env"
            failure = await failure_of(model)
        assert failure.transient
        assert len(local.seen) == 2  # one request for the 500: no hidden SDK retries
        headers, body = local.seen[0]
        assert FAKE_KEY in headers.get("x-api-key", "") + headers.get("authorization", "")
        assert "anthropic-version" in headers
        assert body["model"] == SERVED_MODEL


def test_the_lazy_client_is_rebuilt_for_a_new_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    model = AnthropicModel(SERVED_MODEL, api_key=FAKE_KEY)
    clients: list[object] = []

    async def one_run(close: bool) -> str:
        local = LocalServer()
        async with local as base_url:
            monkeypatch.setenv("ANTHROPIC_BASE_URL", base_url.removesuffix("/v1"))
            # connection: close, so the client left open holds no socket of a closed loop
            local.reply(
                message_json([text("hello")], "end_turn", usage_json(USAGE)),
                headers={"connection": "close"},
            )
            response = await model.request(make_request())
            clients.append(model._own_client)
            if close:
                await model.aclose()
        return response.message.content

    assert asyncio.run(one_run(close=False)) == "hello"  # as run_sync would leave it
    assert asyncio.run(one_run(close=True)) == "hello"
    assert clients[0] is not clients[1]


# --------------------------------------------------------------------------- through an Agent


async def test_an_agent_streams_retries_and_finishes_through_the_real_sdk(
    server: FakeServer, make_model: Callable[..., AnthropicModel]
) -> None:
    """End to end: a 529 is retried by the engine after the server's Retry-After, streamed
    fragments become MessageUpdated events, the tool runs, and the streamed text is the answer."""

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    server.then(
        KIT.error(529, "Overloaded", retry_after=2),
        streamed([thinking(), tool_use("toolu_w", "get_weather", {"city": "Paris"})], "tool_use"),
        streamed([text("It is sunny in Paris.")]),
    )
    delays: list[float] = []

    async def no_sleep(seconds: float) -> None:
        delays.append(seconds)

    agent = Agent(
        model=make_model(stream=True),
        tools=[get_weather],
        system_prompt="Be brief.",
        limits=Limits(retry_backoff_s=0.1, retry_backoff_max_s=0.2),
        sleep=no_sleep,
    )
    events: list[Event] = []
    result = await agent.subscribe(events.append).run("Weather in Paris?")

    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "It is sunny in Paris.")
    assert delays == [2.0]  # Retry-After wins over the shorter backoff
    failures = [e for e in events if isinstance(e, ModelFailed)]
    assert len(failures) == 1
    assert not failures[0].permanent
    deltas = [e.delta for e in events if isinstance(e, MessageUpdated)]
    assert "".join(d.arguments for d in deltas) == '{"city": "Paris"}'
    last = server.body()
    assert last["system"] == "Be brief."
    assert last["messages"][1]["content"][0] == thinking()  # kept across the tool turn
    assert KIT.tool_results(last) == [("toolu_w", "sunny in Paris")]
    assert result.usage.requests == 2
    assert result.usage.input_tokens == 2 * USAGE.input_tokens
    assert FAKE_KEY not in repr(result)


# --------------------------------------------------------------------------- live


@pytest.mark.skipif(
    not os.environ.get("AGENT_FSM_LIVE_ANTHROPIC_API_KEY"),
    reason="set AGENT_FSM_LIVE_ANTHROPIC_API_KEY to run",
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_live_tool_turn(stream: bool) -> None:
    """A real call to the API (or AGENT_FSM_LIVE_ANTHROPIC_BASE_URL): a tool turn, then the
    answer, through an Agent."""

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny, 21 degrees in {city}"

    async with AnthropicModel(
        os.environ.get("AGENT_FSM_LIVE_ANTHROPIC_MODEL", "claude-haiku-4-5"),
        api_key=os.environ["AGENT_FSM_LIVE_ANTHROPIC_API_KEY"],
        base_url=os.environ.get("AGENT_FSM_LIVE_ANTHROPIC_BASE_URL"),
        stream=stream,
        max_tokens=512,
        timeout=60,
    ) as model:
        agent = Agent(model=model, tools=[get_weather], limits=Limits(max_turns=4))
        result = await agent.run("Use the tool: what is the weather in Paris? One sentence.")
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.usage.requests >= 2
    assert not result.usage.estimated
