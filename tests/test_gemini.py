"""The Gemini adapter, through the real ``google-genai`` SDK and a mock transport.

No test touches the network: the SDK gets an HTTP client whose transport is the kit's
``FakeServer`` (or, for the client the adapter builds itself, a tiny server on 127.0.0.1). The
live test runs only when AGENT_FSM_LIVE_GEMINI_API_KEY is set.

Stop reasons, as the adapter maps them (``gemini_convert``'s table):

==============================================  ==========================================
finishReason                                    result
==============================================  ==========================================
STOP                                            STOP (TOOL_CALLS with function calls)
MAX_TOKENS, CONTINUATION                        LENGTH
SAFETY, RECITATION, BLOCKLIST,                  CONTENT_FILTER
PROHIBITED_CONTENT, SPII, LANGUAGE, IMAGE_*,
MODEL_ARMOR, ESCALATION, PUP_LIMITED_DISABLED
promptFeedback.blockReason, no candidates       CONTENT_FILTER
MALFORMED_FUNCTION_CALL, UNEXPECTED_TOOL_CALL,  ModelCallError, transient
MALFORMED_RESPONSE, OTHER, TOO_MANY_TOOL_CALLS,
FINISH_REASON_UNSPECIFIED, NO_IMAGE
MISSING_THOUGHT_SIGNATURE                       ModelCallError, permanent
none at the end of a stream                     ModelCallError, transient (cut stream)
==============================================  ==========================================
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import os
import warnings
from typing import Any

import pytest
from google import genai
from google.genai import types
from structlog.testing import capture_logs

from agent_fsm import Agent, tool
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
    Usage,
    UserMessage,
)
from agent_fsm.models.base import ModelCallError
from agent_fsm.models.gemini import GeminiModel
from agent_fsm.models.gemini_convert import SKIP_SIGNATURE, ReplyAssembler, usage_from
from agent_fsm.table import StopReason
from tests.local_server import LocalServer, refused_url
from tests.provider_kits.base import FAKE_KEY, FakeServer, http
from tests.provider_kits.gemini import (
    BASE_URL,
    KIT,
    RETRY_INFO,
    SERVED_MODEL,
    candidate,
    chunk,
    reply_chunks,
    sdk_http,
    signature_for,
    sse,
    usage_metadata,
)

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name."},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "when": {"type": "string", "format": "date"},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
USAGE = Usage(input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1)


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


def sdk_client(server: FakeServer, *, api_key: str = FAKE_KEY, **options: Any) -> genai.Client:
    http_options = types.HttpOptions(
        base_url=BASE_URL, httpx_async_client=sdk_http(server.client()), **options
    )
    return genai.Client(vertexai=False, api_key=api_key, http_options=http_options)


def model_for(server: FakeServer, name: str = SERVED_MODEL, **kwargs: Any) -> GeminiModel:
    return GeminiModel(name, client=sdk_client(server), **kwargs)


def a_request(*messages: Any, tools: tuple[ToolSpec, ...] = (WEATHER,), **kw: Any) -> ModelRequest:
    messages = messages or (SystemMessage(content="Be brief."), UserMessage(content="Paris?"))
    return ModelRequest(messages=messages, tools=tools, run_id="run7", turn=1, **kw)


def answer(
    content: str = "", *calls: ToolCall, finish: FinishReason | None = None
) -> ModelResponse:
    reason = finish or (FinishReason.TOOL_CALLS if calls else FinishReason.STOP)
    return ModelResponse(
        message=AssistantMessage(content=content, tool_calls=calls),
        finish_reason=reason,
        usage=USAGE,
    )


def raw(*chunks: dict[str, Any], stream: bool = False) -> Any:
    if stream:
        return http.Response(
            200, content=sse(list(chunks)), headers={"content-type": "text/event-stream"}
        )
    return http.Response(200, json=chunks[0])


def decoded(signature: str) -> bytes:
    """The bytes of a base64 signature, in either alphabet, padded or not."""
    text = signature.replace("+", "-").replace("/", "_")
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


async def failure_of(model: GeminiModel, request: ModelRequest | None = None) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        await model.request(request or a_request())
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    return caught.value


# --------------------------------------------------------------------------- stop reasons


@pytest.mark.parametrize(
    ("native", "expected"),
    [
        ("STOP", FinishReason.STOP),
        ("MAX_TOKENS", FinishReason.LENGTH),
        ("CONTINUATION", FinishReason.LENGTH),
        *(
            (r, FinishReason.CONTENT_FILTER)
            for r in (
                "SAFETY",
                "RECITATION",
                "BLOCKLIST",
                "PROHIBITED_CONTENT",
                "SPII",
                "LANGUAGE",
                "IMAGE_SAFETY",
                "IMAGE_PROHIBITED_CONTENT",
                "IMAGE_RECITATION",
                "MODEL_ARMOR",
                "ESCALATION",
                "PUP_LIMITED_DISABLED",
            )
        ),
        *(
            (r, "transient")
            for r in (
                "MALFORMED_FUNCTION_CALL",
                "UNEXPECTED_TOOL_CALL",
                "MALFORMED_RESPONSE",
                "OTHER",
                "TOO_MANY_TOOL_CALLS",
                "FINISH_REASON_UNSPECIFIED",
                "NO_IMAGE",
                "IMAGE_OTHER",
            )
        ),
        ("MISSING_THOUGHT_SIGNATURE", "permanent"),
        ("SOMETHING_NEW", FinishReason.STOP),
    ],
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_every_native_finish_reason_is_mapped(
    server: FakeServer, native: str, expected: object, stream: bool
) -> None:
    cand = candidate([{"text": "so far"}], native, message=f"stopped: {FAKE_KEY}")
    server.then(raw(chunk(cand, usage_metadata(USAGE), SERVED_MODEL), stream=stream))
    model = model_for(server, stream=stream)
    with warnings.catch_warnings():  # the SDK warns of a value its enum does not know
        warnings.simplefilter("ignore", UserWarning)
        if isinstance(expected, FinishReason):
            got = await model.request(a_request())
            assert got.finish_reason is expected
            assert got.message.content == "so far"
            return
        failure = await failure_of(model)
    assert failure.transient is (expected == "transient")
    assert native in str(failure)
    assert FAKE_KEY not in str(failure), "the finish message is scrubbed too"


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_stop_with_function_calls_is_tool_calls(server: FakeServer, stream: bool) -> None:
    call = ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')
    server.then(KIT.reply(answer("", call, finish=FinishReason.STOP), stream=stream))
    got = await model_for(server, stream=stream).request(a_request())
    assert got.finish_reason is FinishReason.TOOL_CALLS
    assert got.message.tool_calls == (call,)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_blocked_prompt_is_a_content_filter_stop(server: FakeServer, stream: bool) -> None:
    body = {
        "promptFeedback": {"blockReason": "PROHIBITED_CONTENT"},
        "usageMetadata": {"promptTokenCount": 9, "totalTokenCount": 9},
        "modelVersion": SERVED_MODEL,
    }
    server.then(raw(body, stream=stream))
    got = await model_for(server, stream=stream).request(a_request())
    assert got.finish_reason is FinishReason.CONTENT_FILTER
    assert got.message == AssistantMessage()
    assert got.usage == Usage(input_tokens=9, requests=1)


async def test_no_candidates_and_no_block_is_a_transient_malformed_reply(
    server: FakeServer,
) -> None:
    server.then(raw({"modelVersion": SERVED_MODEL}))
    failure = await failure_of(model_for(server))
    assert failure.transient
    assert "no candidates" in str(failure)


async def test_a_malformed_call_is_retried_by_the_engine_then_answered(server: FakeServer) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny in {city}"

    broken = ToolCall(id="", name="get_weather", arguments='{"city": ')
    server.then(KIT.reply(answer("", broken)), KIT.reply(answer("Sunny.")))
    agent = Agent(model=model_for(server), tools=[get_weather])
    result = await agent.run("Weather?")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Sunny.")
    assert len(server.requests) == 2


# --------------------------------------------------------------------------- request body


async def test_the_request_body_has_gemini_s_shape(server: FakeServer) -> None:
    server.then(KIT.reply(answer("ok")))
    calls = (
        ToolCall(id="srv-1", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="run7_1_1", name="get_weather", arguments='{"city": "Par'),
    )
    messages = (
        SystemMessage(content="Be brief."),
        SystemMessage(content="Use metric."),
        UserMessage(content="Paris and Oslo?"),
        AssistantMessage(content="Checking.", tool_calls=calls),
        ToolMessage(tool_call_id="srv-1", name="get_weather", content="21 C"),
        ToolMessage(
            tool_call_id="run7_1_1", name="get_weather", content="bad JSON", status=ToolStatus.ERROR
        ),
        SystemMessage(content="Note: one call failed."),
        AssistantMessage(content=""),
        UserMessage(content="And now?"),
    )
    await model_for(server, temperature=0.2, max_tokens=99, top_p=0.5).request(a_request(*messages))
    request = server.requests[0]
    assert request.url.path.endswith(f"/models/{SERVED_MODEL}:generateContent")
    assert request.headers["x-goog-api-key"] == FAKE_KEY
    body = server.body()
    assert body["systemInstruction"]["parts"] == [{"text": "Be brief.\n\nUse metric."}]
    assert [c["role"] for c in body["contents"]] == ["user", "model", "user"]
    first_call, second_call = body["contents"][1]["parts"][1:]
    assert body["contents"][1]["parts"][0] == {"text": "Checking."}
    assert first_call["functionCall"] == {
        "id": "srv-1",
        "name": "get_weather",
        "args": {"city": "Paris"},
    }
    assert second_call["functionCall"] == {"name": "get_weather", "args": {}}, (
        "made-up id and bad JSON"
    )
    assert body["contents"][2]["parts"] == [
        {
            "functionResponse": {
                "id": "srv-1",
                "name": "get_weather",
                "response": {"output": "21 C"},
            }
        },
        {"functionResponse": {"name": "get_weather", "response": {"error": "bad JSON"}}},
        {"text": "Note: one call failed."},
        {"text": "And now?"},
    ]  # one user turn: the results, the note and the next question
    assert body["generationConfig"] == {"temperature": 0.2, "topP": 0.5, "maxOutputTokens": 99}
    [declaration] = body["tools"][0]["functionDeclarations"]
    assert declaration["parameters"] == {
        "type": "OBJECT",
        "properties": {
            "city": {"type": "STRING", "description": "City name."},
            "unit": {"type": "STRING", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "when": {"type": "STRING"},
        },
        "required": ["city"],
    }


async def test_the_tool_s_own_schema_is_never_changed(server: FakeServer) -> None:
    spec = ToolSpec(
        name="book",
        description="Book.",
        parameters={
            "type": "object",
            "properties": {"p": {"anyOf": [{"$ref": "#/$defs/P"}, {"type": "null"}]}},
            "$defs": {"P": {"type": "object", "properties": {"x": {"type": ["integer", "null"]}}}},
        },
    )
    before = copy.deepcopy(spec.parameters)
    server.then(KIT.reply(answer("ok")), KIT.reply(answer("ok")))
    model = model_for(server)
    await model.request(a_request(tools=(spec,)))
    await model.request(a_request(tools=(spec,)))
    assert spec.parameters == before
    sent = server.body(1)["tools"][0]["functionDeclarations"][0]["parameters"]
    assert sent["properties"]["p"] == {
        "type": "OBJECT",
        "properties": {"x": {"type": "INTEGER", "nullable": True}},
        "nullable": True,
    }


async def test_tool_settings_are_dropped_when_no_tools_are_sent(server: FakeServer) -> None:
    server.then(KIT.reply(answer("ok")))
    config = {"function_calling_config": {"mode": "ANY"}}
    await model_for(server, tool_config=config).request(a_request(tools=()))
    assert "tools" not in server.body()
    assert "toolConfig" not in server.body()


@pytest.mark.parametrize(
    ("choice", "config"),
    [
        ("required", {"mode": "ANY"}),
        ("none", {"mode": "NONE"}),
        ("get_weather", {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}),
    ],
)
async def test_a_requested_tool_choice_becomes_the_function_calling_config(
    server: FakeServer, choice: str, config: dict[str, Any]
) -> None:
    server.then(KIT.reply(answer("ok")))
    setting = {"function_calling_config": {"mode": "AUTO"}}
    await model_for(server, tool_config=setting).request(a_request(tool_choice=choice))
    assert server.body()["toolConfig"] == {"functionCallingConfig": config}


async def test_a_tool_without_arguments_is_declared_without_parameters(server: FakeServer) -> None:
    spec = ToolSpec(
        name="now",
        description="The time.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    )
    server.then(KIT.reply(answer("ok")))
    await model_for(server).request(a_request(tools=(spec,)))
    assert server.body()["tools"][0]["functionDeclarations"] == [
        {"name": "now", "description": "The time."}
    ]


# --------------------------------------------------------------------------- thought signatures


async def test_thought_signatures_go_back_with_their_calls(server: FakeServer) -> None:
    calls = (
        ToolCall(id="", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="", name="get_weather", arguments='{"city": "Oslo"}'),
    )
    server.then(KIT.reply(answer("", *calls)), KIT.reply(answer("done")))
    model = model_for(server, "gemini-3-pro-preview")
    first = await model.request(a_request())
    assert [c.id for c in first.message.tool_calls] == ["run7_1_0", "run7_1_1"]
    [signature, unsigned] = first.message.provider_data["gemini"]["calls"]  # type: ignore[index]
    assert (decoded(signature), unsigned) == (decoded(signature_for(calls[0])), None)
    results = tuple(
        ToolMessage(tool_call_id=c.id, name=c.name, content="sunny")
        for c in first.message.tool_calls
    )
    await model.request(a_request(UserMessage(content="Paris?"), first.message, *results))
    parts = server.body(1)["contents"][1]["parts"]
    assert decoded(parts[0]["thoughtSignature"]) == decoded(signature_for(calls[0]))
    assert "thoughtSignature" not in parts[1], "Gemini signs the first of parallel calls only"
    assert all("id" not in p["functionCall"] for p in parts), "the ids were made up"


@pytest.mark.parametrize(
    ("model_name", "stand_in"),
    [
        ("gemini-3-pro-preview", True),
        ("gemini-flash-latest", True),
        ("gemini-2.5-flash", False),
        ("models/gemini-2.0-flash", False),
    ],
)
async def test_an_unknown_signature_gets_the_documented_stand_in(
    server: FakeServer, model_name: str, stand_in: bool
) -> None:
    history = AssistantMessage(
        tool_calls=(
            ToolCall(id="x1", name="get_weather", arguments="{}"),
            ToolCall(id="x2", name="get_weather", arguments="{}"),
        )
    )
    results = [ToolMessage(tool_call_id=i, name="get_weather", content="ok") for i in ("x1", "x2")]
    server.then(KIT.reply(answer("ok")))
    await model_for(server, model_name).request(
        a_request(UserMessage(content="hi"), history, *results)
    )
    first, second = server.body()["contents"][1]["parts"]
    if stand_in:  # the SDK writes bytes as URL-safe base64: Google's literal string
        assert first["thoughtSignature"] == "skip_thought_signature_validator"
        assert decoded(first["thoughtSignature"]) == SKIP_SIGNATURE
    else:
        assert "thoughtSignature" not in first
    assert "thoughtSignature" not in second


async def test_signatures_follow_positions_not_ids_and_survive_garbage(server: FakeServer) -> None:
    signed = base64.b64encode(b"\x01real").decode()
    renamed = AssistantMessage(  # the engine renamed the calls; the signature keeps its place
        tool_calls=(
            ToolCall(id="call_2_0", name="get_weather", arguments="{}"),
            ToolCall(id="call_2_1", name="get_weather", arguments="{}"),
        ),
        provider_data={"gemini": {"calls": [signed, None]}, "anthropic": {"x": 1}},
    )
    garbage = AssistantMessage(
        tool_calls=(ToolCall(id="g1", name="get_weather", arguments="{}"),),
        provider_data={"gemini": {"calls": ["%%% not base64"], "text": 7}},
    )
    other = AssistantMessage(
        tool_calls=(ToolCall(id="o1", name="get_weather", arguments="{}"),),
        provider_data={"openai-responses": {"reasoning": []}},
    )
    history: list[Any] = [UserMessage(content="hi")]
    for message in (renamed, garbage, other):
        history.append(message)
        history += [
            ToolMessage(tool_call_id=c.id, name=c.name, content="ok") for c in message.tool_calls
        ]
    server.then(KIT.reply(answer("ok")))
    await model_for(server, "gemini-3-pro-preview").request(a_request(*history))
    models = [c["parts"] for c in server.body()["contents"] if c["role"] == "model"]
    assert decoded(models[0][0]["thoughtSignature"]) == b"\x01real"
    assert "thoughtSignature" not in models[0][1]
    assert decoded(models[1][0]["thoughtSignature"]) == SKIP_SIGNATURE
    assert decoded(models[2][0]["thoughtSignature"]) == SKIP_SIGNATURE


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_text_signature_is_kept_and_sent_back(server: FakeServer, stream: bool) -> None:
    parts = [{"text": "Sunny."}, {"text": "", "thoughtSignature": "c2lnbmVk"}]
    server.then(raw(chunk(candidate(parts, "STOP"), None, SERVED_MODEL), stream=stream))
    server.then(KIT.reply(answer("ok")))
    model = model_for(server, "gemini-3-flash-preview", stream=stream)
    got = await model.request(a_request())
    assert got.message.provider_data == {"gemini": {"text": "c2lnbmVk"}}
    await model.request(
        a_request(UserMessage(content="hi"), got.message, UserMessage(content="and?"))
    )
    sent = server.body(1)["contents"][1]["parts"]
    assert sent == [{"text": "Sunny.", "thoughtSignature": "c2lnbmVk"}]


# --------------------------------------------------------------------------- streaming


async def test_a_stream_reports_its_pieces_in_order_and_ends_as_the_whole_reply(
    server: FakeServer,
) -> None:
    call = ToolCall(id="c9", name="get_weather", arguments='{"city": "Paris"}')
    sent = answer("Let me check that.", call)
    server.then(KIT.reply(sent, stream=True), KIT.reply(sent))
    deltas: list[ReplyDelta] = []
    streamed = await model_for(server, stream=True).request(a_request(on_delta=deltas.append))
    whole = await model_for(server).request(a_request())
    assert streamed == whole
    assert server.requests[0].url.path.endswith(":streamGenerateContent")
    assert server.requests[0].url.params["alt"] == "sse"
    assert [d.text for d in deltas[:3]] == ["Let me", " check", " that."]
    assert deltas[3] == ReplyDelta(
        tool_call_index=0, tool_call_id="c9", tool_name="get_weather", arguments='{"city": "Paris"}'
    )
    assert len(deltas) == 4


async def test_thought_parts_are_not_the_answer(server: FakeServer) -> None:
    parts = [{"text": "pondering", "thought": True}, {"text": "Answer."}]
    server.then(raw(chunk(candidate(parts, "STOP"), None, SERVED_MODEL), stream=True))
    deltas: list[ReplyDelta] = []
    got = await model_for(server, stream=True).request(a_request(on_delta=deltas.append))
    assert got.message.content == "Answer."
    assert [d.text for d in deltas] == ["Answer."]


async def test_a_stream_cut_before_its_finish_reason_is_transient(server: FakeServer) -> None:
    chunks = reply_chunks(answer("It is sunny in Paris today."), stream=True)[:-1]
    server.then(raw(*chunks, stream=True))
    failure = await failure_of(model_for(server, stream=True))
    assert failure.transient
    assert "cut off" in str(failure)


@pytest.mark.parametrize(("code", "transient"), [(503, True), (400, False)])
async def test_an_error_event_mid_stream(server: FakeServer, code: int, transient: bool) -> None:
    first = reply_chunks(answer("It is sunny in Paris today."), stream=True)[0]
    error = {"error": {"code": code, "message": f"broke, key {FAKE_KEY}", "status": "X"}}
    server.then(raw(first, error, stream=True))
    failure = await failure_of(model_for(server, stream=True))
    assert failure.transient is transient
    assert "while streaming" in str(failure)
    assert FAKE_KEY not in str(failure)


async def test_a_broken_listener_does_not_fail_the_stream(server: FakeServer) -> None:
    def explode(delta: ReplyDelta) -> None:
        raise RuntimeError("listener bug")

    server.then(KIT.reply(answer("Fine weather."), stream=True))
    with capture_logs() as logs:
        got = await model_for(server, stream=True).request(a_request(on_delta=explode))
    assert got.message.content == "Fine weather."
    assert [e["event"] for e in logs] == ["on_delta_failed"]


async def test_a_non_json_stream_event_is_transient(server: FakeServer) -> None:
    server.then(
        http.Response(
            200, content=b"data: {not json\r\n\r\n", headers={"content-type": "text/event-stream"}
        )
    )
    assert (await failure_of(model_for(server, stream=True))).transient


# --------------------------------------------------------------------------- usage


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        (
            {
                "promptTokenCount": 100,
                "cachedContentTokenCount": 60,
                "candidatesTokenCount": 20,
                "thoughtsTokenCount": 30,
                "toolUsePromptTokenCount": 5,
                "totalTokenCount": 155,
            },
            Usage(
                input_tokens=105,
                output_tokens=50,
                cached_tokens=60,
                reasoning_tokens=30,
                requests=1,
            ),
        ),
        ({"promptTokenCount": 7, "totalTokenCount": 7}, Usage(input_tokens=7, requests=1)),
        ({"candidatesTokenCount": 3}, Usage(output_tokens=3, requests=1)),
        ({"totalTokenCount": 9}, None),
        ({}, None),
        ({"promptTokenCount": -1}, None),
    ],
)
async def test_usage_counts_cached_and_thinking_tokens(
    server: FakeServer, meta: dict[str, Any], expected: Usage | None
) -> None:
    server.then(raw(chunk(candidate([{"text": "ok"}], "STOP"), meta, SERVED_MODEL)))
    assert (await model_for(server).request(a_request())).usage == expected


def test_usage_from_refuses_counts_that_cannot_be_true() -> None:
    assert usage_from({"prompt_token_count": 1.5}) is None
    assert usage_from({"prompt_token_count": True}) is None
    assert usage_from(None) is None


async def test_a_stream_s_last_usage_wins(server: FakeServer) -> None:
    chunks = reply_chunks(answer("Three little pieces."), stream=True)
    assert chunks[0]["usageMetadata"] == {"promptTokenCount": 82}
    server.then(raw(*chunks, stream=True))
    assert (await model_for(server, stream=True).request(a_request())).usage == USAGE


def test_the_assembler_reads_plain_mappings_too() -> None:
    assembler = ReplyAssembler(fallback_id_prefix="r_1")
    assembler.add_reply(
        {
            "candidates": [
                {
                    "content": {
                        "parts": [{"function_call": {"name": "f"}, "thought_signature": b"s"}]
                    },
                    "finish_reason": "STOP",
                }
            ]
        }
    )
    got = assembler.build()
    assert got.message.tool_calls == (ToolCall(id="r_1_0", name="f", arguments="{}"),)
    assert got.message.provider_data == {"gemini": {"calls": [base64.b64encode(b"s").decode()]}}


# --------------------------------------------------------------------------- failures


@pytest.mark.parametrize(
    ("status", "transient"),
    [
        (400, False),
        (401, False),
        (403, False),
        (404, False),
        (408, True),
        (409, True),
        (429, True),
        (500, True),
        (502, True),
        (503, True),
        (504, True),
        (529, True),
    ],
)
async def test_http_statuses_map_to_transient_or_permanent(
    server: FakeServer, status: int, transient: bool
) -> None:
    server.then(KIT.error(status, "nope"))
    failure = await failure_of(model_for(server))
    assert failure.transient is transient
    assert f"HTTP {status}" in str(failure)
    assert len(server.requests) == 1, "the SDK never retries"


@pytest.mark.parametrize(
    ("headers", "details", "expected"),
    [
        ({"retry-after": "3"}, None, 3.0),
        ({}, [{"@type": RETRY_INFO, "retryDelay": "7s"}], 7.0),
        (
            {},
            [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure"},
                {"@type": RETRY_INFO, "retryDelay": "0.5s"},
            ],
            0.5,
        ),
        ({"retry-after": "2"}, [{"@type": RETRY_INFO, "retryDelay": "7s"}], 2.0),
        ({}, [{"@type": RETRY_INFO, "retryDelay": "soon"}], None),
        ({}, None, None),
    ],
)
async def test_a_rate_limit_honours_retry_after_and_retry_info(
    server: FakeServer, headers: dict[str, str], details: Any, expected: float | None
) -> None:
    error: dict[str, Any] = {
        "code": 429,
        "message": "Resource exhausted.",
        "status": "RESOURCE_EXHAUSTED",
    }
    if details is not None:
        error["details"] = details
    server.then(http.Response(429, json={"error": error}, headers=headers))
    failure = await failure_of(model_for(server))
    assert failure.transient
    assert failure.retry_after_s == expected


async def test_a_permanent_error_carries_no_retry_after(server: FakeServer) -> None:
    server.then(KIT.error(400, "bad", retry_after=5))
    assert (await failure_of(model_for(server))).retry_after_s is None


async def test_timeouts_and_dropped_connections_are_transient(server: FakeServer) -> None:
    async def stall(request: Any) -> Any:
        raise http.ReadTimeout("stalled", request=request)

    async def hang_up(request: Any) -> Any:
        raise http.RemoteProtocolError("peer closed connection", request=request)

    server.then(stall, hang_up, http.Response(200, content=b"<html>proxy error</html>"))
    model = model_for(server, timeout=2.5)
    timed_out, dropped, garbage = [await failure_of(model) for _ in range(3)]
    assert timed_out.transient
    assert "timed out (2.5 s timeout" in str(timed_out)
    assert server.requests[0].headers["x-server-timeout"] == "3"
    assert dropped.transient
    assert "closed the connection" in str(dropped)
    assert garbage.transient
    assert "malformed reply" in str(garbage)


async def test_the_key_never_leaks(server: FakeServer) -> None:
    server.then(KIT.error(400, f"API key not valid: {FAKE_KEY}. Please pass a valid API key."))
    model = model_for(server)
    with capture_logs() as logs:
        failure = await failure_of(model)
    assert not failure.transient
    assert FAKE_KEY not in str(failure)
    assert "[redacted]" in str(failure)
    assert FAKE_KEY not in repr(logs)
    assert FAKE_KEY not in repr(model)
    own = GeminiModel(
        "gemini-2.5-flash", api_key=FAKE_KEY, base_url=f"https://proxy.test/v1?key={FAKE_KEY}"
    )
    assert FAKE_KEY not in repr(own)
    assert "proxy.test" in repr(own)


def test_a_missing_key_is_found_when_the_model_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "GOOGLE_GENAI_USE_VERTEXAI",
        "GOOGLE_GENAI_USE_ENTERPRISE",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="cannot build the Gemini client"):
        GeminiModel("gemini-2.5-flash")


# --------------------------------------------------------------------------- the client


async def test_a_given_client_is_used_without_retries_and_never_closed(server: FakeServer) -> None:
    retrying = types.HttpRetryOptions(attempts=5, initial_delay=0.0, max_delay=0.0)
    client = sdk_client(server, retry_options=retrying)
    server.then(KIT.error(503, "overloaded"), KIT.reply(answer("ok")))
    async with GeminiModel(SERVED_MODEL, client=client) as model:
        assert (await failure_of(model)).transient
        assert len(server.requests) == 1
    got = await client.aio.models.generate_content(model=SERVED_MODEL, contents="still open?")
    assert got.candidates is not None


async def test_the_adapter_builds_and_closes_its_own_client() -> None:
    local = LocalServer()
    async with local as base_url:
        local.reply(
            {"error": {"code": 503, "message": "busy", "status": "UNAVAILABLE"}}, status=503
        )
        local.reply(reply_chunks(answer("hello"), stream=False)[0])
        model = GeminiModel(SERVED_MODEL, api_key=FAKE_KEY, base_url=base_url.removesuffix("/v1"))
        assert (await failure_of(model)).transient
        assert (await model.request(a_request())).message.content == "hello"
        assert len(local.seen) == 2, "no retry of the 503"
        assert local.seen[0][0]["x-goog-api-key"] == FAKE_KEY
        await model.aclose()
        await model.aclose()  # twice is harmless
        local.reply(reply_chunks(answer("again"), stream=False)[0])
        assert (await model.request(a_request())).message.content == "again", "still usable"
        await model.aclose()


def test_each_event_loop_gets_its_own_client() -> None:
    model = GeminiModel(SERVED_MODEL, api_key=FAKE_KEY, base_url=refused_url())

    async def once() -> ModelCallError:
        failure = await failure_of(model)
        await model.aclose()
        return failure

    for _ in range(2):  # a second asyncio.run would break on a client bound to the first loop
        failure = asyncio.run(once())
        assert failure.transient
        assert "cannot connect" in str(failure)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temprature": 0.1}, "did you mean 'temperature'"),
        ({"max_retries": 3}, "retries are the engine's"),
        ({"tools": []}, "sets ['tools'] itself"),
        ({"temperature": "hot"}, "temperature"),
        ({"timeout": 0}, "timeout must be a positive"),
        ({"context_window": 0}, "context_window must be a positive int"),
        ({"client": object(), "api_key": "k"}, "either client= or"),
    ],
)
def test_bad_settings_are_config_errors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        GeminiModel(SERVED_MODEL, **kwargs)
    assert message in str(caught.value)
    with pytest.raises(ConfigError):
        GeminiModel(" ")


# --------------------------------------------------------------------------- schema issues


def test_tool_schema_issues_name_tool_keyword_and_provider() -> None:
    issues = GeminiModel(SERVED_MODEL, api_key=FAKE_KEY).tool_schema_issues([WEATHER])
    assert [(i.tool, i.keyword, i.provider, i.fatal) for i in issues] == [
        ("get_weather", "properties/when/format", "gemini", False)
    ]


def test_an_agent_warns_or_refuses_at_construction() -> None:
    @tool
    def plain(city: str, unit: str = "celsius", note: str | None = None) -> str:
        """No problem for Gemini."""
        return city

    model = GeminiModel(SERVED_MODEL, api_key=FAKE_KEY)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Agent(model=model, tools=[plain])  # additionalProperties: false, defaults, Optional
    dated = ToolSpec(name="dated", description="d", parameters=WEATHER.parameters)
    with pytest.warns(
        ToolSchemaWarning, match=r"'dated': gemini cannot express properties/when/format"
    ):
        Agent(model=model, tools=[_tool_from(dated)])
    tree = ToolSpec(
        name="tree",
        description="t",
        parameters={
            "type": "object",
            "properties": {"n": {"$ref": "#/$defs/N"}},
            "$defs": {
                "N": {
                    "type": "object",
                    "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/N"}}},
                }
            },
        },
    )
    with pytest.raises(
        ConfigError, match=r"'tree': gemini cannot express \$defs/N/properties/kids/items/\$ref"
    ):
        Agent(model=model, tools=[_tool_from(tree)])
    with pytest.raises(ConfigError, match="function names"):
        Agent(
            model=model,
            tools=[
                _tool_from(ToolSpec(name="9lives", description="d", parameters={"type": "object"}))
            ],
        )


def _tool_from(spec: ToolSpec) -> Any:
    """A tool whose schema is exactly ``spec.parameters``."""
    from agent_fsm.tools.tool import Tool

    async def run(**arguments: Any) -> str:
        return "ok"

    return Tool(name=spec.name, description=spec.description, parameters=spec.parameters, fn=run)


# --------------------------------------------------------------------------- live


@pytest.mark.skipif(
    not os.environ.get("AGENT_FSM_LIVE_GEMINI_API_KEY"),
    reason="set AGENT_FSM_LIVE_GEMINI_API_KEY to run",
)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_live_tool_turn(stream: bool) -> None:
    @tool
    def get_weather(city: str) -> str:
        """Current weather for a city."""
        return f"sunny, 21 C in {city}"

    model = GeminiModel(
        os.environ.get("AGENT_FSM_LIVE_GEMINI_MODEL", "gemini-2.5-flash"),
        api_key=os.environ["AGENT_FSM_LIVE_GEMINI_API_KEY"],
        base_url=os.environ.get("AGENT_FSM_LIVE_GEMINI_BASE_URL"),
        stream=stream,
    )
    async with model:
        result = await Agent(model=model, tools=[get_weather]).run(
            "What's the weather in Paris? Use the tool."
        )
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert result.usage.input_tokens > 0
    assert any(m.role == "tool" for m in result.messages)


# --------------------------------------------------------------------------- the sanitiser


def _in_x(schema: Any, **root: Any) -> dict[str, Any]:
    """A root object whose one property ``x`` has ``schema``."""
    return {"type": "object", "properties": {"x": schema}, **root}


_INT = {"type": "INTEGER"}
_STR = {"type": "STRING"}

# (id, tool schema, the converted ``x`` property (or, with "root", the whole parameters), the
# problems as (keyword path, fatal))
SANITISER_TABLE: list[tuple[str, dict[str, Any], Any, list[tuple[str, bool]]]] = [
    (
        "annotations-dropped-silently",
        _in_x(
            {
                "type": "string",
                "title": "X",
                "examples": ["a"],
                "$comment": "c",
                "deprecated": True,
            },
            **{
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$id": "urn:t",
                "title": "T",
            },
        ),
        _STR,
        [],
    ),
    ("closed-object-silently", _in_x({"type": "integer"}, additionalProperties=False), _INT, []),
    ("open-object-silently", _in_x({"type": "integer"}, additionalProperties=True), _INT, []),
    (
        "typed-extra-properties",
        _in_x({"type": "integer"}, additionalProperties={"type": "string"}),
        _INT,
        [("additionalProperties", False)],
    ),
    (
        "ref-inlined-siblings-win",
        _in_x(
            {"$ref": "#/$defs/D", "description": "here"},
            **{"$defs": {"D": {"type": "string", "description": "there"}}},
        ),
        {"type": "STRING", "description": "here"},
        [],
    ),
    (
        "definitions-ref",
        _in_x({"$ref": "#/definitions/D"}, definitions={"D": {"type": "integer"}}),
        _INT,
        [],
    ),
    (
        "external-ref-fatal",
        _in_x({"$ref": "https://example.com/s.json"}),
        None,
        [("properties/x/$ref", True)],
    ),
    ("dangling-ref-fatal", _in_x({"$ref": "#/$defs/Missing"}), None, [("properties/x/$ref", True)]),
    (
        "self-ref-fatal",
        {"type": "object", "properties": {"me": {"$ref": "#"}}},
        None,
        [("properties/me/$ref", True)],
    ),
    ("const-string", _in_x({"const": "on"}), {"type": "STRING", "enum": ["on"]}, []),
    ("const-number", _in_x({"type": "integer", "const": 3}), _INT, [("properties/x/const", False)]),
    (
        "const-null",
        _in_x({"type": ["string", "null"], "const": None}),
        {"type": "STRING", "nullable": True},
        [],
    ),
    (
        "type-list-with-null",
        _in_x({"type": ["integer", "null"]}),
        {"type": "INTEGER", "nullable": True},
        [],
    ),
    (
        "type-list-several",
        _in_x({"type": ["string", "integer"]}),
        {"anyOf": [_STR, _INT]},
        [("properties/x/type", False)],
    ),
    (
        "one-of",
        _in_x({"oneOf": [{"type": "string"}, {"type": "integer"}]}),
        {"anyOf": [_STR, _INT]},
        [("properties/x/oneOf", False)],
    ),
    (
        "optional",
        _in_x({"anyOf": [{"type": "string", "minLength": 2}, {"type": "null"}], "default": None}),
        {"type": "STRING", "minLength": 2, "nullable": True},
        [],
    ),
    (
        "optional-union",
        _in_x({"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}),
        {"anyOf": [_STR, _INT], "nullable": True},
        [],
    ),
    (
        "all-of-one",
        _in_x(
            {"allOf": [{"$ref": "#/$defs/D"}], "description": "d"},
            **{"$defs": {"D": {"type": "integer", "minimum": 1}}},
        ),
        {"type": "INTEGER", "description": "d", "minimum": 1},
        [],
    ),
    (
        "all-of-several-fatal",
        _in_x({"allOf": [{"type": "integer"}, {"minimum": 1}]}),
        None,
        [("properties/x/allOf", True)],
    ),
    (
        "enum-with-null",
        _in_x({"enum": ["a", None]}),
        {"type": "STRING", "enum": ["a"], "nullable": True},
        [],
    ),
    (
        "enum-of-numbers",
        _in_x({"type": "integer", "enum": [1, 2]}),
        _INT,
        [("properties/x/enum", False)],
    ),
    (
        "format-email",
        _in_x({"type": "string", "format": "email"}),
        _STR,
        [("properties/x/format", False)],
    ),
    (
        "format-date-time",
        _in_x({"type": "string", "format": "date-time"}),
        {"type": "STRING", "format": "date-time"},
        [],
    ),
    (
        "format-int64",
        _in_x({"type": "integer", "format": "int64"}),
        {"type": "INTEGER", "format": "int64"},
        [],
    ),
    (
        "format-wrong-type",
        _in_x({"type": "string", "format": "float"}),
        _STR,
        [("properties/x/format", False)],
    ),
    (
        "default-kept",
        _in_x({"type": "integer", "default": 3}),
        {"type": "INTEGER", "default": 3},
        [],
    ),
    (
        "loosened-keywords",
        _in_x(
            {
                "type": "string",
                "not": {"const": "x"},
                "if": {"minLength": 1},
                "then": {},
                "else": {},
            }
        ),
        _STR,
        [
            ("properties/x/not", False),
            ("properties/x/if", False),
            ("properties/x/then", False),
            ("properties/x/else", False),
        ],
    ),
    (
        "number-keywords",
        _in_x({"type": "number", "multipleOf": 0.5, "exclusiveMaximum": 1.5, "minimum": 0}),
        {"type": "NUMBER", "minimum": 0},
        [("properties/x/multipleOf", False), ("properties/x/exclusiveMaximum", False)],
    ),
    (
        "exclusive-integer-bounds",
        _in_x({"type": "integer", "minimum": 5, "exclusiveMinimum": 0, "exclusiveMaximum": 10}),
        {"type": "INTEGER", "minimum": 5, "maximum": 9},
        [],
    ),
    (
        "array-keywords",
        _in_x(
            {
                "type": "array",
                "items": {"type": "string"},
                "uniqueItems": True,
                "minItems": 1,
                "contains": {"const": "a"},
            }
        ),
        {"type": "ARRAY", "items": _STR, "minItems": 1},
        [("properties/x/uniqueItems", False), ("properties/x/contains", False)],
    ),
    (
        "prefix-items",
        _in_x({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]}),
        {"type": "ARRAY", "items": {"anyOf": [_STR, _INT]}},
        [("properties/x/prefixItems", False)],
    ),
    (
        "draft7-tuple",
        _in_x({"type": "array", "items": [{"type": "integer"}]}),
        {"type": "ARRAY", "items": _INT},
        [("properties/x/prefixItems", False)],
    ),
    (
        "array-without-items",
        _in_x({"type": "array"}),
        {"type": "ARRAY", "items": _STR},
        [("properties/x/items", False)],
    ),
    (
        "undeclared-required",
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "ghost"]},
        "root",
        [("required", False)],
    ),
    (
        "object-keywords",
        _in_x(
            {
                "type": "object",
                "properties": {"k": {"type": "string"}},
                "patternProperties": {"^s": {}},
                "propertyNames": {"maxLength": 3},
                "dependentRequired": {"k": ["j"]},
            }
        ),
        {"type": "OBJECT", "properties": {"k": _STR}},
        [
            ("properties/x/patternProperties", False),
            ("properties/x/propertyNames", False),
            ("properties/x/dependentRequired", False),
        ],
    ),
    (
        "properties-on-a-string",
        _in_x({"type": "string", "properties": {"a": {}}, "required": ["a"], "items": {}}),
        _STR,
        [],
    ),
    (
        "implied-types",
        _in_x({"properties": {"n": {"maxLength": 3}}}),
        {"type": "OBJECT", "properties": {"n": {"type": "STRING", "maxLength": 3}}},
        [],
    ),
    ("nested-free-object", _in_x({"type": "object"}), {"type": "OBJECT"}, []),
    (
        "nested-typed-map",
        _in_x({"type": "object", "additionalProperties": {"type": "integer"}}),
        {"type": "OBJECT"},
        [("properties/x/additionalProperties", False)],
    ),
    (
        "escaped-path",
        {"type": "object", "properties": {"a/b": {"type": "string", "format": "uri"}}},
        "root",
        [("properties/a~1b/format", False)],
    ),
    ("true-schema", _in_x(True), {}, []),
    ("false-schema-fatal", _in_x(False), None, [("properties/x", True)]),
    (
        "openapi-nullable",
        _in_x({"type": "string", "nullable": True}),
        {"type": "STRING", "nullable": True},
        [],
    ),
    ("unknown-type-fatal", _in_x({"type": "file"}), None, [("properties/x/type", True)]),
    (
        "string-keywords",
        _in_x({"type": "string", "minLength": 1, "maxLength": 9, "pattern": "^a"}),
        {"type": "STRING", "minLength": 1, "maxLength": 9, "pattern": "^a"},
        [],
    ),
    (
        "shared-def-reported-once",
        {
            "type": "object",
            "properties": {"a": {"$ref": "#/$defs/E"}, "b": {"$ref": "#/$defs/E"}},
            "$defs": {"E": {"type": "string", "format": "email"}},
        },
        "root",
        [("$defs/E/format", False)],
    ),
    ("root-not-an-object", {"type": "array", "items": {"type": "string"}}, None, [("type", True)]),
    (
        "root-union",
        {
            "anyOf": [
                {"type": "object", "properties": {"a": {"type": "string"}}},
                {"type": "object", "properties": {"b": {"type": "string"}}},
            ]
        },
        None,
        [("type", True)],
    ),
    ("root-free-form", {"type": "object"}, "no parameters", [("properties", False)]),
    ("root-empty-schema", {}, "no parameters", [("properties", False)]),
    (
        "root-no-arguments",
        {"type": "object", "properties": {}, "additionalProperties": False},
        "no parameters",
        [],
    ),
]


@pytest.mark.parametrize(
    ("schema", "expected", "problems"),
    [pytest.param(s, e, p, id=i) for i, s, e, p in SANITISER_TABLE],
)
def test_the_sanitiser_table(
    schema: dict[str, Any], expected: Any, problems: list[tuple[str, bool]]
) -> None:
    from agent_fsm.models.gemini_schema import gemini_schema

    before = copy.deepcopy(schema)
    result = gemini_schema(schema)
    assert schema == before, "the tool's own schema is never modified"
    assert [(p.keyword, p.fatal) for p in result.problems] == problems
    assert result.fatal is any(fatal for _, fatal in problems)
    if expected is None:
        assert result.parameters is None
        return
    if expected == "no parameters":
        assert result.parameters is None
        return
    assert result.parameters is not None
    types.Schema.model_validate(result.parameters)  # the SDK takes every converted schema
    if expected != "root":
        assert result.parameters["properties"]["x"] == expected
    # the copy shares nothing with the original: changing it changes nothing there
    json.loads(json.dumps(result.parameters))
    _scramble(result.parameters)
    assert schema == before


def _scramble(node: Any) -> None:
    if isinstance(node, dict):
        for value in node.values():
            _scramble(value)
        node["scrambled"] = True
    elif isinstance(node, list):
        for value in node:
            _scramble(value)
        node.append("scrambled")


def test_the_sanitiser_shares_no_default_with_the_original() -> None:
    from agent_fsm.models.gemini_schema import gemini_schema

    schema = _in_x({"type": "array", "items": {"type": "string"}, "default": ["a"]})
    result = gemini_schema(schema)
    assert result.parameters is not None
    result.parameters["properties"]["x"]["default"].append("b")
    assert schema["properties"]["x"]["default"] == ["a"]


def test_every_problem_names_its_detail() -> None:
    from agent_fsm.models.gemini_schema import gemini_schema

    for _, schema, _, _ in SANITISER_TABLE:
        assert all(p.detail for p in gemini_schema(schema).problems)
