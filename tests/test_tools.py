"""Tool definitions and every way a tool call can fail (each becomes a result)."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest

from agent_fsm import Agent, ConfigError, Limits, StopReason, Tool, tool
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus
from agent_fsm.testing import ScriptedModel, call, raw_call, reply
from agent_fsm.tools.execution import execute
from agent_fsm.tools.tool import ToolRegistry
from tests.conftest import add, echo, limits

OBJ = {"type": "object", "properties": {}}


def _run(registry: ToolRegistry, tool_call: ToolCall, timeout: float = 5.0) -> ToolMessage:
    executed = asyncio.run(execute(registry.prepare(tool_call), Limits(tool_timeout_s=timeout)))
    return executed.result


def test_schema_from_signature() -> None:
    @tool
    def lookup(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> str:
        """Look the weather up.

        More text the model does not need.
        """
        return city

    assert lookup.name == "lookup"
    assert lookup.description == "Look the weather up."
    assert lookup.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"enum": ["c", "f"], "type": "string", "default": "c"},
            "days": {"type": "integer", "default": 1},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "has space"}, "tool name 'has space' is invalid"),
        ({"name": "x" * 65}, "is invalid"),
        ({"name": ""}, "is invalid"),
        ({"parameters": {"type": "objekt"}}, "not valid JSON Schema"),
        ({"parameters": {"type": "string"}}, 'must have "type": "object"'),
        ({"parameters": {"type": "object", "required": "city"}}, "not valid JSON Schema"),
    ],
)
def test_invalid_tool_definitions(kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {
        "name": "ok",
        "description": "d",
        "parameters": OBJ,
        "fn": lambda: "x",
    }
    args.update(kwargs)
    with pytest.raises(ConfigError, match=message):
        Tool(**args)  # type: ignore[arg-type]


def test_signature_that_cannot_become_a_schema() -> None:
    def varargs(*items: str) -> str:
        return ""

    with pytest.raises(ConfigError, match="tool 'varargs': cannot derive"):
        tool(varargs)


def test_duplicate_tool_names_are_rejected() -> None:
    with pytest.raises(ConfigError, match="two tools are named 'echo'"):
        Agent(model=ScriptedModel([]), tools=[echo, echo])
    finish = Tool("finish_task", "mine", OBJ, lambda: "x")
    with pytest.raises(ConfigError, match="finish_task"):
        Agent(model=ScriptedModel([]), tools=[finish])
    Agent(model=ScriptedModel([]), tools=[finish], control_tools=())


def test_non_tools_and_bad_models_are_rejected() -> None:
    with pytest.raises(ConfigError, match="is not a Tool"):
        Agent(model=ScriptedModel([]), tools=[print])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="Model protocol"):
        Agent(model=object())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unknown control tool"):
        Agent(model=ScriptedModel([]), control_tools=["approve"])


def test_unknown_tool() -> None:
    result = _run(ToolRegistry([echo]), call("ecco", text="x"))
    assert result.status is ToolStatus.ERROR
    assert "Unknown tool 'ecco'. Available tools: echo." in result.content


def test_arguments_that_are_not_json() -> None:
    result = _run(ToolRegistry([echo]), raw_call("echo", '{"text": "x"'))
    assert result.is_error
    assert "not valid JSON" in result.content
    result = _run(ToolRegistry([echo]), raw_call("echo", '["x"]'))
    assert "must be a JSON object, not list" in result.content


@pytest.mark.parametrize(
    ("arguments", "parsed"),
    [
        ('  {"text": "x"}  ', {"text": "x"}),
        ('{"text": "a", "text": "b"}', {"text": "b"}),  # the last duplicate wins, as in json
        ('{"text": "x"} trailing', None),
        # JSON allows a lone surrogate escape; UTF-8 cannot carry it: it arrives as U+FFFD
        ('{"text": "\\ud800"}', {"text": "\ufffd"}),
        ("", {}),
    ],
)
def test_argument_parsing_edge_cases(arguments: str, parsed: dict[str, str] | None) -> None:
    prepared = ToolRegistry([echo]).prepare(raw_call("echo", arguments))
    if parsed is None:
        assert prepared.error is not None
        assert "not valid JSON" in prepared.error
    else:
        assert prepared.arguments == parsed


def test_every_schema_violation_is_listed_with_its_path() -> None:
    nested = Tool(
        "nested",
        "d",
        {
            "type": "object",
            "properties": {
                "a": {"type": "integer"},
                "inner": {"type": "object", "properties": {"b": {"type": "string"}}},
            },
            "required": ["a", "c"],
        },
        lambda **kw: "ok",
    )
    result = _run(ToolRegistry([nested]), call("nested", a="one", inner={"b": 2}))
    assert result.is_error
    lines = result.content.splitlines()
    assert lines[0] == "Invalid arguments for tool 'nested':"
    assert "- at (arguments): 'c' is a required property" in lines
    assert "- at a: 'one' is not of type 'integer'" in lines
    assert "- at inner/b: 2 is not of type 'string'" in lines


def test_exception_in_tool() -> None:
    result = _run(ToolRegistry([add]), call("add", a=1, b=2))
    assert (result.status, result.content) == (ToolStatus.OK, "3")

    @tool
    def fails(x: int) -> int:
        """Fails."""
        raise ZeroDivisionError("division by zero")

    result = _run(ToolRegistry([fails]), call("fails", x=1))
    assert result.content == "Tool 'fails' failed: ZeroDivisionError: division by zero"


def test_timeout_of_an_async_tool() -> None:
    @tool
    async def slow() -> str:
        """Sleeps."""
        await asyncio.sleep(10)
        return "late"

    result = _run(ToolRegistry([slow]), call("slow"), timeout=0.01)
    assert result.content == "Tool 'slow' timed out after 0.01 s."


def test_non_serialisable_return_is_an_error_result() -> None:
    @tool
    def odd() -> object:
        """Returns a set."""
        return {1, 2}

    result = _run(ToolRegistry([odd]), call("odd"))
    assert result.is_error
    assert "cannot be sent to the model" in result.content


def test_tool_errors_reach_the_model_and_it_corrects_itself() -> None:
    model = ScriptedModel(
        [
            reply("", raw_call("add", "{oops"), call("nope"), call("add", a="1", b=2)),
            reply("", call("add", a=1, b=2)),
            "3",
        ]
    )
    agent = Agent(model=model, tools=[add], limits=limits())
    result = agent.run_sync("1+2?")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    second_prompt = list(model.requests[1].messages)
    errors = [m for m in second_prompt if isinstance(m, ToolMessage)]
    assert [e.status for e in errors] == [ToolStatus.ERROR] * 3
    assert result.messages[-2].content == "3"  # the corrected call's result
