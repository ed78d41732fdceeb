"""The OpenAI Responses adapter, exercised through the real SDK and a mock transport.

No test touches the network: the SDK gets an HTTP client whose transport is the fake server
(or, for the lazily built client, a tiny server on 127.0.0.1). The live test runs only when
AGENT_FSM_LIVE_RESPONSES_BASE_URL is set.
"""

from __future__ import annotations

import copy
import json
import os
import traceback
import warnings
from collections.abc import AsyncIterator, Callable
from typing import Any

import openai
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
    OutputFormat,
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
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.models.openai_responses import OpenAIResponsesModel
from agent_fsm.models.openai_responses_convert import PROVIDER_KEY, to_responses_input
from agent_fsm.models.openai_responses_reply import finish_reason_from, usage_from
from tests.local_server import LocalServer
from tests.provider_kits.base import FakeServer, http
from tests.provider_kits.openai_responses import (
    KIT,
    RESPONSE_ID,
    SERVED_MODEL,
    USAGE,
    api_error,
    events_for,
    function_call_item,
    message_item,
    reasoning_item,
    response_payload,
    sse,
)

FAKE_KEY = "sk-test-DO-NOT-LEAK-0123456789abcdefABCDEF"
MODEL = "gpt-4.1-mini"

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        },
        "required": ["city"],
    },
)


def make_request(
    *messages: Any,
    tools: tuple[ToolSpec, ...] = (WEATHER,),
    on_delta: Any = None,
    output: OutputFormat | None = None,
) -> ModelRequest:
    transcript = list(messages) or [UserMessage(content="Weather in Beijing?")]
    return ModelRequest(
        messages=TranscriptView(transcript),
        tools=tools,
        run_id="run1",
        turn=1,
        on_delta=on_delta,
        output=output,
    )


def whole(payload: dict[str, Any], status: int = 200, **headers: str) -> Any:
    return http.Response(status, json=payload, headers=headers)


def streamed(events: list[dict[str, Any]]) -> Any:
    return http.Response(200, content=sse(events), headers={"content-type": "text/event-stream"})


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
async def sdk_client(server: FakeServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        api_key=FAKE_KEY,
        base_url="https://api.test/v1",
        max_retries=3,  # the adapter must turn these off
        http_client=server.client(),
    )
    yield client
    await client.close()


@pytest.fixture
def make_model(sdk_client: openai.AsyncOpenAI) -> Callable[..., OpenAIResponsesModel]:
    def make(**options: Any) -> OpenAIResponsesModel:
        return OpenAIResponsesModel(MODEL, client=sdk_client, **options)

    return make


async def failure_of(model: Model, request: ModelRequest | None = None) -> ModelCallError:
    with pytest.raises(ModelCallError) as info:
        await model.request(request or make_request())
    return info.value


# --------------------------------------------------------------------------- replies

CALLS = [
    function_call_item("call_A", "get_weather", '{"city": "Beijing"}'),
    function_call_item("call_B", "get_weather", '{"city": "Shanghai"}'),
]


async def test_a_text_reply(server: FakeServer, make_model: Callable[..., Any]) -> None:
    server.then(whole(response_payload([message_item("It is sunny in Beijing.")])))
    model = make_model()
    response = await model.request(make_request())
    assert response == ModelResponse(
        message=AssistantMessage(content="It is sunny in Beijing."),
        finish_reason=FinishReason.STOP,
        usage=Usage(
            input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1
        ),
        model_name=SERVED_MODEL,
    )
    assert isinstance(model, Model)
    assert model.name == MODEL
    assert server.requests[0].url.path == "/v1/responses"


async def test_parallel_calls_keep_their_order_ids_and_raw_arguments(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    broken = function_call_item("call_C", "get_time", '{"tz": "Asi')  # cut: kept raw
    output = [message_item("Checking."), *CALLS, broken]
    server.then(whole(response_payload(output)))
    response = await make_model().request(make_request())
    assert response.message.content == "Checking."
    assert [(c.id, c.name, c.arguments) for c in response.message.tool_calls] == [
        ("call_A", "get_weather", '{"city": "Beijing"}'),
        ("call_B", "get_weather", '{"city": "Shanghai"}'),
        ("call_C", "get_time", '{"tz": "Asi'),
    ]
    assert response.finish_reason is FinishReason.TOOL_CALLS
    assert response.message.provider_data is None  # nothing to send back but the transcript


FINISHES = {
    "completed": (response_payload([message_item("Done.")]), FinishReason.STOP),
    "completed_calls": (response_payload(CALLS), FinishReason.TOOL_CALLS),
    "refusal": (
        response_payload([message_item(refusal="I can't help with that.")]),
        FinishReason.REFUSAL,
    ),
    "max_output_tokens": (
        response_payload(
            [message_item("The weather in Bei")],
            status="incomplete",
            incomplete="max_output_tokens",
        ),
        FinishReason.LENGTH,
    ),
    "max_output_tokens_in_a_call": (
        response_payload(
            [function_call_item("call_A", "get_weather", '{"ci')],
            status="incomplete",
            incomplete="max_output_tokens",
        ),
        FinishReason.LENGTH,
    ),
    "content_filter": (
        response_payload([], status="incomplete", incomplete="content_filter"),
        FinishReason.CONTENT_FILTER,
    ),
    "incomplete_other_reason": (
        response_payload([message_item("Par")], status="incomplete", incomplete="max_messages"),
        FinishReason.LENGTH,
    ),
    "no_status": (response_payload([message_item("ok")], status=None), FinishReason.STOP),
    "unknown_status": (response_payload([message_item("ok")], status="novel"), FinishReason.STOP),
}


@pytest.mark.parametrize("case", sorted(FINISHES))
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_every_status_is_mapped(
    server: FakeServer, make_model: Callable[..., Any], case: str, stream: bool
) -> None:
    payload, expected = FINISHES[case]
    server.then(streamed(events_for(payload)) if stream else whole(payload))
    response = await make_model(stream=stream).request(make_request())
    assert response.finish_reason is expected
    if expected is FinishReason.REFUSAL:
        assert response.message.content == "I can't help with that."


@pytest.mark.parametrize(
    ("code", "transient"),
    [
        ("server_error", True),
        ("rate_limit_exceeded", True),
        ("vector_store_timeout", True),
        (None, True),
        ("invalid_prompt", False),
        ("insufficient_quota", False),
        ("image_content_policy_violation", False),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_failed_response_is_an_error_by_its_code(
    server: FakeServer,
    make_model: Callable[..., Any],
    code: str | None,
    transient: bool,
    stream: bool,
) -> None:
    error = {"code": code, "message": "The model failed to respond."}
    payload = response_payload([], status="failed", error=error, usage=None)
    server.then(streamed(events_for(payload)) if stream else whole(payload))
    failure = await failure_of(make_model(stream=stream))
    assert failure.transient is transient
    assert "The model failed to respond." in str(failure)
    assert code is None or code in str(failure)


async def test_a_cancelled_response_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.then(whole(response_payload([], status="cancelled")))
    assert (await failure_of(make_model())).transient


@pytest.mark.parametrize(
    "payload",
    [
        {"id": "resp_x", "object": "response", "status": "completed"},  # no output
        {**response_payload([]), "output": "nonsense"},
        response_payload([{**message_item("x"), "content": "not a list"}]),
        response_payload([{**message_item("x"), "content": [{"type": "output_text", "text": 4}]}]),
        response_payload([{**function_call_item("c", "f", "{}"), "arguments": {"a": 1}}]),
    ],
)
async def test_garbage_replies_are_transient(
    server: FakeServer, make_model: Callable[..., Any], payload: dict[str, Any]
) -> None:
    server.then(whole(payload))
    failure = await failure_of(make_model())
    assert failure.transient
    assert "malformed" in str(failure)


async def test_a_body_that_is_not_json_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.then(http.Response(200, content=b"<html>502 Bad Gateway</html>"))
    assert (await failure_of(make_model())).transient


def test_usage_conversion() -> None:
    assert usage_from(USAGE) == Usage(
        input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1
    )
    assert usage_from(None) is None
    assert usage_from({"total_tokens": 3}) is None
    assert usage_from({"input_tokens": -1, "output_tokens": 2}) is None
    assert usage_from({"input_tokens": 2, "output_tokens": True}) is None
    assert usage_from({"input_tokens": 7, "output_tokens": 2}) == Usage(
        input_tokens=7, output_tokens=2, requests=1
    )


def test_finish_reason_table() -> None:
    assert finish_reason_from("completed", None, has_calls=False, refused=False) is (
        FinishReason.STOP
    )
    assert finish_reason_from("completed", None, has_calls=True, refused=True) is (
        FinishReason.TOOL_CALLS
    )
    assert finish_reason_from(None, None, has_calls=False, refused=True) is FinishReason.REFUSAL
    assert finish_reason_from("incomplete", "content_filter", has_calls=True, refused=False) is (
        FinishReason.CONTENT_FILTER
    )
    assert finish_reason_from("incomplete", None, has_calls=False, refused=False) is (
        FinishReason.LENGTH
    )


async def test_missing_usage_is_none(server: FakeServer, make_model: Callable[..., Any]) -> None:
    server.then(whole(response_payload([message_item("ok")], usage=None)))
    assert (await make_model().request(make_request())).usage is None


async def test_a_call_without_call_id_gets_a_stable_one(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    output = [{**item, "call_id": None} for item in CALLS]
    server.then(whole(response_payload(output)), streamed(events_for(response_payload(output))))
    first = await make_model().request(make_request())
    second = await make_model(stream=True).request(make_request())
    ids = [call.id for call in first.message.tool_calls]
    assert ids == [f"call_{RESPONSE_ID}_0", f"call_{RESPONSE_ID}_1"]
    assert [call.id for call in second.message.tool_calls] == ids


# --------------------------------------------------------------------------- streaming

STREAM_CASES = {
    "text": response_payload([message_item("Sunny, 21 degrees, light wind from the north.")]),
    "call": response_payload([function_call_item("call_1", "get_weather", '{"city": "Paris"}')]),
    "text_and_calls": response_payload([message_item("Let me check."), *CALLS]),
    "invalid_json": response_payload([function_call_item("call_1", "get_weather", '{"c": Pa')]),
    "two_messages": response_payload(
        [message_item("First part.", item_id="msg_1"), message_item("Second.", item_id="msg_2")]
    ),
    "reasoning_then_calls": response_payload(
        [reasoning_item(summary="Look both up."), *CALLS], usage=USAGE
    ),
    "length": response_payload(
        [message_item("This answer was cut off in the mid")],
        status="incomplete",
        incomplete="max_output_tokens",
    ),
    "content_filter": response_payload([], status="incomplete", incomplete="content_filter"),
    "refusal": response_payload([message_item(refusal="I can't help with that.")]),
    "no_usage": response_payload([message_item("Fine.")], usage=None),
}


@pytest.mark.parametrize("case", sorted(STREAM_CASES))
async def test_a_streamed_reply_equals_the_whole_reply(
    server: FakeServer, make_model: Callable[..., Any], case: str
) -> None:
    payload = STREAM_CASES[case]
    deltas: list[ReplyDelta] = []
    server.then(whole(payload), streamed(events_for(payload, piece=3)))
    complete = await make_model().request(make_request())
    pieces = await make_model(stream=True).request(make_request(on_delta=deltas.append))
    assert pieces == complete
    assert server.body(-1)["stream"] is True
    assert "stream" not in server.body(0)
    assert "".join(d.text for d in deltas) == complete.message.content
    for index, call in enumerate(complete.message.tool_calls):
        mine = [d for d in deltas if d.tool_call_index == index]
        assert (mine[0].tool_call_id, mine[0].tool_name) == (call.id, call.name)
        assert all(d.tool_name is None and d.tool_call_id is None for d in mine[1:])
        assert len(mine) > 2
        assert "".join(d.arguments for d in mine) == call.arguments
    assert all((d.text == "") != (d.tool_call_index is None) for d in deltas)


async def test_stream_deltas_arrive_in_order(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.then(streamed(events_for(STREAM_CASES["text_and_calls"], piece=8)))
    deltas: list[ReplyDelta] = []
    await make_model(stream=True).request(make_request(on_delta=deltas.append))
    assert deltas == [
        ReplyDelta(text="Let me c"),
        ReplyDelta(text="heck."),
        ReplyDelta(tool_call_index=0, tool_call_id="call_A", tool_name="get_weather"),
        ReplyDelta(tool_call_index=0, arguments='{"city":'),
        ReplyDelta(tool_call_index=0, arguments=' "Beijin'),
        ReplyDelta(tool_call_index=0, arguments='g"}'),
        ReplyDelta(tool_call_index=1, tool_call_id="call_B", tool_name="get_weather"),
        ReplyDelta(tool_call_index=1, arguments='{"city":'),
        ReplyDelta(tool_call_index=1, arguments=' "Shangh'),
        ReplyDelta(tool_call_index=1, arguments='ai"}'),
    ]


async def test_text_the_deltas_missed_is_reported_when_its_item_is_done(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    events = events_for(STREAM_CASES["text"], piece=10)
    # A server that sends only the first delta: the rest arrives with output_item.done.
    deltas_seen = [e for e in events if e["type"] == "response.output_text.delta"]
    events = [e for e in events if e not in deltas_seen[1:]]
    server.then(streamed(events))
    deltas: list[ReplyDelta] = []
    response = await make_model(stream=True).request(make_request(on_delta=deltas.append))
    assert "".join(d.text for d in deltas) == response.message.content
    assert len(deltas) == 2


async def test_a_final_event_without_output_keeps_the_streamed_items(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    payload = STREAM_CASES["text_and_calls"]
    events = events_for(payload)
    events[-1] = {**events[-1], "response": {**payload, "output": []}}  # some servers do this
    server.then(whole(payload), streamed(events))
    complete = await make_model().request(make_request())
    assert await make_model(stream=True).request(make_request()) == complete


async def test_a_stream_that_ends_before_its_final_event_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.then(streamed(events_for(STREAM_CASES["text"])[:-1]))
    failure = await failure_of(make_model(stream=True))
    assert failure.transient
    assert "final event" in str(failure)


async def test_a_stream_that_breaks_off_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    head = sse(events_for(STREAM_CASES["text"])[:4])

    async def body() -> AsyncIterator[bytes]:
        yield head
        raise http.ReadError("connection reset by peer")

    server.then(http.Response(200, content=body(), headers={"content-type": "text/event-stream"}))
    assert (await failure_of(make_model(stream=True))).transient


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        # as the API sends it: the details nested under "error"
        ({"error": {"type": "server_error", "code": "server_error", "message": "Oops."}}, True),
        (
            {
                "error": {
                    "type": "insufficient_quota",
                    "code": "insufficient_quota",
                    "message": "Oops.",
                }
            },
            False,
        ),
        # as the SDK's own event type has it: flat
        ({"code": "server_error", "message": "Oops.", "param": None}, True),
        ({"code": "invalid_prompt", "message": "Oops.", "param": None}, False),
    ],
)
async def test_an_error_event_mid_stream_fails_the_request_by_its_code(
    server: FakeServer, make_model: Callable[..., Any], error: dict[str, Any], transient: bool
) -> None:
    events = events_for(STREAM_CASES["text"])
    server.then(streamed([*events[:4], {"type": "error", "sequence_number": 4, **error}]))
    failure = await failure_of(make_model(stream=True))
    assert failure.transient is transient
    assert "Oops." in str(failure)


async def test_an_on_delta_that_raises_does_not_break_the_stream(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    def broken(delta: ReplyDelta) -> None:
        raise RuntimeError("listener bug")

    server.then(streamed(events_for(STREAM_CASES["text"])))
    with capture_logs() as logs:
        response = await make_model(stream=True).request(make_request(on_delta=broken))
    assert response.message.content.startswith("Sunny")
    assert [entry["event"] for entry in logs] == ["on_delta_failed"]  # once, not per event


async def test_a_malformed_event_is_permanent(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    events = events_for(STREAM_CASES["text"])
    bad = {"type": "response.output_text.delta", "output_index": "zero", "delta": "x"}
    server.then(streamed([*events[:3], bad]))
    failure = await failure_of(make_model(stream=True))
    assert not failure.transient  # the same server sends the same shape again (issue 35)
    assert "malformed" in str(failure)


# --------------------------------------------------------------------------- requests


async def test_the_request_body_has_the_responses_shape(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    transcript = [
        SystemMessage(content="Be brief."),
        SystemMessage(content="Use celsius."),
        UserMessage(content="Weather in Paris and Oslo?"),
        AssistantMessage(
            content="Checking.",
            tool_calls=(
                ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
                ToolCall(id="call_2", name="get_weather", arguments='{"city": "Os'),
            ),
        ),
        ToolMessage(tool_call_id="call_1", name="get_weather", content="21 C", details={"x": 1}),
        ToolMessage(
            tool_call_id="call_2",
            name="get_weather",
            content="arguments are not JSON",
            status=ToolStatus.ERROR,
        ),
        SystemMessage(content="The user is in a hurry."),
    ]
    server.then(whole(response_payload([message_item("Sunny.")])))
    model = make_model(temperature=0.2, max_tokens=300, top_p=0.9, parallel_tool_calls=False)
    await model.request(make_request(*transcript))
    body = server.body()
    assert body["model"] == MODEL
    assert body["instructions"] == "Be brief.\n\nUse celsius."
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "Weather in Paris and Oslo?"},
        {"type": "message", "role": "assistant", "content": "Checking."},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "21 C"},
        {"type": "function_call_output", "call_id": "call_2", "output": "arguments are not JSON"},
        {"type": "message", "role": "system", "content": "The user is in a hurry."},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": WEATHER.parameters,
            "strict": False,  # said outright: the API's own default is strict
        }
    ]
    assert body["store"] is False
    assert (body["temperature"], body["max_output_tokens"], body["top_p"]) == (0.2, 300, 0.9)
    assert body["parallel_tool_calls"] is False
    assert not {"previous_response_id", "include", "stream", "max_tokens"} & set(body)


async def test_tool_settings_are_dropped_when_no_tools_are_sent(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.then(whole(response_payload([message_item("ok")])))
    await make_model(tool_choice="auto", parallel_tool_calls=True).request(make_request(tools=()))
    body = server.body()
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(body)
    assert "instructions" not in body


async def test_strict_tools_are_adapted_on_a_copy_and_their_nulls_removed(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    free_form = ToolSpec(
        name="remember",
        description="Store anything.",
        parameters={"type": "object", "properties": {"data": {"type": "object"}}},
    )
    before = copy.deepcopy((WEATHER.parameters, free_form.parameters))
    call = function_call_item("call_1", "get_weather", '{"city": "Paris", "unit": null}')
    server.then(whole(response_payload([call])), whole(response_payload([message_item("ok")])))
    model = make_model(strict=True)
    response = await model.request(make_request(tools=(WEATHER, free_form)))
    weather, remember = server.body()["tools"]
    assert weather["strict"] is True
    assert weather["parameters"]["additionalProperties"] is False
    assert weather["parameters"]["required"] == ["city", "unit"]
    assert weather["parameters"]["properties"]["unit"]["type"] == ["string", "null"]
    assert "default" not in weather["parameters"]["properties"]["unit"]
    assert (remember["strict"], remember["parameters"]) == (False, free_form.parameters)
    assert (WEATHER.parameters, free_form.parameters) == before
    assert json.loads(response.message.tool_calls[0].arguments) == {"city": "Paris"}
    await model.request(make_request(tools=(WEATHER, free_form)))  # converted once, cached
    assert server.body(0)["tools"] == server.body(1)["tools"]


async def test_typed_output_travels_as_text_format(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "note": {"type": "string"}},
        "required": ["city"],
    }
    server.then(whole(response_payload([message_item('{"city": "Paris", "note": null}')])))
    model = make_model(strict=True, text={"verbosity": "low"})
    assert model.supports_native_output is True
    response = await model.request(
        make_request(tools=(), output=OutputFormat(name="weather report", schema=schema))
    )
    text = server.body()["text"]
    assert text["verbosity"] == "low"
    assert text["format"]["type"] == "json_schema"
    assert (text["format"]["name"], text["format"]["strict"]) == ("weather_report", True)
    assert json.loads(response.message.content) == {"city": "Paris"}


def test_tool_schema_issues_name_the_tool_keyword_and_provider() -> None:
    @tool
    def remember(data: dict[str, Any]) -> str:
        """Store anything."""
        return "ok"

    strict = OpenAIResponsesModel(MODEL, api_key=FAKE_KEY, strict=True)
    [issue] = strict.tool_schema_issues([remember.spec])
    assert (issue.tool, issue.provider, issue.fatal) == (
        "remember",
        "openai-responses strict mode",
        False,
    )
    assert "free-form" in issue.keyword
    with pytest.warns(ToolSchemaWarning, match="remember"):
        Agent(model=strict, tools=[remember])
    relaxed = OpenAIResponsesModel(MODEL, api_key=FAKE_KEY)
    assert relaxed.tool_schema_issues([remember.spec]) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Agent(model=relaxed, tools=[remember])


# --------------------------------------------------------------------------- reasoning items


def test_reasoning_goes_back_before_the_items_it_preceded() -> None:
    layout: list[Any] = [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc1"},
        {"type": "message", "id": "msg_1"},
        {"type": "reasoning", "id": "rs_2", "summary": [], "encrypted_content": "enc2"},
        {"type": "function_call", "index": 1},
        {"type": "function_call", "index": 0},
        {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "enc3"},
    ]
    message = AssistantMessage(
        content="Both.",
        tool_calls=(
            ToolCall(id="call_1_0", name="a", arguments="{}"),  # ids the engine may rename
            ToolCall(id="call_1_1", name="b", arguments="{}"),
        ),
        provider_data={PROVIDER_KEY: {"output": layout}, "anthropic": {"x": 1}},
    )
    _, items = to_responses_input([message])
    assert [item.get("id") or item.get("call_id") for item in items] == [
        "rs_1",
        "msg_1",
        "rs_2",
        "call_1_1",
        "call_1_0",
    ]  # rs_3 had nothing after it: the API refuses such an item
    assert items[0] == layout[0]
    assert items[1]["type"] == "message"
    assert items[1]["content"] == [{"type": "output_text", "text": "Both.", "annotations": []}]


def test_reasoning_without_encrypted_content_needs_a_store() -> None:
    layout: list[Any] = [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "index": 0},
    ]
    message = AssistantMessage(
        tool_calls=(ToolCall(id="c", name="a"),), provider_data={PROVIDER_KEY: {"output": layout}}
    )
    assert [i["type"] for i in to_responses_input([message])[1]] == ["function_call"]
    stored = to_responses_input([message], stored=True)[1]
    assert [i["type"] for i in stored] == ["reasoning", "function_call"]


async def test_reasoning_items_are_asked_for_kept_and_sent_back_in_a_run(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    thought = reasoning_item("rs_9", encrypted="gAAAA-secret-thought", summary="Look it up.")
    first = response_payload(
        [thought, function_call_item("call_w", "get_weather", '{"city": "Paris"}')]
    )
    server.then(
        streamed(events_for(first)),
        streamed(events_for(response_payload([message_item("Sunny.")]))),
    )
    model = make_model(
        stream=True, reasoning={"effort": "low"}, include=["web_search_call.results"]
    )
    result = await Agent(model=model, tools=[get_weather]).run("Weather in Paris?")
    assert result.output == "Sunny."
    assert server.body(0)["include"] == ["web_search_call.results", "reasoning.encrypted_content"]
    assert server.body(0)["reasoning"] == {"effort": "low"}
    sent = server.body(1)["input"]
    assert [item.get("role", item["type"]) for item in sent] == [
        "user",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert sent[1] == {
        "type": "reasoning",
        "id": "rs_9",
        "summary": [{"type": "summary_text", "text": "Look it up."}],
        "encrypted_content": "gAAAA-secret-thought",
    }
    [reply] = [m for m in result.messages if isinstance(m, AssistantMessage) and m.tool_calls]
    assert reply.provider_data is not None
    assert PROVIDER_KEY in reply.provider_data


def test_encrypted_reasoning_is_not_asked_for_when_stored_or_without_reasoning() -> None:
    assert "include" not in OpenAIResponsesModel(MODEL, api_key=FAKE_KEY)._settings
    stored = OpenAIResponsesModel(MODEL, api_key=FAKE_KEY, store=True, reasoning={"effort": "low"})
    assert "include" not in stored._settings


# --------------------------------------------------------------------------- failures


async def test_a_rate_limit_is_transient_with_its_retry_after(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    error = api_error("Rate limit reached", type_="requests", code="rate_limit_exceeded")
    server.then(whole(error, 429, **{"retry-after": "7"}))
    failure = await failure_of(make_model())
    assert (failure.transient, failure.retry_after_s) == (True, 7.0)
    assert "429" in str(failure)
    assert len(server.requests) == 1, "the SDK's own retries are off"


async def test_an_exhausted_quota_is_permanent(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    error = api_error(
        "You exceeded your quota.", type_="insufficient_quota", code="insufficient_quota"
    )
    server.then(whole(error, 429))
    assert not (await failure_of(make_model())).transient


@pytest.mark.parametrize("status", [408, 409, 500, 502, 503, 529])
async def test_server_errors_are_transient(
    server: FakeServer, make_model: Callable[..., Any], status: int
) -> None:
    server.then(whole(api_error("The server had an error.", type_="server_error"), status))
    failure = await failure_of(make_model())
    assert failure.transient
    assert str(status) in str(failure)
    assert "/v1/responses" in str(failure)
    assert len(server.requests) == 1


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_client_errors_are_permanent(
    server: FakeServer, make_model: Callable[..., Any], status: int
) -> None:
    server.then(
        whole(api_error(f"problem {status}: fix it", type_="invalid_request_error"), status)
    )
    failure = await failure_of(make_model(stream=status == 404))
    assert not failure.transient
    assert f"problem {status}: fix it" in str(failure)
    assert failure.retry_after_s is None


@pytest.mark.parametrize("kind", ["ReadTimeout", "ConnectError"])
async def test_timeouts_and_dropped_connections_are_transient(
    server: FakeServer, make_model: Callable[..., Any], kind: str
) -> None:
    async def fail(request: Any) -> Any:
        raise getattr(http, kind)("simulated network failure", request=request)

    server.then(fail)
    failure = await failure_of(make_model())
    assert failure.transient
    assert len(server.requests) == 1


async def test_the_key_never_leaks(server: FakeServer, make_model: Callable[..., Any]) -> None:
    body = api_error(f"Incorrect API key provided: {FAKE_KEY}.", type_="invalid_request_error")
    echo = {"type": "error", "sequence_number": 2, "code": None, "message": f"bad {FAKE_KEY}"}
    server.then(whole(body, 401), streamed([*events_for(STREAM_CASES["text"])[:2], echo]))
    model = make_model()
    with capture_logs() as logs:
        failures = [await failure_of(model), await failure_of(make_model(stream=True))]
    assert not failures[0].transient
    assert "Incorrect API key provided" in str(failures[0])
    for failure in failures:
        assert failure.__cause__ is None
        assert failure.__context__ is None
        text = "".join(traceback.format_exception(failure)) + repr(failure.args)
        assert FAKE_KEY not in text
    assert FAKE_KEY not in repr(model) + repr(logs)
    lazy = OpenAIResponsesModel(MODEL, api_key=FAKE_KEY, base_url="https://u:pw@api.test/v1?k=1")
    assert FAKE_KEY not in repr(lazy)
    assert "pw" not in repr(lazy)
    assert "k=1" not in repr(lazy)


def test_a_missing_api_key_is_found_when_the_model_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIResponsesModel(MODEL)


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    ("options", "complaint"),
    [
        ({"model": ""}, "model name"),
        ({"model": MODEL, "timeout": 0}, "timeout"),
        ({"model": MODEL, "max_output_token": 10}, "did you mean 'max_output_tokens'"),
        ({"model": MODEL, "max_tokens": 10, "max_output_tokens": 10}, "not both"),
        ({"model": MODEL, "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"model": MODEL, "input": []}, "input"),
        ({"model": MODEL, "instructions": "x"}, "instructions"),
        ({"model": MODEL, "max_retries": 2}, "retries are the engine's"),
        ({"model": MODEL, "organization": "org"}, "option of the SDK client"),
        ({"model": MODEL, "context_window": 0}, "context_window"),
    ],
)
def test_bad_configuration_raises_at_construction(options: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ConfigError, match=complaint):
        OpenAIResponsesModel(**options)


async def test_a_client_and_a_key_together_are_rejected(sdk_client: openai.AsyncOpenAI) -> None:
    with pytest.raises(ConfigError):
        OpenAIResponsesModel(MODEL, client=sdk_client, api_key=FAKE_KEY)


async def test_a_given_client_is_used_without_retries_and_never_closed(
    server: FakeServer, sdk_client: openai.AsyncOpenAI
) -> None:
    server.then(whole(response_payload([message_item("ok")])))
    async with OpenAIResponsesModel(MODEL, client=sdk_client, extra_body={"x": 1}) as model:
        assert (await model.request(make_request())).message.content == "ok"
    assert not sdk_client.is_closed()
    assert server.body()["x"] == 1
    assert server.requests[0].headers["authorization"] == f"Bearer {FAKE_KEY}"


async def test_the_lazy_client_reads_the_environment_and_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = LocalServer()
    async with local as base_url:
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        local.reply(response_payload([message_item("from env")]))
        local.reply(api_error("boom", type_="server_error"), status=500)
        async with OpenAIResponsesModel(MODEL) as model:
            assert (await model.request(make_request())).message.content == "from env"
            client = model._own_client
            failure = await failure_of(model)
        assert failure.transient
        assert client is not None
        assert client.is_closed()
        assert len(local.seen) == 2  # one request for the 500: no hidden SDK retries
        assert local.seen[0][0]["authorization"] == f"Bearer {FAKE_KEY}"


# --------------------------------------------------------------------------- through an Agent


async def test_an_agent_streams_retries_and_finishes_through_the_real_sdk(
    server: FakeServer, make_model: Callable[..., OpenAIResponsesModel]
) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    rate_limited = api_error("Rate limit reached", type_="requests", code="rate_limit_exceeded")
    call = function_call_item("call_w", "get_weather", '{"city": "Beijing"}')
    server.then(
        whole(rate_limited, 429, **{"retry-after": "2"}),
        streamed(events_for(response_payload([call]))),
        streamed(events_for(response_payload([message_item("It is sunny in Beijing.")]))),
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
    result = await agent.subscribe(events.append).run("Weather in Beijing?")
    assert (result.stop_reason, result.output) == (
        StopReason.FINAL_ANSWER,
        "It is sunny in Beijing.",
    )
    assert delays == [2.0]  # Retry-After wins over the shorter backoff
    assert [e.permanent for e in events if isinstance(e, ModelFailed)] == [False]
    deltas = [e.delta for e in events if isinstance(e, MessageUpdated)]
    assert "".join(d.text for d in deltas) == "It is sunny in Beijing."
    assert "".join(d.arguments for d in deltas) == '{"city": "Beijing"}'
    assert server.body(2)["instructions"] == "Be brief."
    assert result.usage.requests == 2
    assert result.usage.cached_tokens == 2 * 64
    assert not result.usage.estimated


# --------------------------------------------------------------------------- live


@pytest.mark.skipif(
    not os.environ.get("AGENT_FSM_LIVE_RESPONSES_BASE_URL"),
    reason="set AGENT_FSM_LIVE_RESPONSES_BASE_URL (and AGENT_FSM_LIVE_API_KEY) to run",
)
async def test_live_tool_turn() -> None:
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny, 21 degrees in {city}"

    key = os.environ.get("AGENT_FSM_LIVE_API_KEY") or os.environ.get("OPENAI_API_KEY") or "unused"
    async with OpenAIResponsesModel(
        os.environ.get("AGENT_FSM_LIVE_RESPONSES_MODEL", MODEL),
        base_url=os.environ["AGENT_FSM_LIVE_RESPONSES_BASE_URL"],
        api_key=key,
        stream=True,
        timeout=60,
    ) as model:
        result = await Agent(model=model, tools=[get_weather], limits=Limits(max_turns=4)).run(
            "What is the weather in Paris? Use the tool."
        )
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.usage.requests >= 1


@pytest.mark.parametrize(
    ("choice", "sent"),
    [
        ("required", "required"),
        ("none", "none"),
        ("lookup", {"type": "function", "name": "lookup"}),
    ],
)
async def test_a_requested_tool_choice_is_sent_and_wins_over_the_setting(
    choice: str, sent: object
) -> None:
    server = FakeServer()
    server.then(KIT.reply(ModelResponse(message=AssistantMessage(content="ok"))))
    sdk = openai.AsyncOpenAI(
        api_key="k", base_url="https://api.test/v1", http_client=server.client()
    )
    model = OpenAIResponsesModel("gpt-4.1-mini", client=sdk, tool_choice="auto")
    spec = ToolSpec(name="lookup", description="d", parameters={"type": "object"})
    request = ModelRequest(
        messages=(UserMessage(content="hi"),), tools=(spec,), run_id="r", turn=1, tool_choice=choice
    )
    await model.request(request)
    assert server.body()["tool_choice"] == sent
