"""The same scenarios over every provider adapter, each through its own SDK and a fake server.

The kit (``tests/provider_kits``) writes each reply in the provider's wire format; the adapter
reads it back through its SDK. So every scenario checks both directions of one adapter: a
provider-neutral reply survives the provider's format (text, calls, finish reason, usage), and
what the adapter sends (tool results, system prompt) is what the transcript holds.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from structlog.testing import capture_logs

from agent_fsm import Agent, Limits, tool
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelRequest,
    ModelResponse,
    ReplyDelta,
    SystemMessage,
    ToolCall,
    ToolSpec,
    Usage,
    UserMessage,
)
from agent_fsm.models.base import Model, ModelCallError
from agent_fsm.table import StopReason
from tests.provider_kits import WireKit, all_kits
from tests.provider_kits.base import FAKE_KEY, FakeServer

KITS = all_kits()
USAGE = Usage(input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1)
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


@pytest.fixture(params=KITS, ids=[kit.name for kit in KITS])
def kit(request: pytest.FixtureRequest) -> WireKit:
    chosen: WireKit = request.param
    return chosen


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


def model_for(kit: WireKit, server: FakeServer, *, stream: bool = False) -> Model:
    return kit.build(server.client(), stream=stream)


def a_request(*, on_delta: Any = None) -> ModelRequest:
    messages = (SystemMessage(content="Be brief."), UserMessage(content="Weather in Paris?"))
    return ModelRequest(
        messages=messages, tools=(WEATHER,), run_id="run", turn=1, on_delta=on_delta
    )


def answer(
    content: str = "",
    *calls: ToolCall,
    finish: FinishReason | None = None,
    usage: Usage | None = USAGE,
) -> ModelResponse:
    reason = finish or (FinishReason.TOOL_CALLS if calls else FinishReason.STOP)
    message = AssistantMessage(content=content, tool_calls=calls)
    return ModelResponse(message=message, finish_reason=reason, usage=usage)


async def failure_of(model: Model, request: ModelRequest) -> ModelCallError:
    with pytest.raises(ModelCallError) as caught:
        await model.request(request)
    return caught.value


# --------------------------------------------------------------------------- replies


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_text_reply_keeps_its_text_finish_and_usage(
    kit: WireKit, server: FakeServer, stream: bool
) -> None:
    sent = answer("It is sunny in Paris, 21 degrees.")
    server.then(kit.reply(sent, stream=stream))
    deltas: list[ReplyDelta] = []
    got = await model_for(kit, server, stream=stream).request(a_request(on_delta=deltas.append))
    assert got.message.content == sent.message.content
    assert got.message.tool_calls == ()
    assert got.finish_reason is FinishReason.STOP
    assert got.usage is not None
    assert (got.usage.input_tokens, got.usage.output_tokens) == (82, 17)
    assert (got.usage.cached_tokens, got.usage.reasoning_tokens) == (64, 5)
    if stream:
        assert len(deltas) > 1, "a streamed reply arrives in pieces"
        assert "".join(d.text for d in deltas) == sent.message.content


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_parallel_tool_calls_keep_their_order_ids_and_arguments(
    kit: WireKit, server: FakeServer, stream: bool
) -> None:
    calls = (
        ToolCall(id="call_a1", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="call_b2", name="get_weather", arguments='{"city": "Oslo"}'),
    )
    server.then(kit.reply(answer("Checking both.", *calls), stream=stream))
    got = await model_for(kit, server, stream=stream).request(a_request())
    assert [(c.name, json.loads(c.arguments)) for c in got.message.tool_calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Oslo"}),
    ]
    ids = [c.id for c in got.message.tool_calls]
    assert len(set(ids)) == 2
    assert all(ids)
    assert got.finish_reason is FinishReason.TOOL_CALLS


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_truncated_reply_is_length(kit: WireKit, server: FakeServer, stream: bool) -> None:
    server.then(kit.reply(answer("The weather in Par", finish=FinishReason.LENGTH), stream=stream))
    got = await model_for(kit, server, stream=stream).request(a_request())
    assert got.finish_reason is FinishReason.LENGTH
    assert got.message.content == "The weather in Par"


@pytest.mark.parametrize("reason", [FinishReason.REFUSAL, FinishReason.CONTENT_FILTER])
async def test_a_refusal_or_safety_stop_keeps_its_reason(
    kit: WireKit, server: FakeServer, reason: FinishReason
) -> None:
    expressible = getattr(kit, "finish_reasons", frozenset(FinishReason))
    if reason not in expressible:
        pytest.skip(f"{kit.name} has no {reason} stop")
    server.then(kit.reply(answer("I can't help with that.", finish=reason)))
    got = await model_for(kit, server).request(a_request())
    assert got.finish_reason is reason
    assert got.message.tool_calls == ()


async def test_no_usage_reported_is_none(kit: WireKit, server: FakeServer) -> None:
    if not getattr(kit, "can_omit_usage", True):
        pytest.skip(f"{kit.name} always reports usage")
    server.then(kit.reply(answer("ok", usage=None)))
    assert (await model_for(kit, server).request(a_request())).usage is None


# --------------------------------------------------------------------------- failures


async def test_a_rate_limit_is_transient_with_its_retry_after_then_succeeds(
    kit: WireKit, server: FakeServer
) -> None:
    server.then(kit.error(429, "slow down", retry_after=7), kit.reply(answer("done")))
    model = model_for(kit, server)
    failure = await failure_of(model, a_request())
    assert failure.transient
    assert failure.retry_after_s == 7
    assert (await model.request(a_request())).message.content == "done"
    assert len(server.requests) == 2, "the SDK's own retries are off: the engine retries"


async def test_an_overloaded_server_is_transient(kit: WireKit, server: FakeServer) -> None:
    server.then(kit.error(503, "overloaded"))
    assert (await failure_of(model_for(kit, server), a_request())).transient


async def test_a_bad_key_is_permanent_and_never_shown(kit: WireKit, server: FakeServer) -> None:
    server.then(kit.error(401, f"Incorrect API key provided: {FAKE_KEY}."))
    with capture_logs() as logs:
        failure = await failure_of(model_for(kit, server), a_request())
    assert not failure.transient
    assert failure.__cause__ is None
    assert failure.__context__ is None
    assert FAKE_KEY not in str(failure)
    assert FAKE_KEY not in repr(logs)


# --------------------------------------------------------------------------- runs


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_tool_turn_sends_the_result_back_and_finishes(
    kit: WireKit, server: FakeServer, stream: bool
) -> None:
    call = ToolCall(id="call_w1", name="get_weather", arguments='{"city": "Paris"}')
    server.then(
        kit.reply(answer("", call), stream=stream), kit.reply(answer("Sunny."), stream=stream)
    )
    agent = Agent(
        model=model_for(kit, server, stream=stream),
        tools=[get_weather],
        system_prompt="Be brief.",
    )
    result = await agent.run("Weather in Paris?")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Sunny.")
    second = server.body(1)
    [(call_id, text)] = kit.tool_results(second)
    assert call_id in ("call_w1", "get_weather")
    assert "sunny in Paris" in text
    assert kit.system_prompt(second) == "Be brief."
    assert result.usage.input_tokens == 2 * 82


async def test_a_malformed_call_is_answered_with_an_error_the_model_corrects(
    kit: WireKit, server: FakeServer
) -> None:
    wrong = ToolCall(id="call_x", name="get_weather", arguments='{"city": 42}')
    right = ToolCall(id="call_y", name="get_weather", arguments='{"city": "Paris"}')
    server.then(
        kit.reply(answer("", wrong)), kit.reply(answer("", right)), kit.reply(answer("Sunny."))
    )
    agent = Agent(model=model_for(kit, server), tools=[get_weather])
    result = await agent.run("Weather in Paris?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    first_results = kit.tool_results(server.body(1))
    assert len(first_results) == 1
    assert "city" in first_results[0][1]
    assert result.usage.requests == 3


async def test_unparseable_arguments_are_answered_with_an_error(
    kit: WireKit, server: FakeServer
) -> None:
    if not getattr(kit, "carries_raw_arguments", True):
        pytest.skip(f"{kit.name} sends arguments as an object: they are always JSON")
    broken = ToolCall(id="call_z", name="get_weather", arguments='{"city": "Par')
    server.then(
        kit.reply(answer("", broken), stream=True), kit.reply(answer("Sorry."), stream=True)
    )
    agent = Agent(model=model_for(kit, server, stream=True), tools=[get_weather])
    result = await agent.run("Weather in Paris?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    [(_, text)] = kit.tool_results(server.body(1))
    assert "JSON" in text


async def test_a_run_retries_a_rate_limit_and_stops_on_a_bad_key(
    kit: WireKit, server: FakeServer
) -> None:
    server.then(kit.error(429, "slow down", retry_after=0), kit.reply(answer("done")))
    limits = Limits(retry_backoff_s=0.0, retry_backoff_max_s=0.0)
    result = await Agent(model=model_for(kit, server), limits=limits).run("hi")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "done")
    server.then(kit.error(401, f"bad key {FAKE_KEY}"))
    result = await Agent(model=model_for(kit, server), limits=limits).run("hi")
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.error is not None
    assert FAKE_KEY not in result.error
