"""Hostile inputs, generated (issue 33): careless histories, lying context policies, unclean
text in ids and notes. Whatever is generated, every run keeps its invariants and every
prompt is a valid transcript with the latest input in it; a regression shows up here."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm import (
    Agent,
    ConfigError,
    KeepLastTurns,
    Limits,
    MemoryStore,
    Table,
    Tool,
    tool,
)
from agent_fsm.events import Event, ModelRequested
from agent_fsm.mcp import offer_listed
from agent_fsm.messages import AssistantMessage, Message, ToolMessage, UserMessage
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply
from agent_fsm.testing.hostile import LyingPolicy, histories, lying_policies, unclean_text
from agent_fsm.testing.invariants import transcript_problems
from agent_fsm.tools import ToolResult
from tests.conftest import echo
from tests.custom_tables import once

SHARE = settings(max_examples=max(50, settings.default.max_examples // 8))
"""An eighth of the profile's examples for each property here (250 in CI)."""


def _pairs_by_id(prompt: list[Message]) -> list[str]:
    """What is wrong with the ids of a prompt: an empty or repeated call id, or a result
    that does not name its call's tool."""
    problems: list[str] = []
    seen: set[str] = set()
    names: dict[str, str] = {}
    for message in prompt:
        if isinstance(message, AssistantMessage):
            for tool_call in message.tool_calls:
                if not tool_call.id or tool_call.id in seen:
                    problems.append(f"call id {tool_call.id!r}")
                seen.add(tool_call.id)
                names[tool_call.id] = tool_call.name
        elif isinstance(message, ToolMessage) and names.get(message.tool_call_id) != message.name:
            problems.append(f"result {message.tool_call_id!r} names {message.name}")
    return problems


@SHARE
@given(history=histories(["echo"]))
def test_every_history_is_repaired_into_a_transcript_a_provider_takes(
    history: list[Message],
) -> None:
    model = ScriptedModel(["Fine."])
    agent = Agent(model=model, tools=[echo])
    result = agent.run_sync("And now?", history=history)
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    prompt = list(model.requests[0].messages)
    assert transcript_problems(prompt) == []
    assert _pairs_by_id(prompt) == []
    assert prompt[-1] == UserMessage(content="And now?")


BIG = 4_000


@tool
def fetch(page: int) -> ToolResult:
    """Fetch one page of a large document."""
    return ToolResult(output=f"page {page}: " + "x" * BIG)


@SHARE
@given(policy=lying_policies(), pages=st.integers(1, 5), helped=st.booleans())
def test_a_lying_policy_never_breaks_a_prompt_or_the_transcript(
    policy: LyingPolicy, pages: int, helped: bool
) -> None:
    events: list[Event] = []
    model = ScriptedModel([*(reply("", call("fetch", page=p)) for p in range(pages)), "Done."])
    agent = Agent(
        model=model,
        tools=[fetch],
        limits=Limits(max_turns=10, token_budget=10**7, reply_tokens=300, context_window=3_000),
        context_policy=[policy, KeepLastTurns(1)] if helped else policy,
    ).subscribe(events.append)
    result = agent.run_sync("Read the document.")
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=events)
    assert len(result.messages) == 1 + 2 * min(pages, result.turns) + (result.output == "Done.")
    for request in model.requests:
        assert transcript_problems(request.messages) == []
        assert UserMessage(content="Read the document.") in request.messages
    assert sum(isinstance(e, ModelRequested) for e in events) == len(model.requests)


def _noting(value: Any) -> Table:
    def note(step: Any) -> None:
        step.notes["f"] = value

    return once("NOTE", note, mark="f")


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), unclean_text(nul=False), st.text())
_JSON_WITH_UNCLEAN_TEXT = st.one_of(
    _SCALARS,
    st.lists(_SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=3), st.lists(_SCALARS, max_size=3) | _SCALARS, max_size=3),
)
"""JSON values two levels deep at most (hypothesis 6.128's ``st.recursive`` could raise
``LimitReached`` out of a draw)."""


@SHARE
@given(value=_JSON_WITH_UNCLEAN_TEXT)
def test_notes_with_unclean_text_are_checkpointed_clean(value: Any) -> None:
    store = MemoryStore()  # a durable store: every transition is encoded as UTF-8 JSON
    agent = Agent(model=ScriptedModel(["Done."]), table=_noting(value), store=store)
    result = agent.run_sync("Go.")
    assert result.output == "Done."
    kept = store.load(result.run_id).notes["f"]
    str(kept).encode()  # raises UnicodeEncodeError on a lone surrogate left anywhere


@SHARE
@given(bad=unclean_text())
def test_an_id_no_store_can_keep_is_refused_up_front(bad: str) -> None:
    agent = Agent(model=ScriptedModel(["Done."]), store=MemoryStore())
    with pytest.raises(ConfigError, match="run id"):
        agent.start("Go.", run_id=bad)
    assert agent.checkpoints.list_runs() == []


_CATASTROPHIC = ["(a+)+$", "(a|a)*$", "(a|aa)+$", "^(a+)+b", "(\\w+\\s?)+$", "([a-z]*)*$"]
"""Patterns Python's ``re`` takes exponential time to reject near-misses with."""


@SHARE
@given(
    pattern=st.sampled_from(_CATASTROPHIC),
    keyword=st.sampled_from(["pattern", "propertyNames", "patternProperties"]),
    length=st.integers(20, 10_000),
    tail=st.sampled_from(["!", "b", " !", ""]),
)
def test_a_backtracking_pattern_never_holds_a_run(
    pattern: str, keyword: str, length: int, tail: str
) -> None:
    """Whatever pattern, keyword and near-miss: the call is answered and the run ends as
    its script says (on Python's ``re`` the first of these took seconds at 28 characters,
    four times more per two characters more)."""
    text = "a" * length + tail
    if keyword == "pattern":
        parameters = {
            "type": "object",
            "properties": {"value": {"type": "string", "pattern": pattern}},
            "required": ["value"],
        }
        arguments = {"value": text}
    elif keyword == "propertyNames":
        parameters = {"type": "object", "propertyNames": {"pattern": pattern}}
        arguments = {text: 1}
    else:
        parameters = {
            "type": "object",
            "patternProperties": {pattern: {"type": "integer"}},
        }
        arguments = {text: "not an integer"}

    def take(**values: Any) -> str:
        return "taken"

    hostile = tool(take, name="take", description="Take a value.", parameters=parameters)
    model = ScriptedModel([reply("", call("take", **arguments)), "Done."])
    agent = Agent(model=model, tools=[hostile], limits=Limits(max_turns=4))
    result = agent.run_sync("Take it.")
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    assert result.output == "Done."
    (answer,) = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert answer.content  # answered, valid or not


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


_LISTED_NAMES = st.sampled_from(
    ["ask_user", "finish_task", "final_result", "lookup", "lookup", "x" * 70, "bad name!", "é"]
)
_LISTED_SCHEMAS = st.sampled_from(
    [
        {"type": "object", "properties": {"q": {"type": "string"}}},
        {"type": "object", "properties": {"q": {"type": "string", "pattern": "(a+)+$"}}},
        {"type": "object", "properties": {"q": {"type": "string", "pattern": "(?=a)a"}}},
        {"type": "string"},
        {"type": "object", "properties": {"q": {"$ref": "#/$defs/missing"}}},
        {"$ref": "#"},
        _deep(100),
        {"type": "object", "additionalProperties": {"type": "nonsense"}},
    ]
)


@SHARE
@given(
    listing=st.lists(
        st.tuples(_LISTED_NAMES, _LISTED_SCHEMAS, st.none() | _LISTED_SCHEMAS), max_size=8
    ),
    prefix=st.sampled_from(["", "srv_"]),
)
def test_a_hostile_mcp_listing_costs_only_its_bad_tools(
    listing: list[tuple[str, Any, Any]], prefix: str
) -> None:
    """Control-tool names, clashing and unsafe names, non-object, dangling, looping, deep
    and backtracking schemas: each listed tool becomes a Tool or a reason it is skipped,
    never an exception, and what is offered makes an agent."""
    offered: dict[str, str] = {}
    tools: list[Tool] = []
    for remote, input_schema, output_schema in listing:
        name, made = offer_listed(
            remote, f"{remote}, listed", input_schema, output_schema, prefix=prefix, taken=offered
        )
        if isinstance(made, str):
            assert made  # the reason it is skipped
            continue
        assert name not in offered
        assert name not in ("ask_user", "finish_task", "final_result")
        offered[name] = remote
        tools.append(made)
    Agent(model=ScriptedModel([]), tools=tools)  # builds: every offered tool is valid
