"""The OpenAI Chat Completions adapter, exercised through the real SDK and a mock transport.

No test touches the network: the SDK gets an HTTP client whose transport is a function of the
request (or, for the lazily built client, a tiny server on 127.0.0.1). The live test runs only
when AGENT_FSM_LIVE_BASE_URL is set.
"""

from __future__ import annotations

import asyncio
import copy
import email.utils
import json
import os
import traceback
import warnings
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import openai
import pytest
from structlog.testing import capture_logs

from agent_fsm.agent import Agent
from agent_fsm.errors import ConfigError, ToolSchemaWarning
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
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.models.common import parse_retry_after
from agent_fsm.models.openai_chat import OpenAIChatModel
from agent_fsm.models.openai_convert import (
    finish_reason_from,
    response_from_completion,
    usage_from,
)
from agent_fsm.models.openai_schema import strict_schema, without_strict_nulls
from agent_fsm.tools.tool import Tool, ToolRegistry, tool
from tests.openai_payloads import (
    COMPLETION_ID,
    SERVED_MODEL,
    USAGE,
    api_error,
    chunks_for,
    completion,
    sse,
    tool_call,
)
from tests.provider_kits.base import http  # the HTTP library the installed SDK is built on

FAKE_KEY = "sk-test-DO-NOT-LEAK-0123456789abcdefABCDEF"
MODEL = "gpt-4o-mini"

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
    *messages: Any, tools: tuple[ToolSpec, ...] = (WEATHER,), on_delta: Any = None
) -> ModelRequest:
    transcript = list(messages) or [UserMessage(content="Weather in Beijing?")]
    return ModelRequest(
        messages=TranscriptView(transcript), tools=tools, run_id="run1", turn=1, on_delta=on_delta
    )


# --------------------------------------------------------------------------- fake server

Reply = Callable[[Any], Any]


@dataclass
class FakeServer:
    """Answers SDK requests from a queue of canned replies and records what it was sent."""

    replies: deque[Reply] = field(default_factory=deque)
    requests: list[Any] = field(default_factory=list)

    def json(self, payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> None:
        self.replies.append(lambda req: http.Response(status, json=payload, headers=headers))

    def raw(self, body: bytes, status: int = 200, content_type: str = "application/json") -> None:
        headers = {"content-type": content_type}
        self.replies.append(lambda req: http.Response(status, content=body, headers=headers))

    def stream(self, events: list[dict[str, Any]], *, done: bool = True) -> None:
        self.raw(sse(events, done=done), content_type="text/event-stream")

    def fail(self, exc_type: type[Exception]) -> None:
        def reply(req: Any) -> Any:
            raise exc_type("simulated network failure", request=req)

        self.replies.append(reply)

    def body(self, index: int = -1) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.requests[index].content)
        return result

    async def handle(self, request: Any) -> Any:
        self.requests.append(request)
        if not self.replies:
            raise AssertionError("the fake server got an unexpected request")
        return self.replies.popleft()(request)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


@pytest.fixture
async def sdk_client(server: FakeServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        api_key=FAKE_KEY,
        base_url="https://api.test/v1",
        max_retries=3,  # the adapter must turn these off
        http_client=http.AsyncClient(transport=http.MockTransport(server.handle)),
    )
    yield client
    await client.close()


@pytest.fixture
def make_model(sdk_client: openai.AsyncOpenAI) -> Callable[..., OpenAIChatModel]:
    def make(**options: Any) -> OpenAIChatModel:
        return OpenAIChatModel(MODEL, client=sdk_client, **options)

    return make


async def ask(model: OpenAIChatModel, request: ModelRequest | None = None) -> ModelResponse:
    return await model.request(request or make_request())


async def failure_of(awaitable: Awaitable[Any]) -> ModelCallError:
    with pytest.raises(ModelCallError) as info:
        await awaitable
    return info.value


# --------------------------------------------------------------------------- replies


async def test_plain_text_reply(server: FakeServer, make_model: Callable[..., Any]) -> None:
    server.json(completion("It is sunny in Beijing."))
    response = await ask(make_model())
    assert response == ModelResponse(
        message=AssistantMessage(content="It is sunny in Beijing."),
        finish_reason=FinishReason.STOP,
        usage=Usage(
            input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1
        ),
        model_name=SERVED_MODEL,
    )
    assert isinstance(make_model(), Model)
    assert make_model().name == MODEL


async def test_tool_call_reply(server: FakeServer, make_model: Callable[..., Any]) -> None:
    call = tool_call("call_Wq1", "get_weather", '{"city": "Beijing"}')
    server.json(completion(None, tool_calls=[call], finish_reason="tool_calls"))
    response = await ask(make_model())
    assert response.message == AssistantMessage(
        content="",
        tool_calls=(ToolCall(id="call_Wq1", name="get_weather", arguments='{"city": "Beijing"}'),),
    )
    assert response.finish_reason is FinishReason.TOOL_CALLS


async def test_parallel_tool_calls_keep_order(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    calls = [
        tool_call("call_A", "get_weather", '{"city": "Beijing"}'),
        tool_call("call_B", "get_weather", '{"city": "Shanghai"}'),
        tool_call("call_C", "get_time", "{}"),
    ]
    server.json(completion("Checking both.", tool_calls=calls, finish_reason="tool_calls"))
    response = await ask(make_model())
    assert [(c.id, c.name, c.arguments) for c in response.message.tool_calls] == [
        ("call_A", "get_weather", '{"city": "Beijing"}'),
        ("call_B", "get_weather", '{"city": "Shanghai"}'),
        ("call_C", "get_time", "{}"),
    ]
    assert response.message.content == "Checking both."


async def test_invalid_argument_json_is_kept_raw(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    raw = '{"city": "Beij'  # truncated: not JSON, must reach the engine intact
    server.json(completion(None, tool_calls=[tool_call("call_X", "get_weather", raw)]))
    response = await ask(make_model())
    assert response.message.tool_calls[0].arguments == raw


async def test_missing_usage_is_none(server: FakeServer, make_model: Callable[..., Any]) -> None:
    server.json(completion("ok", usage=None))
    assert (await ask(make_model())).usage is None


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("stop", FinishReason.STOP),
        ("length", FinishReason.LENGTH),
        ("content_filter", FinishReason.CONTENT_FILTER),
        ("tool_calls", FinishReason.TOOL_CALLS),
        ("function_call", FinishReason.TOOL_CALLS),
        (None, FinishReason.STOP),
        ("something_new", FinishReason.STOP),
    ],
)
async def test_finish_reasons(
    server: FakeServer, make_model: Callable[..., Any], reason: str | None, expected: FinishReason
) -> None:
    server.json(completion("partial answer", finish_reason=reason))
    assert (await ask(make_model())).finish_reason is expected


async def test_legacy_function_call_becomes_a_tool_call(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    legacy = {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    server.json(completion(None, function_call=legacy, finish_reason="function_call"))
    response = await ask(make_model())
    assert response.message.tool_calls == (
        ToolCall(id=f"call_{COMPLETION_ID}_0", name="get_weather", arguments='{"city": "Paris"}'),
    )
    assert response.finish_reason is FinishReason.TOOL_CALLS


async def test_refusal_is_shown_as_content_and_reported_as_refusal(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.json(completion(None, refusal="I can't help with that."))
    response = await ask(make_model())
    assert response.message.content == "I can't help with that."
    assert response.finish_reason is FinishReason.REFUSAL


def test_missing_tool_call_ids_are_synthesised_stably() -> None:
    reply = completion(None, tool_calls=[tool_call("", "a", "{}"), tool_call("", "b", "{}")])
    reply["id"] = None
    response = response_from_completion(reply, fallback_id_prefix="run9_3")
    assert [c.id for c in response.message.tool_calls] == ["call_run9_3_0", "call_run9_3_1"]


# --------------------------------------------------------------------------- streaming

STREAM_CASES = {
    "text": completion("Sunny, 21 degrees, light wind from the north."),
    "tool_call": completion(
        None,
        tool_calls=[tool_call("call_1", "get_weather", '{"city": "Beijing", "unit": "celsius"}')],
        finish_reason="tool_calls",
    ),
    "parallel": completion(
        "Let me check.",
        tool_calls=[
            tool_call("call_1", "get_weather", '{"city": "Beijing"}'),
            tool_call("call_2", "get_weather", '{"city": "Shanghai"}'),
        ],
        finish_reason="tool_calls",
    ),
    "invalid_json": completion(
        None, tool_calls=[tool_call("call_1", "get_weather", '{"city": Beij')]
    ),
    "legacy": completion(
        None,
        function_call={"name": "get_weather", "arguments": '{"city": "Paris"}'},
        finish_reason="function_call",
    ),
    "length": completion("This answer was cut off in the mid", finish_reason="length"),
    "content_filter": completion("", finish_reason="content_filter"),
    "refusal": completion(None, refusal="I can't help with that."),
    "no_usage": completion("Fine.", usage=None),
}


@pytest.mark.parametrize("case", sorted(STREAM_CASES))
async def test_streamed_reply_equals_whole_reply(
    server: FakeServer, make_model: Callable[..., Any], case: str
) -> None:
    reply = STREAM_CASES[case]
    server.json(reply)
    whole = await ask(make_model())

    deltas: list[ReplyDelta] = []
    server.stream(chunks_for(reply, piece=3))
    streamed = await ask(make_model(stream=True), make_request(on_delta=deltas.append))

    assert streamed == whole
    assert server.body(-1)["stream"] is True
    assert server.body(-1)["stream_options"] == {"include_usage": True}
    # The fragments, in order, rebuild the reply.
    assert "".join(d.text for d in deltas) == whole.message.content
    for index, call in enumerate(whole.message.tool_calls):
        mine = [d for d in deltas if d.tool_call_index == index]
        assert len(mine) > 1 or not call.arguments
        assert mine[0].tool_name == call.name
        assert all(d.tool_name is None for d in mine[1:])
        assert "".join(d.arguments for d in mine) == call.arguments
        assert mine[0].tool_call_id == call.id  # synthesised ids too (legacy function_call)
    assert all((d.text == "") != (d.tool_call_index is None) for d in deltas)


async def test_stream_deltas_arrive_in_order(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.stream(chunks_for(STREAM_CASES["parallel"], piece=8))
    deltas: list[ReplyDelta] = []
    await ask(make_model(stream=True), make_request(on_delta=deltas.append))
    assert deltas == [
        ReplyDelta(text="Let me c"),
        ReplyDelta(text="heck."),
        ReplyDelta(tool_call_index=0, tool_call_id="call_1", tool_name="get_weather"),
        ReplyDelta(tool_call_index=0, arguments='{"city":'),
        ReplyDelta(tool_call_index=0, arguments=' "Beijin'),
        ReplyDelta(tool_call_index=0, arguments='g"}'),
        ReplyDelta(tool_call_index=1, tool_call_id="call_2", tool_name="get_weather"),
        ReplyDelta(tool_call_index=1, arguments='{"city":'),
        ReplyDelta(tool_call_index=1, arguments=' "Shangh'),
        ReplyDelta(tool_call_index=1, arguments='ai"}'),
    ]


async def test_on_delta_that_raises_does_not_break_the_stream(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    def broken(delta: ReplyDelta) -> None:
        raise RuntimeError("listener bug")

    server.stream(chunks_for(STREAM_CASES["text"]))
    with capture_logs() as logs:
        response = await ask(make_model(stream=True), make_request(on_delta=broken))
    assert response.message.content == STREAM_CASES["text"]["choices"][0]["message"]["content"]
    assert [entry["event"] for entry in logs] == ["on_delta_failed"]  # logged once, not per chunk


async def test_stream_without_on_delta(server: FakeServer, make_model: Callable[..., Any]) -> None:
    server.stream(chunks_for(STREAM_CASES["tool_call"]))
    response = await ask(make_model(stream=True), make_request(on_delta=None))
    assert response.message.tool_calls[0].id == "call_1"


async def test_stream_usage_on_every_chunk_last_wins(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    chunks = chunks_for(completion("abcdefgh"), piece=4)
    for n, chunk in enumerate(chunks):
        chunk["usage"] = {"prompt_tokens": 10, "completion_tokens": n, "total_tokens": 10 + n}
    server.stream(chunks)
    usage = (await ask(make_model(stream=True))).usage
    assert usage == Usage(input_tokens=10, output_tokens=len(chunks) - 1, requests=1)


async def test_stream_tool_calls_without_index_or_with_repeated_index(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    # Some compatible servers send every call whole, all with index 0 (or with no index).
    def chunk(call: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "x",
            "model": "local",
            "choices": [{"index": 0, "delta": {"tool_calls": [call]}}],
        }

    first = {"index": 0, "id": "a", "function": {"name": "f", "arguments": "{}"}}
    second = {"index": 0, "id": "b", "function": {"name": "g", "arguments": '{"n": 1}'}}
    third = {"id": "c", "function": {"name": "h", "arguments": "{"}}
    tail = {"function": {"arguments": "}"}}
    finish = {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}
    server.stream([chunk(first), chunk(second), chunk(third), chunk(tail), finish])
    response = await ask(make_model(stream=True))
    assert [(c.id, c.name, c.arguments) for c in response.message.tool_calls] == [
        ("a", "f", "{}"),
        ("b", "g", '{"n": 1}'),
        ("c", "h", "{}"),
    ]


# --------------------------------------------------------------------------- request shape


async def test_request_body_has_the_wire_shape(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Beijing"}')
    transcript = [
        SystemMessage(content="Be brief."),
        UserMessage(content="Weather in Beijing?"),
        AssistantMessage(content="", tool_calls=(call,)),
        ToolMessage(
            tool_call_id="call_1",
            name="get_weather",
            content="error: upstream down",
            status=ToolStatus.ERROR,
            details={"trace": "never sent"},
        ),
        AssistantMessage(content="Sorry, the service is down."),
        UserMessage(content="Try again."),
    ]
    server.json(completion("ok"))
    await ask(make_model(temperature=0.2, max_tokens=300, seed=7), make_request(*transcript))
    assert server.body() == {
        "model": MODEL,
        "temperature": 0.2,
        "max_tokens": 300,
        "seed": 7,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in Beijing?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Beijing"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "error: upstream down"},
            {"role": "assistant", "content": "Sorry, the service is down."},
            {"role": "user", "content": "Try again."},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": WEATHER.parameters,
                },
            }
        ],
    }
    request = server.requests[-1]
    assert request.url.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {FAKE_KEY}"


async def test_no_tools_means_no_tool_fields(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.json(completion("ok"))
    await ask(make_model(parallel_tool_calls=False, tool_choice="auto"), make_request(tools=()))
    body = server.body()
    assert "tools" not in body
    assert "tool_choice" not in body
    assert "parallel_tool_calls" not in body


async def test_strict_tools_adapt_a_copy(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    before = copy.deepcopy(WEATHER.parameters)
    server.json(completion("ok"))
    server.json(completion("ok"))
    model = make_model(strict=True)
    await ask(model)
    await ask(model)
    assert WEATHER.parameters == before
    function = server.body()["tools"][0]["function"]
    assert function["strict"] is True
    assert function["parameters"] == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name."},
            "unit": {"type": ["string", "null"], "enum": ["celsius", "fahrenheit", None]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    }
    assert server.body(0) == server.body(1)


def test_strict_schema_recurses_and_never_mutates() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "filters": {
                "type": "object",
                "properties": {
                    "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}},
                    "after": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
                    "kind": {"oneOf": [{"const": "a"}, {"const": "b"}], "description": "Kind."},
                },
                "required": ["tags"],
            },
            "limit": {"type": "integer", "default": 10},
            "ref": {"$ref": "#/$defs/Tag", "description": "A tag."},
        },
        "required": ["query"],
        "$defs": {
            "Tag": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "weight": {"type": "number"}},
                "required": ["name"],
            }
        },
    }
    before = copy.deepcopy(schema)
    strict = strict_schema(schema)
    assert schema == before
    assert strict is not None
    jsonschema.Draft202012Validator.check_schema(strict)
    assert strict["required"] == ["query", "filters", "limit", "ref"]
    assert strict["properties"]["limit"] == {"type": ["integer", "null"]}
    assert strict["properties"]["ref"] == {
        "description": "A tag.",
        "anyOf": [{"$ref": "#/$defs/Tag"}, {"type": "null"}],
    }
    filters = strict["properties"]["filters"]
    assert filters["type"] == ["object", "null"]
    assert filters["additionalProperties"] is False
    assert filters["required"] == ["tags", "after", "kind"]
    assert filters["properties"]["after"]["anyOf"][-1] == {"type": "null"}
    assert filters["properties"]["kind"]["anyOf"] == [
        {"const": "a"},
        {"const": "b"},
        {"type": "null"},
    ]
    tag = strict["$defs"]["Tag"]
    assert tag["required"] == ["name", "weight"]
    assert tag["properties"]["weight"] == {"type": ["number", "null"]}
    # Every field present, optional ones null: what strict mode makes the model send.
    jsonschema.validate(
        {
            "query": "q",
            "filters": {"tags": [{"name": "x", "weight": None}], "after": None, "kind": None},
            "limit": None,
            "ref": None,
        },
        strict,
    )


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"data": {"type": "object"}}},
        {"type": "object", "properties": {"m": {"type": "object", "additionalProperties": True}}},
        {"type": "object", "properties": {"x": {"allOf": [{"type": "string"}]}}},
    ],
)
async def test_inexpressible_schema_is_sent_non_strict(
    server: FakeServer, make_model: Callable[..., Any], schema: dict[str, Any]
) -> None:
    assert strict_schema(schema) is None
    spec = ToolSpec(name="t", description="d", parameters=schema)
    server.json(completion("ok"))
    await ask(make_model(strict=True), make_request(tools=(spec,)))
    function = server.body()["tools"][0]["function"]
    assert "strict" not in function
    assert function["parameters"] == schema
    [issue] = make_model(strict=True).tool_schema_issues([spec])
    assert (issue.tool, issue.fatal) == ("t", False)
    assert issue.keyword in ("free-form object", "allOf")
    assert make_model().tool_schema_issues([spec]) == []


def test_an_agent_warns_of_a_tool_that_strict_mode_cannot_express() -> None:
    def store(data: dict[str, Any]) -> str:
        """Store free-form data."""
        return "ok"

    model = OpenAIChatModel("m", api_key="k", strict=True)
    with pytest.warns(ToolSchemaWarning, match=r"tool 'store': openai strict mode cannot express"):
        Agent(model=model, tools=[tool(store)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Agent(model=OpenAIChatModel("m", api_key="k"), tools=[tool(store)])


# --------------------------------------------------------------------------- strict replies


def search(
    query: str, limit: int = 10, cursor: str | None = None, filters: dict[str, Any] | None = None
) -> str:
    return query  # never run here: the tests only prepare calls


SEARCH = Tool(
    name="search",
    description="Search the catalogue.",
    parameters={
        "type": "object",
        "properties": {
            "query": {"type": "string"},
            "limit": {"type": "integer", "default": 10},
            "cursor": {"type": ["string", "null"]},  # null is a real value here
            "filters": {
                "type": "object",
                "properties": {"tag": {"type": "string"}, "after": {"$ref": "#/$defs/Day"}},
                "required": ["tag"],
            },
        },
        "required": ["query"],
        "$defs": {"Day": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
    },
    fn=search,
)
# What strict mode makes the model send: every key, null for those it leaves out.
STRICT_ARGUMENTS = (
    '{"query": "fsm", "limit": null, "cursor": null, "filters": {"tag": "py", "after": null}}'
)
CLEAN_ARGUMENTS = '{"query": "fsm", "cursor": null, "filters": {"tag": "py"}}'


async def test_strict_nulls_are_removed_from_both_paths(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    registry = ToolRegistry([SEARCH])
    reply = completion(
        None,
        tool_calls=[tool_call("call_S", "search", STRICT_ARGUMENTS)],
        finish_reason="tool_calls",
    )
    assert registry.prepare(ToolCall(id="c", name="search", arguments=STRICT_ARGUMENTS)).error
    server.json(reply)
    whole = await ask(make_model(strict=True), make_request(tools=registry.specs))
    deltas: list[ReplyDelta] = []
    server.stream(chunks_for(reply, piece=5))
    request = make_request(tools=registry.specs, on_delta=deltas.append)
    streamed = await ask(make_model(strict=True, stream=True), request)

    assert server.body(0)["tools"][0]["function"]["strict"] is True
    assert streamed == whole
    call = whole.message.tool_calls[0]
    assert call == ToolCall(id="call_S", name="search", arguments=CLEAN_ARGUMENTS)
    assert registry.prepare(call).error is None
    assert "".join(d.arguments for d in deltas) == STRICT_ARGUMENTS  # fragments stay raw


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    "arguments",
    [
        '{"query": "fsm", "limit": nul',  # not JSON
        '["fsm", null]',  # JSON, but not an object
        "",
        '{"query":null,"cursor":null}',  # required, or nullable in the original: meant
        '{"query":"fsm","limit":3,"filters":{"tag":"py","after":"2024-01-02"}}',  # no null
    ],
)
async def test_strict_arguments_with_nothing_to_remove_stay_raw(
    server: FakeServer, make_model: Callable[..., Any], arguments: str, stream: bool
) -> None:
    reply = completion(None, tool_calls=[tool_call("call_S", "search", arguments)])
    if stream:
        server.stream(chunks_for(reply))
    else:
        server.json(reply)
    model = make_model(strict=True, stream=stream)
    response = await ask(model, make_request(tools=(SEARCH.spec,)))
    assert response.message.tool_calls[0].arguments == arguments


@pytest.mark.parametrize(
    ("strict", "name", "schema"),
    [
        (False, "search", SEARCH.parameters),  # not strict mode
        (True, "other", SEARCH.parameters),  # a tool that was not sent
        (True, "search", {"type": "object", "properties": {"limit": {"type": "object"}}}),
    ],
)
async def test_nulls_are_kept_when_no_strict_schema_was_sent(
    server: FakeServer,
    make_model: Callable[..., Any],
    strict: bool,
    name: str,
    schema: dict[str, Any],
) -> None:
    spec = ToolSpec(name="search", description="d", parameters=schema)
    server.json(completion(None, tool_calls=[tool_call("call_S", name, STRICT_ARGUMENTS)]))
    response = await ask(make_model(strict=strict), make_request(tools=(spec,)))
    assert response.message.tool_calls[0].arguments == STRICT_ARGUMENTS


def test_without_strict_nulls_follows_the_strict_adaptation() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
            "pair": {"type": "array", "prefixItems": [{"$ref": "#/$defs/Item"}, {"type": "null"}]},
            "shape": {
                "oneOf": [
                    {
                        "type": "object",
                        "properties": {"radius": {"type": "number"}, "unit": {"type": "string"}},
                        "required": ["radius"],
                    },
                    {
                        "type": "object",
                        "properties": {"side": {"type": "number"}, "unit": {"type": "string"}},
                        "required": ["side"],
                    },
                ]
            },
            "anything": {},
            "maybe": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/Nothing"}]},
            "tree": {"$ref": "#/$defs/Node"},
        },
        "$defs": {
            "Item": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "note": {"type": "string"}},
                "required": ["name"],
            },
            "Nothing": {"type": "null"},
            "Node": {
                "type": "object",
                "properties": {
                    "label": {"type": "string"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
                },
                "required": ["children"],
            },
        },
    }
    before = copy.deepcopy(schema)
    strict = strict_schema(schema)
    assert strict is not None
    sent = {
        "items": [{"name": "a", "note": None}, {"name": "b", "note": "x"}],
        "pair": [{"name": "c", "note": None}, None],
        "shape": {"side": 2, "unit": None},
        "anything": None,
        "maybe": None,
        "tree": {"label": None, "children": [{"label": "leaf", "children": []}]},
    }
    jsonschema.validate(sent, strict)  # what strict mode lets the model send
    cleaned = json.loads(without_strict_nulls(json.dumps(sent), schema))
    assert schema == before
    assert cleaned == {
        "items": [{"name": "a"}, {"name": "b", "note": "x"}],
        "pair": [{"name": "c"}, None],
        "shape": {"side": 2},
        "anything": None,
        "maybe": None,
        "tree": {"children": [{"label": "leaf", "children": []}]},
    }
    jsonschema.validate(cleaned, schema)
    # Every optional key null, at the top: all of them go.
    everything_null = dict.fromkeys(schema["properties"])
    assert json.loads(without_strict_nulls(json.dumps(everything_null), schema)) == {
        "anything": None,
        "maybe": None,
    }


def test_without_strict_nulls_keeps_what_it_cannot_judge() -> None:
    unresolvable = {
        "type": "object",
        "properties": {"x": {"$ref": "#/$defs/Missing"}, "y": {"type": "string"}},
    }
    arguments = '{"x": null, "y": null}'
    assert without_strict_nulls(arguments, unresolvable) == arguments
    # Nested deeper than Python recurses, in the JSON itself or in the walk: left as it came.
    recursive = {"type": "object", "properties": {"c": {"$ref": "#"}, "x": {"type": "string"}}}
    for depth in (900, 5000):
        deep = '{"c": ' * depth + '{"x": null}' + "}" * depth
        assert without_strict_nulls(deep, recursive) == deep
    shallow = '{"c": ' * 3 + '{"x": null}' + "}" * 3
    assert without_strict_nulls(shallow, recursive) == '{"c": {"c": {"c": {}}}}'


def test_without_strict_nulls_survives_a_reference_cycle() -> None:
    cyclic = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/A"}},
        "$defs": {
            "A": {"$ref": "#/$defs/B", "type": "object", "properties": {"k": {"type": "string"}}},
            "B": {"$ref": "#/$defs/A"},
        },
    }
    assert without_strict_nulls('{"a": {"k": null}}', cyclic) == '{"a": {}}'


# --------------------------------------------------------------------------- errors


async def test_rate_limit_is_transient_with_retry_after(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    body = api_error("Rate limit reached for gpt-4o-mini.", type_="requests", code="rate_limit")
    server.json(body, status=429, headers={"retry-after": "7", "x-request-id": "req_42"})
    err = await failure_of(ask(make_model()))
    assert err.transient is True
    assert err.retry_after_s == 7.0
    assert "429" in str(err)
    assert "Rate limit reached for gpt-4o-mini." in str(err)
    assert "req_42" in str(err)
    assert len(server.requests) == 1  # the SDK did not retry: the engine does


async def test_retry_after_ms_wins(server: FakeServer, make_model: Callable[..., Any]) -> None:
    body = api_error("slow down", type_="requests")
    server.json(body, status=429, headers={"retry-after-ms": "250", "retry-after": "1"})
    assert (await failure_of(ask(make_model()))).retry_after_s == 0.25


async def test_exhausted_quota_is_permanent(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    body = api_error("You exceeded your current quota.", type_="insufficient_quota")
    server.json(body, status=429)
    err = await failure_of(ask(make_model()))
    assert err.transient is False
    assert err.retry_after_s is None


@pytest.mark.parametrize("status", [500, 502, 503, 408, 409])
async def test_server_errors_are_transient(
    server: FakeServer, make_model: Callable[..., Any], status: int
) -> None:
    server.json(api_error("The server had an error.", type_="server_error"), status=status)
    err = await failure_of(ask(make_model()))
    assert err.transient is True
    assert err.retry_after_s is None
    assert str(status) in str(err)
    assert len(server.requests) == 1


async def test_503_with_retry_after_date(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    later = email.utils.formatdate(timeval=2_000_000_000, usegmt=True)  # far future
    server.json(
        api_error("overloaded", type_="server_error"), status=503, headers={"retry-after": later}
    )
    err = await failure_of(ask(make_model()))
    assert err.transient is True
    assert err.retry_after_s is not None
    assert err.retry_after_s > 60


@pytest.mark.parametrize(
    ("status", "error_type"),
    [
        (400, "invalid_request_error"),
        (401, "invalid_request_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (422, "invalid_request_error"),
    ],
)
async def test_client_errors_are_permanent(
    server: FakeServer, make_model: Callable[..., Any], status: int, error_type: str
) -> None:
    server.json(api_error(f"problem {status}: fix your request", type_=error_type), status=status)
    err = await failure_of(ask(make_model()))
    assert err.transient is False
    assert f"problem {status}: fix your request" in str(err)
    assert err.retry_after_s is None


async def test_timeout_is_transient(server: FakeServer, make_model: Callable[..., Any]) -> None:
    server.fail(http.ReadTimeout)
    err = await failure_of(ask(make_model()))
    assert err.transient is True
    assert "timed out" in str(err)
    assert len(server.requests) == 1


async def test_connection_error_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.fail(http.ConnectError)
    err = await failure_of(ask(make_model()))
    assert err.transient is True


@pytest.mark.parametrize(
    "payload",
    [
        {**completion("x"), "choices": []},
        {**completion("x"), "choices": None},
        {**completion("x"), "choices": "nonsense"},
        {**completion("x"), "choices": [{"index": 0, "finish_reason": "stop"}]},
        {**completion("x"), "choices": [{"index": 0, "message": {"content": 42}}]},
        {"error": None, "detail": "not a completion"},
    ],
)
async def test_garbage_replies_are_transient(
    server: FakeServer, make_model: Callable[..., Any], payload: dict[str, Any]
) -> None:
    server.json(payload)
    err = await failure_of(ask(make_model()))
    assert err.transient is True
    assert "malformed" in str(err)


async def test_body_that_is_not_json_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    server.raw(b"<html>502 Bad Gateway</html>")
    err = await failure_of(ask(make_model()))
    assert err.transient is True


async def test_stream_error_event_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    chunks = chunks_for(STREAM_CASES["text"])[:3]
    server.stream(
        [*chunks, {"error": {"message": "The server had an error.", "type": "server_error"}}]
    )
    err = await failure_of(ask(make_model(stream=True)))
    assert err.transient is True
    assert "The server had an error." in str(err)


async def test_stream_that_breaks_off_is_transient(
    server: FakeServer, make_model: Callable[..., Any]
) -> None:
    head = sse(chunks_for(STREAM_CASES["text"])[:3], done=False)

    async def body() -> AsyncIterator[bytes]:
        yield head
        raise http.ReadError("connection reset by peer")

    server.replies.append(
        lambda req: http.Response(
            200, content=body(), headers={"content-type": "text/event-stream"}
        )
    )
    err = await failure_of(ask(make_model(stream=True)))
    assert err.transient is True


@pytest.mark.parametrize(
    "events",
    [
        [],
        [{"id": "x", "choices": [], "usage": USAGE}],
        [{"id": "x", "choices": [{"index": 0, "delta": {"tool_calls": "bad"}}]}],
    ],
)
async def test_stream_without_a_reply_is_transient(
    server: FakeServer, make_model: Callable[..., Any], events: list[dict[str, Any]]
) -> None:
    server.stream(events)
    err = await failure_of(ask(make_model(stream=True)))
    assert err.transient is True
    assert "malformed" in str(err)


async def test_stream_request_rejected(server: FakeServer, make_model: Callable[..., Any]) -> None:
    server.json(api_error("Invalid model.", type_="invalid_request_error"), status=404)
    err = await failure_of(ask(make_model(stream=True)))
    assert err.transient is False


async def test_api_key_never_leaks(server: FakeServer, make_model: Callable[..., Any]) -> None:
    # A server that echoes the key back in full, in the message and in a header.
    body = api_error(f"Incorrect API key provided: {FAKE_KEY}.", type_="invalid_request_error")
    server.json(body, status=401, headers={"x-request-id": "req_1"})
    model = make_model()
    err = await failure_of(ask(model))
    assert err.transient is False
    assert "Incorrect API key provided" in str(err)
    assert err.__cause__ is None
    assert err.__context__ is None
    text = "".join(traceback.format_exception(err)) + repr(err) + str(err.args) + repr(model)
    assert FAKE_KEY not in text
    lazy = OpenAIChatModel(MODEL, api_key=FAKE_KEY, base_url="https://user:pw@api.test/v1?k=1")
    assert FAKE_KEY not in repr(lazy)
    assert "pw" not in repr(lazy)
    assert "k=1" not in repr(lazy)


def test_a_missing_api_key_is_found_when_the_model_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        OpenAIChatModel(MODEL)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        Agent(model="openai:" + MODEL)


# --------------------------------------------------------------------------- construction


@pytest.mark.parametrize(
    "options",
    [
        {"model": ""},
        {"model": MODEL, "timeout": 0},
        {"model": MODEL, "max_tokenz": 10},
        {"model": MODEL, "messages": []},
        {"model": MODEL, "stream_options": {}},
    ],
)
def test_bad_configuration_raises_at_construction(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        OpenAIChatModel(**options)


async def test_client_and_key_together_are_rejected(sdk_client: openai.AsyncOpenAI) -> None:
    with pytest.raises(ConfigError):
        OpenAIChatModel(MODEL, client=sdk_client, api_key=FAKE_KEY)


async def test_given_client_is_not_closed(
    server: FakeServer, sdk_client: openai.AsyncOpenAI
) -> None:
    server.json(completion("ok"))
    async with OpenAIChatModel(MODEL, client=sdk_client, timeout=5.0, extra_body={"x": 1}) as m:
        await ask(m)
    assert not sdk_client.is_closed()
    assert server.body()["x"] == 1


def test_convert_helpers() -> None:
    assert finish_reason_from(3) is FinishReason.STOP
    assert usage_from(None) is None
    assert usage_from({"total_tokens": 3}) is None
    assert usage_from({"prompt_tokens": -1, "completion_tokens": 2}) is None
    assert usage_from({"prompt_tokens": 2, "completion_tokens": True}) is None
    assert usage_from({"prompt_tokens": 2, "completion_tokens": None}) == Usage(
        input_tokens=2, requests=1
    )
    now = 1_700_000_000.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after": "-3"}) == 0.0
    assert parse_retry_after({"retry-after": "soon"}) is None
    assert parse_retry_after({"retry-after": "inf"}) is None
    assert parse_retry_after({}) is None
    date = email.utils.formatdate(timeval=now + 30, usegmt=True)
    assert parse_retry_after({"retry-after": date}, now=now) == 30.0
    past = email.utils.formatdate(timeval=now - 30, usegmt=True)
    assert parse_retry_after({"retry-after": past}, now=now) == 0.0


# --------------------------------------------------------------------------- lazy client


class LocalServer:
    """A minimal HTTP/1.1 server on 127.0.0.1 answering with queued JSON replies."""

    def __init__(self) -> None:
        self.replies: deque[tuple[int, dict[str, Any]]] = deque()
        self.seen: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head[1:])
        }
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.seen.append((headers, json.loads(body)))
        status, payload = self.replies.popleft()
        data = json.dumps(payload).encode()
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n"
            f"content-length: {len(data)}\r\nconnection: close\r\n\r\n".encode()
            + data
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()


async def test_lazy_client_reads_the_environment_and_never_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    local = LocalServer()
    async with local as base_url:
        monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
        local.replies.append((200, completion("from env")))
        local.replies.append((500, api_error("boom", type_="server_error")))
        async with OpenAIChatModel(MODEL) as model:
            assert (await ask(model)).message.content == "from env"
            err = await failure_of(ask(model))
        assert err.transient is True
        assert len(local.seen) == 2  # one request for the 500: no hidden SDK retries
        assert local.seen[0][0]["authorization"] == f"Bearer {FAKE_KEY}"
        assert local.seen[0][1]["model"] == MODEL


def test_lazy_client_is_rebuilt_for_a_new_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    model = OpenAIChatModel(MODEL, api_key=FAKE_KEY)
    clients: list[object] = []

    async def one_run(close: bool) -> str:
        local = LocalServer()
        async with local as base_url:
            monkeypatch.setenv("OPENAI_BASE_URL", base_url)
            local.replies.append((200, completion("hello")))
            response = await ask(model)
            clients.append(model._own_client)
            if close:
                await model.aclose()
        return response.message.content

    assert asyncio.run(one_run(close=False)) == "hello"  # as run_sync would leave it
    assert asyncio.run(one_run(close=True)) == "hello"
    assert clients[0] is not clients[1]


# --------------------------------------------------------------------------- live


@pytest.mark.skipif(
    not os.environ.get("AGENT_FSM_LIVE_BASE_URL"), reason="set AGENT_FSM_LIVE_BASE_URL to run"
)
async def test_live_plain_request() -> None:
    key = os.environ.get("AGENT_FSM_LIVE_API_KEY") or os.environ.get("OPENAI_API_KEY") or "unused"
    async with OpenAIChatModel(
        os.environ.get("AGENT_FSM_LIVE_MODEL", MODEL),
        base_url=os.environ["AGENT_FSM_LIVE_BASE_URL"],
        api_key=key,
        max_tokens=32,
        timeout=60,
    ) as model:
        response = await model.request(
            make_request(UserMessage(content="Reply with the single word: pong"), tools=())
        )
    assert response.message.content or response.message.tool_calls


# --------------------------------------------------------------------------- through an Agent


async def test_an_agent_streams_retries_and_finishes_through_the_real_sdk(
    server: FakeServer, make_model: Callable[..., OpenAIChatModel]
) -> None:
    """End to end: a 429 is retried by the engine after the server's Retry-After, streamed
    fragments become MessageUpdated events, the tool runs, and the streamed text is the answer."""
    from agent_fsm import Agent, Limits, StopReason, tool
    from agent_fsm.events import Event, MessageUpdated, ModelFailed

    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    server.json(
        api_error("Rate limit reached", type_="requests", code="rate_limit_exceeded"),
        status=429,
        headers={"retry-after": "2"},
    )
    call_reply = completion(
        tool_calls=[tool_call("call_w", "get_weather", '{"city": "Beijing"}')],
        finish_reason="tool_calls",
    )
    server.stream(chunks_for(call_reply))
    server.stream(chunks_for(completion("It is sunny in Beijing.")))
    delays: list[float] = []

    async def no_sleep(seconds: float) -> None:
        delays.append(seconds)

    agent = Agent(
        model=make_model(stream=True),
        tools=[get_weather],
        limits=Limits(retry_backoff_s=0.1, retry_backoff_max_s=0.2),
        sleep=no_sleep,
    )
    events: list[Event] = []
    agent = agent.subscribe(events.append)
    result = await agent.run("Weather in Beijing?")

    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == "It is sunny in Beijing."
    assert [t.label for t in result.trace][:2] == ["think", "retry"]
    assert delays == [2.0]  # Retry-After wins over the shorter backoff
    failures = [e for e in events if isinstance(e, ModelFailed)]
    assert len(failures) == 1
    assert not failures[0].permanent
    deltas = [e.delta for e in events if isinstance(e, MessageUpdated)]
    assert "".join(d.text for d in deltas).endswith("It is sunny in Beijing.")
    assert "".join(d.arguments for d in deltas) == '{"city": "Beijing"}'
    assert result.usage.requests == 2
    assert not result.usage.estimated
    assert FAKE_KEY not in repr(result)


async def test_an_agent_stops_on_a_permanent_error_without_leaking_the_key(
    server: FakeServer, make_model: Callable[..., OpenAIChatModel]
) -> None:
    from agent_fsm import Agent, AgentState, StopReason

    server.json(
        api_error(f"Incorrect API key provided: {FAKE_KEY}", type_="invalid_request_error"),
        status=401,
    )
    result = await Agent(model=make_model()).run("hi")
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.MODEL_ERROR)
    assert result.error is not None
    assert "401" in result.error
    assert FAKE_KEY not in result.error
    assert len(server.requests) == 1
