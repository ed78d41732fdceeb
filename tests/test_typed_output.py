"""Typed output: ``Agent(output_type=...)`` holds the final answer to a pydantic model or a JSON
Schema, through a terminal output tool or the model's native structured output; an answer that
does not validate goes back to the model, a bounded number of times, each a turn."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, field_validator

from agent_fsm import Agent, ConfigError, Limits, RunStatus, StopReason, tool
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage, ToolStatus, UserMessage
from agent_fsm.table import AgentState
from agent_fsm.testing import FunctionModel, ScriptedModel, assert_terminates, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import Recorder
from tests.provider_kits.base import FakeServer
from tests.provider_kits.openai_chat import KIT as OPENAI


class Invoice(BaseModel):
    """An invoice read from a document."""

    number: str
    total: float
    currency: str = "EUR"

    @field_validator("total")
    @classmethod
    def positive(cls, total: float) -> float:
        if total <= 0:
            raise ValueError("the total must be positive")
        return total


INVOICE_SCHEMA = {
    "type": "object",
    "properties": {"number": {"type": "string"}, "total": {"type": "number"}},
    "required": ["number", "total"],
    "additionalProperties": False,
}


def _run(agent: Agent, text: str = "Read the invoice.") -> Any:
    recorder = Recorder()
    agent = agent.subscribe(recorder)
    result = agent.run_sync(text)
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=recorder)
    return result


def _corrections(result: Any) -> list[str]:
    return [m.content for m in result.messages if isinstance(m, UserMessage)][1:]


# --------------------------------------------------------------------------- tool mode


def test_the_output_tool_delivers_a_validated_model_instance() -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("final_result", number="F-17", total=120.5))]),
        output_type=Invoice,
    )
    result = _run(agent)
    assert (result.stop_reason, result.status) == (StopReason.TERMINAL_TOOL, RunStatus.COMPLETED)
    assert result.value == Invoice(number="F-17", total=120.5)
    assert json.loads(result.output) == {"number": "F-17", "total": 120.5, "currency": "EUR"}
    spec = next(s for s in agent.registry.specs if s.name == "final_result")
    assert spec.parameters == Invoice.model_json_schema()


def test_text_schema_errors_and_validator_errors_each_go_back_to_the_model() -> None:
    agent = Agent(
        model=ScriptedModel([
            "The invoice F-17 totals 120.5 EUR.",                      # no result given
            reply("", call("final_result", number="F-17")),           # schema: total missing
            reply("", call("final_result", number="F-17", total=-3)),  # the model's validator
            reply("", call("final_result", number="F-17", total=120.5)),
        ]),
        output_type=Invoice,
    )  # fmt: skip
    result = _run(agent)
    assert result.value == Invoice(number="F-17", total=120.5)
    assert result.turns == 4
    [correction] = _corrections(result)
    assert "calling the `final_result` tool" in correction
    failed = [m for m in result.messages if isinstance(m, ToolMessage)][:2]
    assert [m.status for m in failed] == [ToolStatus.ERROR, ToolStatus.ERROR]
    assert "'total' is a required property" in failed[0].content
    assert "the total must be positive" in failed[1].content


def test_too_many_invalid_answers_stop_the_run_as_invalid_output() -> None:
    agent = Agent(
        model=ScriptedModel(["no", "still no", reply("", call("final_result", number="x"))]),
        output_type=Invoice,
        limits=Limits(output_retries=2, max_turns=10),
    )
    result = _run(agent)
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.INVALID_OUTPUT)
    assert result.error == "the final answer did not validate 3 times (output_retries=2)"
    assert result.value is None
    assert result.turns == 3


def test_corrections_count_against_max_turns() -> None:
    agent = Agent(
        model=ScriptedModel(["no", "no again"]),
        output_type=Invoice,
        limits=Limits(max_turns=2, output_retries=5),
    )
    result = _run(agent)
    assert result.stop_reason is StopReason.MAX_TURNS
    assert result.turns == 2


def test_a_json_schema_output_type_gives_its_json_value() -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("final_result", number="7", total=1))]),
        output_type=INVOICE_SCHEMA,
    )
    assert _run(agent).value == {"number": "7", "total": 1}


def test_a_terminal_user_tool_ending_the_run_gives_no_typed_value() -> None:
    @tool(terminal=True)
    def give_up(reason: str) -> str:
        """Stop without a result."""
        return reason

    agent = Agent(
        model=ScriptedModel([reply("", call("give_up", reason="unreadable"))]),
        tools=[give_up],
        output_type=Invoice,
    )
    result = _run(agent)
    assert (result.stop_reason, result.output, result.value) == (
        StopReason.TERMINAL_TOOL,
        "unreadable",
        None,
    )


# --------------------------------------------------------------------------- native mode


def test_native_output_sends_the_schema_and_validates_the_text() -> None:
    seen: list[ModelRequest] = []
    replies = iter(['{"number": "F-17"}', '{"number": "F-17", "total": 120.5}'])

    def answer(request: ModelRequest) -> ModelResponse:
        seen.append(request)
        return reply(next(replies))

    agent = Agent(model=FunctionModel(answer), output_type=Invoice, output_mode="native")
    result = _run(agent)
    assert (result.stop_reason, result.value) == (
        StopReason.FINAL_ANSWER,
        Invoice(number="F-17", total=120.5),
    )
    assert all(
        r.output is not None and r.output.schema == Invoice.model_json_schema() for r in seen
    )
    assert all(spec.name != "final_result" for spec in seen[0].tools)
    [correction] = _corrections(result)
    assert "not a valid result" in correction
    assert "'total' is a required property" in correction


def test_native_output_needs_a_model_that_supports_it() -> None:
    class PlainModel:
        name = "plain"

        async def request(self, request: ModelRequest) -> ModelResponse:
            return reply("{}")

    with pytest.raises(ConfigError, match="supports_native_output"):
        Agent(model=PlainModel(), output_type=Invoice, output_mode="native")


async def test_the_openai_adapter_sends_the_schema_as_response_format() -> None:
    server = FakeServer()
    server.then(OPENAI.reply(reply('{"number": "F-1", "total": 2}')))
    agent = Agent(model=OPENAI.build(server.client()), output_type=Invoice, output_mode="native")
    result = await agent.run("Read it.")
    assert result.value == Invoice(number="F-1", total=2)
    sent = server.body()["response_format"]
    assert sent == {
        "type": "json_schema",
        "json_schema": {"name": "Invoice", "schema": Invoice.model_json_schema()},
    }


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"output_type": {"type": "array"}}, "must describe an object"),
        ({"output_type": {"type": "object", "properties": 3}}, "not valid JSON Schema"),
        ({"output_type": int}, "a pydantic model class or a JSON Schema"),
        ({"output_type": Invoice, "output_mode": "xml"}, "output_mode must be"),
    ],
)
def test_bad_output_configuration_is_refused(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        Agent(model=ScriptedModel([]), **options)


def test_a_user_tool_named_like_the_output_tool_is_refused() -> None:
    @tool
    def final_result(x: int) -> int:
        """Clashes."""
        return x

    with pytest.raises(ConfigError, match="final_result"):
        Agent(model=ScriptedModel([]), tools=[final_result], output_type=Invoice)


# --------------------------------------------------------------------------- the harness


@pytest.mark.parametrize("mode", ["tool", "native"])
def test_the_harness_proves_a_typed_output_agent_terminates(mode: Any) -> None:
    agent = Agent(
        model=ScriptedModel([]),
        output_type=Invoice,
        output_mode=mode,
        limits=Limits(max_turns=4, output_retries=2, retry_backoff_s=0.0, retry_backoff_max_s=0.0),
    )
    assert_terminates(agent, max_examples=150)
