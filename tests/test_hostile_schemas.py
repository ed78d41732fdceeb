"""Hostile schemas (issue 33, points 1, 3 and 7): a schema from the developer, a pydantic model
or an MCP server, and a value from the model, can neither hold the event loop past a run's
deadline, nor crash construction or a run, nor cost more than the one tool at fault.

A backtracking pattern is played against a run with a deadline while another run shares the
event loop: the hostile run waits, before its last reply, for the other run to finish. Both
end normally only if the loop was never held: on Python's ``re`` the pattern below takes about
twenty seconds, long past the deadline (the hostile run then ends ``timeout``). The tests
assert outcomes, never durations."""

from __future__ import annotations

import asyncio
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, ConfigDict, Field, constr

from agent_fsm import Agent, ConfigError, Limits, RunResult, StopReason, Tool, tool
from agent_fsm.mcp import MCPConnection, SkippedToolWarning
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage
from agent_fsm.testing import FunctionModel, ScriptedModel, call, check_invariants, raw_call, reply
from agent_fsm.tools.schema_checks import MAX_SCHEMA_DEPTH

BACKTRACKS = "(a+)+$"
HOSTILE = "a" * 28 + "!"
"""Python's ``re`` takes ~20 s to find that ``BACKTRACKS`` does not match this (x4 per two
more characters); a linear-time engine, microseconds."""
DEADLINE = Limits(timeout_s=3.0, max_consecutive_errors=5)
RAW_SERVER = str(Path(__file__).resolve().parent / "mcp_servers" / "raw_server.py")
PATIENCE_S = 60.0


def nested(levels: int, leaf: dict[str, Any] | None = None) -> dict[str, Any]:
    """An object schema nested ``levels`` objects deep (two JSON levels each)."""
    schema: dict[str, Any] = leaf or {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


def _answers(result: RunResult) -> list[ToolMessage]:
    return [message for message in result.messages if isinstance(message, ToolMessage)]


@tool
def count(n: int) -> int:
    """Count."""
    return n


async def _alongside(
    hostile: Callable[[Callable[[ModelRequest], Any]], Agent],
    first: ModelResponse | str,
    last: ModelResponse | str = "Done.",
) -> tuple[RunResult, RunResult]:
    """A run of the agent ``hostile`` makes around a model, which replies ``first``, then
    waits for a benign run on the same loop to finish, then replies ``last``; and that
    benign run."""
    other_done = asyncio.Event()
    turns: list[int] = []

    async def answer(request: ModelRequest) -> ModelResponse | str:
        turns.append(request.turn)
        if len(turns) == 1:
            return first
        await other_done.wait()  # the other run needs the loop to get here
        return last

    async def benign() -> RunResult:
        script = [reply("", call("count", n=1)), reply("", call("count", n=2)), "Counted."]
        try:
            return await Agent(model=ScriptedModel(script), tools=[count]).run("Count.")
        finally:
            other_done.set()

    agent = hostile(answer)
    results = await asyncio.wait_for(
        asyncio.gather(agent.run("Go."), benign()), PATIENCE_S
    )  # fmt: skip
    check_invariants(results[0], limits=agent.limits, bound=agent.bound)
    return results


# -- 1. patterns match in linear time -------------------------------------------------------------


class Coded(BaseModel):
    code: constr(pattern=BACKTRACKS)  # type: ignore[valid-type]


def _schema_tool(parameters: dict[str, Any]) -> Tool:
    return Tool("lookup", "Look a code up.", parameters, lambda **kwargs: "found")


@tool
def lookup(code: Annotated[str, Field(pattern=BACKTRACKS)]) -> str:
    """Look a code up."""
    return "found"


PATTERN_TOOLS = {
    "pattern": (
        _schema_tool({"type": "object", "properties": {"code": {"pattern": BACKTRACKS}}}),
        {"code": HOSTILE},
        True,
    ),
    "Field(pattern=...)": (lookup, {"code": HOSTILE}, True),
    "patternProperties": (  # the key does not match, so it is not held to the null schema
        _schema_tool({"type": "object", "patternProperties": {BACKTRACKS: {"type": "null"}}}),
        {HOSTILE: 1},
        False,
    ),
    "additionalProperties": (
        _schema_tool(
            {
                "type": "object",
                "patternProperties": {BACKTRACKS: {}},
                "additionalProperties": False,
            }
        ),
        {HOSTILE: 1},
        True,
    ),
    "propertyNames": (
        _schema_tool({"type": "object", "propertyNames": {"pattern": BACKTRACKS}}),
        {HOSTILE: 1},
        True,
    ),
}


@pytest.mark.parametrize("keyword", list(PATTERN_TOOLS))
async def test_a_backtracking_pattern_in_a_tool_schema_holds_no_loop(keyword: str) -> None:
    made, arguments, refused = PATTERN_TOOLS[keyword]
    hostile, other = await _alongside(
        lambda answer: Agent(model=FunctionModel(answer), tools=[made], limits=DEADLINE),
        reply("", call("lookup", **arguments)),
    )
    assert other.stop_reason is StopReason.FINAL_ANSWER
    assert hostile.stop_reason is StopReason.FINAL_ANSWER  # on re: TIMEOUT, the loop held
    [answer] = _answers(hostile)
    if refused:
        assert answer.is_error
        assert "Invalid arguments for tool 'lookup'" in answer.content
    else:
        assert answer.content == "found"


@pytest.mark.parametrize("output_type", [Coded, Coded.model_json_schema()], ids=["model", "dict"])
async def test_a_backtracking_pattern_in_the_output_tool_holds_no_loop(output_type: Any) -> None:
    hostile, other = await _alongside(
        lambda answer: Agent(model=FunctionModel(answer), output_type=output_type, limits=DEADLINE),
        reply("", call("final_result", code=HOSTILE)),
        reply("", call("final_result", code="aaa")),
    )
    assert other.stop_reason is StopReason.FINAL_ANSWER
    assert hostile.stop_reason is StopReason.TERMINAL_TOOL  # on re: TIMEOUT, the loop held
    wrong, right = _answers(hostile)
    assert (wrong.is_error, right.is_error) == (True, False)
    assert "does not match '(a+)+$'" in wrong.content
    assert hostile.value in (Coded(code="aaa"), {"code": "aaa"})


async def test_a_backtracking_pattern_in_native_output_holds_no_loop() -> None:
    hostile, other = await _alongside(
        lambda answer: Agent(
            model=FunctionModel(answer),
            output_type=Coded,
            output_mode="native",
            limits=Limits(timeout_s=3.0, output_retries=5),
        ),
        f'{{"code": "{HOSTILE}"}}',
        '{"code": "aaa"}',
    )
    assert other.stop_reason is StopReason.FINAL_ANSWER
    assert (hostile.stop_reason, hostile.value) == (StopReason.FINAL_ANSWER, Coded(code="aaa"))
    assert "does not match '(a+)+$'" in hostile.messages[2].content  # the correction


def test_pydantic_matches_patterns_on_its_linear_engine() -> None:
    # Coded's own pass (after the schema's): pydantic-core's Rust regex, linear. On a
    # backtracking engine this call would not return in the lifetime of the universe.
    with pytest.raises(ValueError, match="String should match pattern"):
        Coded.model_validate({"code": "a" * 100_000 + "!"})


def test_a_schema_pass_matches_a_long_hostile_string_at_once() -> None:
    made, _, _ = PATTERN_TOOLS["pattern"]
    errors = list(made.validator.iter_errors({"code": "a" * 100_000 + "!"}))
    assert [error.message for error in errors] == [
        f"{'a' * 80!r}... (100001 characters) does not match '(a+)+$'"
    ]


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        ("b", "abc", True),  # JSON Schema's pattern searches: it is not anchored
        ("^b", "abc", False),
        (r"^\d{3}$", "123", True),
        ("^é+$", "éé", True),
        (r"^\w+$", "héllo", True),  # Unicode classes, as Python's re has them
        (r"^\u00e9$", "é", True),  # ECMA-262's \u escape
        ("^x.y$", "x\ud83dy", True),  # a lone surrogate is one character, as in the transcript
        ("(?i)^abc$", "ABC", True),
    ],
)
def test_patterns_keep_json_schemas_meaning(pattern: str, text: str, matches: bool) -> None:
    made = _schema_tool({"type": "object", "properties": {"s": {"pattern": pattern}}})
    assert made.validator.is_valid({"s": text}) is matches


def test_additional_properties_still_speak_as_jsonschema_does() -> None:
    made = _schema_tool(
        {"type": "object", "patternProperties": {"^x": {}}, "additionalProperties": False}
    )
    [error] = made.validator.iter_errors({"xa": 1, "b": 2, "c": 3})
    assert error.message == "'b', 'c' do not match any of the regexes: '^x'"
    closed = _schema_tool({"type": "object", "properties": {}, "additionalProperties": False})
    [error] = closed.validator.iter_errors({"b": 2})
    assert error.message == "Additional properties are not allowed ('b' was unexpected)"


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("^(?=a)", "look-around"),
        (r"(a)\1", "backreferences are not supported"),
        (r"a\Z", "unrecognized escape"),
    ],
)
def test_a_pattern_the_engine_refuses_is_a_config_error_naming_tool_and_pattern(
    pattern: str, reason: str
) -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}}
    with pytest.raises(ConfigError, match=re.escape(f"tool 'lookup': the pattern {pattern!r}")):
        _schema_tool(schema)
    with pytest.raises(ConfigError, match=reason):
        _schema_tool({"type": "object", "patternProperties": {pattern: {}}})
    with pytest.raises(ConfigError, match=re.escape(f"output_type: the pattern {pattern!r}")):
        Agent(model=ScriptedModel([]), output_type=schema)


def test_unevaluated_properties_beside_pattern_properties_is_refused() -> None:
    schema = {"type": "object", "patternProperties": {"^a": {}}, "unevaluatedProperties": False}
    with pytest.raises(ConfigError, match="unevaluatedProperties cannot be used beside"):
        _schema_tool(schema)


class Compiled(BaseModel):
    code: Annotated[str, Field(pattern=re.compile("^[a-z]+$"))]


class PythonRe(BaseModel):
    model_config = ConfigDict(regex_engine="python-re")
    code: constr(pattern="^[a-z]+$")  # type: ignore[valid-type]


def test_a_pydantic_pattern_matched_with_pythons_re_is_refused() -> None:
    for model in (Compiled, PythonRe):
        with pytest.raises(ConfigError, match="with Python's backtracking re"):
            Agent(model=ScriptedModel([]), output_type=model)

    # a parameter that needs converting is validated by the tool's pydantic model too
    with pytest.raises(ConfigError, match="tool 'file': pydantic would match its pattern"):

        @tool
        def file(invoice: Compiled) -> str:
            """File an invoice."""
            return invoice.code


# -- 7. deep schemas are refused with their depth -----------------------------------------------


def test_a_deep_schema_is_a_config_error_with_its_depth() -> None:
    with pytest.raises(ConfigError, match=r"tool 'lookup': the schema is nested 201 levels deep"):
        _schema_tool(nested(100))
    with pytest.raises(ConfigError, match=r"output_type: the schema is nested 201 levels deep"):
        Agent(model=ScriptedModel([]), output_type=nested(100))
    with pytest.raises(ConfigError, match=f"at most {MAX_SCHEMA_DEPTH} are accepted"):
        Agent(model=ScriptedModel([]), output_type=nested(10_000))


def test_a_schema_that_contains_itself_is_a_config_error() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {}}
    schema["properties"]["self"] = schema
    with pytest.raises(ConfigError, match="contains itself"):
        _schema_tool(schema)


def test_the_deepest_schema_accepted_validates_inside_a_run() -> None:
    levels = (MAX_SCHEMA_DEPTH - 1) // 2  # 2 * levels + 1 JSON levels: 63
    with pytest.raises(ConfigError, match="nested 65 levels deep"):
        _schema_tool(nested(levels + 1))
    made = _schema_tool(nested(levels))
    arguments: Any = "leaf"
    for _ in range(levels - 1):
        arguments = {"inner": arguments}
    script = [reply("", call("lookup", inner=arguments)), "Done."]
    result = Agent(model=ScriptedModel(script), tools=[made]).run_sync("Go.")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert [answer.content for answer in _answers(result)] == ["found"]


@pytest.mark.parametrize(
    ("defs", "says"),
    [
        ({"a": {"$ref": "#/$defs/a"}}, "leads back to itself"),
        ({"a": {"$ref": "#/$defs/b"}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}}, "leads back"),
        (
            {**{f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(99)}, "d99": {}},
            "subschemas applied to one value",
        ),
    ],
)
def test_a_ref_loop_or_an_endless_chain_is_a_config_error(defs: dict[str, Any], says: str) -> None:
    schema = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/a"}}}
    if "a" not in defs:
        schema["properties"]["x"] = {"$ref": "#/$defs/d0"}
    with pytest.raises(ConfigError, match=says):
        _schema_tool(schema)


def test_a_recursive_schema_is_accepted_and_values_too_deep_for_it_are_errors() -> None:
    level: dict[str, Any] = {"type": "object", "properties": {"c": {"$ref": "#/$defs/node"}}}
    for _ in range(6):  # each level of the value costs validation seven subschemas
        level = {"allOf": [level]}
    made = _schema_tool({"type": "object", "$defs": {"node": level}, **level["allOf"][0]})

    def nesting(levels: int, leaf: str = "{}") -> str:
        for _ in range(levels):
            leaf = '{"c": ' + leaf + "}"
        return leaf

    script = [
        reply("", raw_call("lookup", nesting(10))),
        reply("", raw_call("lookup", nesting(150))),  # within what the JSON parser takes
        reply("", raw_call("lookup", nesting(400, '{"s": "\\ud83d"}'))),  # json.loads' way
        "Done.",
    ]
    result = Agent(model=ScriptedModel(script), tools=[made]).run_sync("Go.")  # before: raised
    assert result.stop_reason is StopReason.FINAL_ANSWER
    fine, too_deep, deeper = _answers(result)
    assert fine.content == "found"
    assert "they are nested too deeply to validate" in too_deep.content
    assert "recursion limit exceeded" in deeper.content


def test_a_native_reply_nested_past_the_stack_is_a_correction_not_a_crash() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    script = [deep, '{"code": "abc"}']
    agent = Agent(
        model=ScriptedModel(script),
        output_type={"type": "object", "properties": {"code": {"type": "string"}}},
        output_mode="native",
    )
    result = agent.run_sync("Go.")
    assert (result.stop_reason, result.value) == (StopReason.FINAL_ANSWER, {"code": "abc"})
    assert "nested too deeply" in result.messages[2].content


# -- 3. one hostile MCP tool costs only itself --------------------------------------------------


async def _hostile_server(prefix: str = "") -> tuple[MCPConnection, list[str]]:
    server = MCPConnection.stdio(sys.executable, [RAW_SERVER, "--hostile"], prefix=prefix)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await asyncio.wait_for(server.__aenter__(), PATIENCE_S)
    assert {warning.category for warning in caught} == {SkippedToolWarning}
    return server, [str(warning.message) for warning in caught]


async def test_server_tools_named_like_control_tools_are_skipped_and_the_rest_work() -> None:
    server, warned = await _hostile_server()
    try:
        for name in ("ask_user", "finish_task", "final_result"):
            assert any(f"tool {name!r} is not offered" in said for said in warned)
            assert "a prefix= on the connection offers it" in server.skipped[name]
        names = [t.name for t in server.tools]
        assert "ask_user" not in names
        agent = Agent(  # before: ConfigError, two tools named 'ask_user'
            model=ScriptedModel([reply("", call("noisy", text="a")), "Done."]),
            tools=server.tools,
            output_type=Coded,
        )
        assert {"ask_user", "finish_task", "final_result"} <= {s.name for s in agent.registry.specs}
    finally:
        await server.__aexit__(None, None, None)
    prefixed, _ = await _hostile_server(prefix="raw_")
    try:
        assert {"raw_ask_user", "raw_finish_task"} <= {t.name for t in prefixed.tools}
    finally:
        await prefixed.__aexit__(None, None, None)


async def test_each_listed_tool_the_runtime_cannot_take_costs_only_itself() -> None:
    server, _ = await _hostile_server()
    try:
        skipped = server.skipped
        assert "inputSchema.type: Input should be 'object'" in skipped["scalar"]
        assert "nested 81 levels deep" in skipped["deep"]
        assert "the pattern '^(?=a)'" in skipped["lookahead"]
        assert "leads back to itself" in skipped["looping"]
        assert [t.name for t in server.tools] == [
            "files_read", "noisy", "malformed", "silent", "backtracking", "structured",
        ]  # fmt: skip
    finally:
        await server.__aexit__(None, None, None)


@pytest.mark.parametrize(
    ("first", "says"),
    [
        (call("backtracking", text=HOSTILE), "Invalid arguments for tool 'backtracking'"),
        (call("structured", text="x"), "structured content its output schema refuses"),
    ],
    ids=["input-schema", "output-schema"],
)
async def test_a_backtracking_pattern_from_a_server_holds_no_loop(first: Any, says: str) -> None:
    server, _ = await _hostile_server()
    try:
        hostile, other = await _alongside(
            lambda answer: Agent(model=FunctionModel(answer), tools=server.tools, limits=DEADLINE),
            reply("", first),
        )
    finally:
        await server.__aexit__(None, None, None)
    assert other.stop_reason is StopReason.FINAL_ANSWER
    assert hostile.stop_reason is StopReason.FINAL_ANSWER
    [answer] = _answers(hostile)
    assert answer.is_error
    assert says in answer.content
