"""Native typed output on Gemini: ``Agent(output_mode="native")`` with ``GeminiModel``, through
the real ``google-genai`` SDK and the kit's fake server (no test touches the network).

The schema travels as ``generationConfig.responseMimeType`` JSON and ``responseJsonSchema``.
Gemini 3 takes that beside function declarations; Gemini 1.x and 2.x refuse the pair (HTTP
400), so on their requests with tools the schema goes in the system instruction instead.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from google import genai
from google.genai import types
from pydantic import BaseModel

from agent_fsm import Agent, ConfigError, RunStatus, StopReason, tool
from agent_fsm.messages import ModelRequest, OutputFormat, SystemMessage, ToolSpec, UserMessage
from agent_fsm.models.gemini import GeminiModel
from agent_fsm.testing import call, reply
from tests.provider_kits.anthropic import KIT as ANTHROPIC
from tests.provider_kits.base import FAKE_KEY, FakeServer
from tests.provider_kits.gemini import BASE_URL, KIT, sdk_http

GEMINI_3 = "gemini-3-flash-preview"
GEMINI_2 = "gemini-2.5-flash"


class Invoice(BaseModel):
    """An invoice read from a document."""

    number: str
    total: float


INVOICE = OutputFormat(name="Invoice", schema=Invoice.model_json_schema())
LOOKUP = ToolSpec(
    name="lookup",
    description="Look an invoice up.",
    parameters={"type": "object", "properties": {"number": {"type": "string"}}},
)


@tool
def lookup(number: str) -> str:
    """Look an invoice up."""
    return f"invoice {number}: 120.5 EUR"


@pytest.fixture
def server() -> FakeServer:
    return FakeServer()


def model_for(
    server: FakeServer, name: str = GEMINI_3, *, stream: bool = False, **settings: Any
) -> GeminiModel:
    options = types.HttpOptions(base_url=BASE_URL, httpx_async_client=sdk_http(server.client()))
    sdk = genai.Client(vertexai=False, api_key=FAKE_KEY, http_options=options)
    return GeminiModel(name, client=sdk, stream=stream, **settings)


def a_request(*, tools: tuple[ToolSpec, ...] = (LOOKUP,), **kw: Any) -> ModelRequest:
    messages = (SystemMessage(content="Be exact."), UserMessage(content="Read F-17."))
    return ModelRequest(messages=messages, tools=tools, run_id="run9", turn=1, **kw)


def generation(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = body.get("generationConfig", {})
    return config


def instruction(body: dict[str, Any]) -> str:
    text = KIT.system_prompt(body)
    assert text is not None
    return text


# --------------------------------------------------------------------------- the request


def test_the_adapter_says_it_supports_native_output() -> None:
    assert GeminiModel.supports_native_output is True


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("tools", [(LOOKUP,), ()], ids=["tools", "no tools"])
async def test_gemini_3_gets_the_mime_type_and_the_json_schema_unchanged(
    server: FakeServer, stream: bool, tools: tuple[ToolSpec, ...]
) -> None:
    server.then(KIT.reply(reply('{"number": "F-17", "total": 120.5}'), stream=stream))
    response = await model_for(server, stream=stream).request(
        a_request(tools=tools, output=INVOICE)
    )
    assert response.message.content == '{"number": "F-17", "total": 120.5}'
    body = server.body()
    assert generation(body)["responseMimeType"] == "application/json"
    assert generation(body)["responseJsonSchema"] == Invoice.model_json_schema()
    assert "responseSchema" not in generation(body)
    assert ("tools" in body) is bool(tools)
    assert instruction(body) == "Be exact."  # the schema is not repeated in words


async def test_gemini_2_with_tools_gets_the_schema_in_its_system_instruction(
    server: FakeServer,
) -> None:
    """Gemini 1.x/2.x refuse a response schema beside function declarations (HTTP 400)."""
    server.then(KIT.reply(reply('{"number": "F-17", "total": 120.5}')))
    await model_for(server, GEMINI_2).request(a_request(output=INVOICE))
    body = server.body()
    assert "responseMimeType" not in generation(body)
    assert "responseJsonSchema" not in generation(body)
    assert body["tools"][0]["functionDeclarations"][0]["name"] == "lookup"
    said = instruction(body)
    assert said.startswith("Be exact.\n\n")
    schema = json.loads(said[said.index("{") :])
    assert schema == Invoice.model_json_schema()


async def test_gemini_2_without_tools_gets_the_schema_natively(server: FakeServer) -> None:
    server.then(KIT.reply(reply('{"number": "F-17", "total": 120.5}')))
    await model_for(server, GEMINI_2).request(a_request(tools=(), output=INVOICE))
    body = server.body()
    assert generation(body)["responseMimeType"] == "application/json"
    assert generation(body)["responseJsonSchema"] == Invoice.model_json_schema()
    assert instruction(body) == "Be exact."


async def test_the_output_schema_replaces_a_response_schema_setting(server: FakeServer) -> None:
    """The API takes ``responseSchema`` or ``responseJsonSchema``, never both."""
    setting = {"type": "OBJECT", "properties": {"x": {"type": "STRING"}}}
    server.then(KIT.reply(reply("{}")), KIT.reply(reply('{"x": "y"}')))
    model = model_for(server, response_mime_type="application/json", response_schema=setting)
    await model.request(a_request(output=INVOICE))
    typed = generation(server.body())
    assert "responseSchema" not in typed
    assert typed["responseJsonSchema"] == Invoice.model_json_schema()
    await model.request(a_request())  # without output the settings are sent as they are
    untyped = generation(server.body())
    assert untyped["responseMimeType"] == "application/json"
    assert "responseSchema" in untyped
    assert "responseJsonSchema" not in untyped


async def test_a_request_without_output_carries_no_schema(server: FakeServer) -> None:
    server.then(KIT.reply(reply("F-17 totals 120.5.")))
    await model_for(server).request(a_request())
    body = server.body()
    assert "responseMimeType" not in generation(body)
    assert "responseJsonSchema" not in generation(body)
    assert instruction(body) == "Be exact."


async def test_the_callers_schema_is_never_modified(server: FakeServer) -> None:
    schema = Invoice.model_json_schema()
    output = OutputFormat(name="Invoice", schema=schema)
    server.then(KIT.reply(reply("{}")))
    await model_for(server).request(a_request(output=output))
    assert schema == Invoice.model_json_schema()


# --------------------------------------------------------------------------- whole runs


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_native_run_returns_the_typed_value(server: FakeServer, stream: bool) -> None:
    server.then(KIT.reply(reply('{"number": "F-17", "total": 120.5}'), stream=stream))
    agent = Agent(model=model_for(server, stream=stream), output_type=Invoice, output_mode="native")
    result = await agent.run("Read the invoice.")
    assert (result.status, result.stop_reason) == (RunStatus.COMPLETED, StopReason.FINAL_ANSWER)
    assert isinstance(result.value, Invoice)
    assert result.value == Invoice(number="F-17", total=120.5)
    assert generation(server.body())["responseJsonSchema"] == Invoice.model_json_schema()


async def test_a_reply_that_does_not_validate_goes_back_to_the_model(server: FakeServer) -> None:
    server.then(
        KIT.reply(reply("", call("lookup", number="F-17"))),
        KIT.reply(reply('{"number": "F-17"}')),  # total missing
        KIT.reply(reply("It totals 120.5 EUR.")),  # no JSON at all
        KIT.reply(reply('{"number": "F-17", "total": 120.5}')),
    )
    agent = Agent(
        model=model_for(server), tools=[lookup], output_type=Invoice, output_mode="native"
    )
    result = await agent.run("Read the invoice.")
    assert result.value == Invoice(number="F-17", total=120.5)
    assert result.turns == 4
    bodies = [server.body(i) for i in range(4)]
    assert all(generation(b)["responseJsonSchema"] == Invoice.model_json_schema() for b in bodies)
    assert all("tools" in b for b in bodies)
    corrections = [
        part["text"]
        for body in bodies[2:]
        for part in body["contents"][-1]["parts"]
        if "text" in part
    ]
    assert len(corrections) == 2
    assert "not a valid result" in corrections[0]
    assert "'total' is a required property" in corrections[0]
    assert "not JSON" in corrections[1]
    assert [text for _, text in KIT.tool_results(bodies[1])] == ["invoice F-17: 120.5 EUR"]


async def test_a_gemini_2_run_with_tools_is_held_to_the_schema_it_was_told(
    server: FakeServer,
) -> None:
    server.then(
        KIT.reply(reply('```json\n{"number": "F-17", "total": 120.5}\n```')),  # fenced
        KIT.reply(reply('{"number": "F-17", "total": 120.5}')),
    )
    agent = Agent(
        model=model_for(server, GEMINI_2),
        tools=[lookup],
        system_prompt="Read invoices.",
        output_type=Invoice,
        output_mode="native",
    )
    result = await agent.run("Read the invoice.")
    assert result.value == Invoice(number="F-17", total=120.5)
    assert result.turns == 2
    for body in (server.body(0), server.body(1)):
        assert "responseJsonSchema" not in generation(body)
        assert json.dumps(Invoice.model_json_schema(), separators=(",", ":")) in instruction(body)
    [correction] = [p["text"] for p in server.body(1)["contents"][-1]["parts"] if "text" in p]
    assert "not JSON" in correction


# --------------------------------------------------------------------------- other adapters


def test_native_output_with_the_anthropic_adapter_is_refused_at_construction() -> None:
    """The Anthropic adapter does not say it supports native output: the agent refuses the
    mode clearly instead of sending a schema the adapter would drop."""
    model = ANTHROPIC.build(FakeServer().client())
    assert getattr(model, "supports_native_output", False) is False
    with pytest.raises(ConfigError, match=r"supports_native_output.*AnthropicModel"):
        Agent(model=model, output_type=Invoice, output_mode="native")
