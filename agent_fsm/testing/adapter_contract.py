"""The model-adapter contract: what agent_fsm's engine relies on from a ``Model``, as a pytest
class an adapter's own tests subclass.

    from agent_fsm.testing.adapter_contract import ModelAdapterContract

    class TestMyAdapter(ModelAdapterContract):
        kit = MyKit()          # a WireKit for my provider's wire format

Each test starts a ``WireServer`` on 127.0.0.1, queues what the provider would send (the
kit writes it) and asks the adapter built by ``kit.build(url, ...)``: replies with text and
tool calls, whole and streamed; every finish reason the wire can express; usage; HTTP errors
classified transient or permanent, with the server's delay honoured; a stream dropped or cut
short being a transient failure; streamed fragments reported as they come; a cancelled
request ending promptly, and the adapter still answering afterwards and from another event
loop; and the key never shown. The last tests run the adapter inside an ``Agent``. All four
adapters agent_fsm ships pass it (``tests/test_provider_scenarios.py``).

The tests are plain functions that run their own event loop, so the class needs no asyncio
plugin; a test whose wait would hang (a request that does not end when cancelled) fails
after ``patience_s`` instead. Only users' tests import this module: it imports pytest.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import ClassVar

import pytest
from structlog.testing import capture_logs

from agent_fsm.agent import Agent
from agent_fsm.limits import Limits
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
from agent_fsm.testing.wire import WireKit, WireServer
from agent_fsm.tools.tool import tool

__all__ = ["CONTRACT_KEY", "ModelAdapterContract"]

CONTRACT_KEY = "sk-contract-SECRET-0123456789abcdef"
"""The API key every contract test builds its adapter with: no error or log may show it."""

USAGE = Usage(input_tokens=82, output_tokens=17, cached_tokens=64, reasoning_tokens=5, requests=1)
WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
Scenario = Callable[[WireServer, str], Awaitable[None]]
both_ways = pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def answer(
    content: str = "",
    *calls: ToolCall,
    finish: FinishReason | None = None,
    usage: Usage | None = USAGE,
) -> ModelResponse:
    """A reply for the kit to encode: text, calls, a finish reason (by default what the calls
    make it) and usage."""
    reason = finish or (FinishReason.TOOL_CALLS if calls else FinishReason.STOP)
    message = AssistantMessage(content=content, tool_calls=calls)
    return ModelResponse(message=message, finish_reason=reason, usage=usage)


def a_request(*, on_delta: Callable[[ReplyDelta], None] | None = None) -> ModelRequest:
    """A request with a system prompt, a question and one tool."""
    messages = (SystemMessage(content="Be brief."), UserMessage(content="Weather in Paris?"))
    return ModelRequest(
        messages=messages, tools=(WEATHER,), run_id="run", turn=1, on_delta=on_delta
    )


class ModelAdapterContract:
    """Subclass with ``kit`` set to your provider's ``WireKit``; pytest collects the tests.

    Override ``patience_s`` for a slow machine; skip a test that does not apply by
    overriding it with one that calls ``pytest.skip``.
    """

    kit: ClassVar[WireKit]
    """The wire format of the adapter under test, and how to build the adapter."""
    patience_s: ClassVar[float] = 30.0
    """How long a wait may last before the test fails as hung (never a timing claim)."""

    # -- helpers

    def model(self, url: str, *, stream: bool = False) -> Model:
        """The adapter under test, talking to the server at ``url``; closed (``aclose``,
        when it has one) when the scenario ends."""
        model = self.kit.build(url, api_key=CONTRACT_KEY, stream=stream)
        self._built.append(model)
        return model

    def play(self, scenario: Scenario) -> None:
        """Run ``scenario(server, url)`` in a fresh event loop with a fresh server."""
        self._built: list[Model] = []

        async def main() -> None:
            server = WireServer()
            async with server as url:
                try:
                    await asyncio.wait_for(scenario(server, url), self.patience_s)
                finally:
                    for model in self._built:
                        close = getattr(model, "aclose", None)
                        if close is not None:
                            await close()

        asyncio.run(main())

    async def failure_of(self, model: Model, request: ModelRequest) -> ModelCallError:
        """The ModelCallError ``model`` raises for ``request``; fails the test otherwise."""
        with pytest.raises(ModelCallError) as caught:
            await model.request(request)
        return caught.value

    def expressible(self, reason: FinishReason) -> None:
        if reason not in self.kit.finish_reasons:
            pytest.skip(f"{self.kit.name} has no {reason} stop")

    # -- replies

    @both_ways
    def test_a_text_reply_keeps_its_text_finish_usage_and_streams_fragments(
        self, stream: bool
    ) -> None:
        sent = answer("It is sunny in Paris, 21 degrees.")
        deltas: list[ReplyDelta] = []

        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.reply(sent, stream=stream))
            got = await self.model(url, stream=stream).request(a_request(on_delta=deltas.append))
            assert (got.message.content, got.message.tool_calls) == (sent.message.content, ())
            assert got.finish_reason is FinishReason.STOP
            assert got.usage is not None, "usage the server reported is reported"
            assert (got.usage.input_tokens, got.usage.output_tokens) == (82, 17)
            assert (got.usage.cached_tokens, got.usage.reasoning_tokens) == (64, 5)

        self.play(scenario)
        if stream:
            assert len(deltas) > 1, "a streamed reply is reported in pieces as it arrives"
            assert "".join(d.text for d in deltas) == sent.message.content
        else:
            assert deltas == [], "a whole reply reports no fragments"

    @both_ways
    def test_parallel_tool_calls_keep_their_order_ids_and_arguments(self, stream: bool) -> None:
        calls = (
            ToolCall(id="call_a1", name="get_weather", arguments='{"city": "Paris"}'),
            ToolCall(id="call_b2", name="get_weather", arguments='{"city": "Oslo"}'),
        )

        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.reply(answer("Checking both.", *calls), stream=stream))
            got = await self.model(url, stream=stream).request(a_request())
            assert [(c.name, json.loads(c.arguments)) for c in got.message.tool_calls] == [
                ("get_weather", {"city": "Paris"}),
                ("get_weather", {"city": "Oslo"}),
            ]
            ids = [c.id for c in got.message.tool_calls]
            assert all(ids), "every call has an id"
            assert len(set(ids)) == 2, "every call has its own id"
            assert got.finish_reason is FinishReason.TOOL_CALLS

        self.play(scenario)

    @both_ways
    def test_a_truncated_reply_is_length(self, stream: bool) -> None:
        async def scenario(server: WireServer, url: str) -> None:
            cut = answer("The weather in Par", finish=FinishReason.LENGTH)
            server.then(self.kit.reply(cut, stream=stream))
            got = await self.model(url, stream=stream).request(a_request())
            assert got.finish_reason is FinishReason.LENGTH
            assert got.message.content == "The weather in Par"

        self.play(scenario)

    @pytest.mark.parametrize("reason", [FinishReason.REFUSAL, FinishReason.CONTENT_FILTER])
    def test_a_refusal_or_a_safety_stop_keeps_its_reason(self, reason: FinishReason) -> None:
        self.expressible(reason)

        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.reply(answer("I can't help with that.", finish=reason)))
            got = await self.model(url).request(a_request())
            assert (got.finish_reason, got.message.tool_calls) == (reason, ())

        self.play(scenario)

    def test_no_usage_reported_is_none(self) -> None:
        if not self.kit.can_omit_usage:
            pytest.skip(f"{self.kit.name} always reports usage")

        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.reply(answer("ok", usage=None)))
            got = await self.model(url).request(a_request())
            assert got.usage is None, "no usage is None, for the engine to estimate"

        self.play(scenario)

    # -- failures

    def test_a_rate_limit_is_transient_with_its_delay_and_the_sdk_does_not_retry(self) -> None:
        async def scenario(server: WireServer, url: str) -> None:
            server.then(
                self.kit.error(429, "slow down", retry_after=7), self.kit.reply(answer("ok"))
            )
            model = self.model(url)
            failure = await self.failure_of(model, a_request())
            assert (failure.transient, failure.retry_after_s) == (True, 7)
            assert (await model.request(a_request())).message.content == "ok"
            assert len(server.requests) == 2, "the SDK's own retries are off: the engine retries"

        self.play(scenario)

    @pytest.mark.parametrize("status", [500, 503])
    def test_a_server_error_is_transient(self, status: int) -> None:
        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.error(status, "overloaded"))
            assert (await self.failure_of(self.model(url), a_request())).transient

        self.play(scenario)

    @pytest.mark.parametrize("status", [400, 401, 403, 404])
    def test_a_client_error_is_permanent_unchained_and_never_shows_the_key(
        self, status: int
    ) -> None:
        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.error(status, f"Incorrect API key provided: {CONTRACT_KEY}."))
            with capture_logs() as logs:
                failure = await self.failure_of(self.model(url), a_request())
            assert not failure.transient
            assert (failure.__cause__, failure.__context__) == (None, None)
            assert CONTRACT_KEY not in str(failure) + repr(logs)

        self.play(scenario)

    @pytest.mark.parametrize("drop", [True, False], ids=["dropped", "ended-early"])
    def test_a_stream_cut_short_is_transient(self, drop: bool) -> None:
        async def scenario(server: WireServer, url: str) -> None:
            server.cut(self.kit.reply(answer("A long answer, " * 8), stream=True), drop=drop)
            failure = await self.failure_of(self.model(url, stream=True), a_request())
            assert failure.transient, "its partial text must not become an answer"

        self.play(scenario)

    def test_an_unreachable_server_is_transient(self) -> None:
        async def scenario(server: WireServer, url: str) -> None:
            server.then()  # nothing listens once the server is closed
            await server.__aexit__(None, None, None)
            assert (await self.failure_of(self.model(url), a_request())).transient

        self.play(scenario)

    # -- cancellation and the client's life

    @both_ways
    def test_a_cancelled_request_ends_and_the_adapter_answers_the_next(self, stream: bool) -> None:
        async def scenario(server: WireServer, url: str) -> None:
            if stream:
                server.stall_after(self.kit.reply(answer("Half of it, then silence."), stream=True))
            else:
                server.stall()
            model = self.model(url, stream=stream)
            pending = asyncio.ensure_future(model.request(a_request()))
            await server.received(1)
            pending.cancel()
            with pytest.raises(asyncio.CancelledError):
                await pending
            server.then(self.kit.reply(answer("Back."), stream=stream))
            assert (await model.request(a_request())).message.content == "Back."

        self.play(scenario)

    def test_the_adapter_answers_after_aclose_and_from_another_event_loop(self) -> None:
        """As ``Agent.run_sync`` uses a model: each run in an event loop of its own, with
        ``aclose`` (when the model has one) before that loop ends."""

        async def scenario(server: WireServer, url: str) -> None:
            server.then(*(self.kit.reply(answer(f"reply {n}")) for n in range(3)))
            model = self.model(url)

            async def one_run() -> str:
                try:
                    return (await model.request(a_request())).message.content
                finally:
                    close = getattr(model, "aclose", None)
                    if close is not None:
                        await close()

            assert await one_run() == "reply 0"
            assert await one_run() == "reply 1", "still usable after aclose"
            assert await asyncio.to_thread(asyncio.run, one_run()) == "reply 2"

        self.play(scenario)

    # -- runs

    @both_ways
    def test_a_tool_turn_sends_the_result_and_the_system_prompt_back(self, stream: bool) -> None:
        call = ToolCall(id="call_w1", name="get_weather", arguments='{"city": "Paris"}')

        async def scenario(server: WireServer, url: str) -> None:
            kit = self.kit
            server.then(kit.reply(answer("", call), stream=stream))
            server.then(kit.reply(answer("Sunny."), stream=stream))
            model = self.model(url, stream=stream)
            agent = Agent(model=model, tools=[get_weather], system_prompt="Be brief.")
            result = await agent.run("Weather in Paris?")
            assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Sunny.")
            [(call_id, text)] = kit.tool_results(server.body(1))
            assert call_id in ("call_w1", "get_weather")
            assert "sunny in Paris" in text
            assert kit.system_prompt(server.body(1)) == "Be brief."
            assert result.usage.input_tokens == 2 * 82

        self.play(scenario)

    def test_a_malformed_call_is_answered_with_an_error_the_model_corrects(self) -> None:
        wrong = ToolCall(id="call_x", name="get_weather", arguments='{"city": 42}')
        right = ToolCall(id="call_y", name="get_weather", arguments='{"city": "Paris"}')

        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.reply(answer("", wrong)), self.kit.reply(answer("", right)))
            server.then(self.kit.reply(answer("Sunny.")))
            result = await Agent(model=self.model(url), tools=[get_weather]).run("Paris?")
            assert result.stop_reason is StopReason.FINAL_ANSWER
            [(_, text)] = self.kit.tool_results(server.body(1))
            assert "city" in text, "the error result says what to fix"
            assert result.usage.requests == 3

        self.play(scenario)

    def test_unparseable_arguments_are_answered_with_an_error(self) -> None:
        if not self.kit.carries_raw_arguments:
            pytest.skip(f"{self.kit.name} sends arguments as an object: they are always JSON")
        broken = ToolCall(id="call_z", name="get_weather", arguments='{"city": "Par')

        async def scenario(server: WireServer, url: str) -> None:
            server.then(self.kit.reply(answer("", broken), stream=True))
            server.then(self.kit.reply(answer("Sorry."), stream=True))
            agent = Agent(model=self.model(url, stream=True), tools=[get_weather])
            result = await agent.run("Weather in Paris?")
            assert result.stop_reason is StopReason.FINAL_ANSWER
            [(_, text)] = self.kit.tool_results(server.body(1))
            assert "JSON" in text

        self.play(scenario)

    def test_a_run_retries_a_rate_limit_and_stops_on_a_bad_key(self) -> None:
        limits = Limits(retry_backoff_s=0.0, retry_backoff_max_s=0.0)

        async def scenario(server: WireServer, url: str) -> None:
            server.then(
                self.kit.error(429, "slow down", retry_after=0), self.kit.reply(answer("ok"))
            )
            result = await Agent(model=self.model(url), limits=limits).run("hi")
            assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "ok")
            server.then(self.kit.error(401, f"bad key {CONTRACT_KEY}"))
            result = await Agent(model=self.model(url), limits=limits).run("hi")
            assert result.stop_reason is StopReason.MODEL_ERROR
            assert result.error is not None
            assert CONTRACT_KEY not in result.error

        self.play(scenario)
