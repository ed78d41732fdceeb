"""Hypothesis strategies for misbehaving models and tools: the generator behind the harness.

Import this module only where hypothesis is installed (the ``testing`` or ``dev`` extra); with
``hypothesis-jsonschema`` it is the one place in the package that imports hypothesis.

A generated *behaviour* (``Behaviour``) is a list of script items (replies, exceptions,
garbage) that a model plays in order, optionally cycling forever, so "the same call forever"
and periodic patterns are as likely as one-off mistakes, plus what each tool does when called.
The strategies compose, and can be focused on one agent:

- ``replies_for(agent)``: replies whose tool calls target the agent's real tools, with valid
  arguments drawn from each tool's own JSON Schema, invalid and malformed arguments, unknown
  tools and control-flow calls; text, empty, truncated and filtered replies; model errors.
- ``model_errors()``, ``usages()``, ``edge_replies()``: the pieces, for your own strategies.
- ``repetitions(steps)``: one step forever, or a short cycle of steps forever.
- ``tool_outcomes()`` / ``tool_behaviours(names)``: success, exception, timeout, huge output.
- ``behaviours_for(agent)``: all of the above, as ``assert_terminates`` uses it.
- ``limits()``, ``context_policies()``, ``transcripts()``: limits (context windows among
  them, from roomy to smaller than one huge tool result), context policies and valid
  transcripts of every turn shape, for window pressure.
- ``cooperative_behaviours_for(agent)``: a model that mostly does its job (valid calls to
  every tool, ``ask_user``, answers), so that runs reach pauses, approvals and long tool turns;
  the stateful machine plays these two times in three.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from agent_fsm.agent import Agent
from agent_fsm.compaction import ClearToolResults, ContextPolicy, KeepLastTurns, Summarize
from agent_fsm.limits import Limits
from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    Message,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from agent_fsm.models.base import ModelCallError
from agent_fsm.testing.behaviour import (
    EDGE_REPLIES,
    GARBAGE,
    MALFORMED_ARGUMENTS,
    TEXTS,
    TOOL_OUTCOME_KINDS,
    Behaviour,
    BehaviourModel,
    Catalogue,
    ToolOutcome,
    UnreadableError,
    example_arguments,
    invalid_argument_texts,
    user_tools,
)
from agent_fsm.testing.models import reply
from agent_fsm.tools.patterns import schema_validator
from agent_fsm.tools.tool import ASK_USER, FINISH_TASK

__all__ = [
    "edge_behaviours",
    "Behaviour",
    "BehaviourModel",
    # focused on one agent
    "behaviours_for",
    "cooperative_behaviours_for",
    "cooperative_replies_for",
    "window_pressure_for",
    "replies_for",
    "tool_calls_for",
    "arguments_for",
    "invalid_arguments_for",
    # the pieces
    "edge_replies",
    "model_errors",
    "repetitions",
    "tool_behaviours",
    "tool_outcomes",
    "usages",
    # by tool name (agent_fsm's own property tests)
    "behaviours",
    "context_policies",
    "limits",
    "transcripts",
    "replies",
    "tool_calls",
]


def _json_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(), st.booleans(), st.integers(-5, 5), st.sampled_from(["", "a", "same"])
    )


def tool_calls(tool_names: Sequence[str]) -> st.SearchStrategy[ToolCall]:
    """Valid, invalid and malformed calls to the given tools, to unknown tools, and to the
    control-flow tools (``ask_user``, ``finish_task``) with good or bad arguments."""
    known = st.sampled_from(list(tool_names)) if tool_names else st.just("missing")
    arguments = st.dictionaries(
        st.sampled_from(["text", "a", "b", "x"]), _json_values(), max_size=3
    )
    well_formed = st.builds(
        lambda name, args: ToolCall(id="", name=name, arguments=json.dumps(args)),
        known,
        arguments,
    )
    valid_echo = st.builds(
        lambda text: ToolCall(id="", name="echo", arguments=json.dumps({"text": text})),
        st.sampled_from(["a", "b", "c", "same"]),
    )
    malformed = st.builds(
        lambda name, raw: ToolCall(id="", name=name, arguments=raw),
        known,
        st.sampled_from(["{", "[1, 2]", "not json", '{"text": }', "", "null"]),
    )
    unknown = st.builds(
        lambda name: ToolCall(id="", name=name, arguments="{}"),
        st.sampled_from(["nope", "Echo", "finish", "ask-user"]),
    )
    valid_control = st.one_of(
        st.builds(
            lambda q: ToolCall(id="", name="ask_user", arguments=json.dumps({"question": q})),
            st.sampled_from(["Which city?", "q?"]),
        ),
        st.builds(
            lambda s: ToolCall(id="", name="finish_task", arguments=json.dumps({"summary": s})),
            st.sampled_from(["done", ""]),
        ),
    )
    invalid_control = st.builds(
        lambda name, args: ToolCall(id="", name=name, arguments=json.dumps(args)),
        st.sampled_from(["ask_user", "finish_task"]),
        st.sampled_from([{}, {"question": 3}, {"summary": None}, {"question": ""}]),
    )
    duplicate_id = st.builds(
        lambda name: ToolCall(id="dup", name=name, arguments='{"text": "d"}'), known
    )
    return st.one_of(
        valid_echo, well_formed, malformed, unknown, valid_control, invalid_control, duplicate_id
    )


def usages() -> st.SearchStrategy[Usage | None]:
    """Reported usage: none (the engine estimates), plausible, or absurd (up to 2**64)."""
    return st.one_of(
        st.none(),
        st.builds(
            lambda i, o: Usage(input_tokens=i, output_tokens=o, requests=1),
            st.integers(0, 2_000),
            st.integers(0, 500),
        ),
        st.builds(  # absurd values, up to what a broken proxy reports (past SQLite's INTEGER)
            lambda i, o: Usage(input_tokens=i, output_tokens=o, requests=1),
            st.one_of(st.integers(0, 10**9), st.just(2**63)),
            st.one_of(st.integers(0, 10**9), st.just(2**64)),
        ),
    )


def model_errors(*, retry_after: bool = False) -> st.SearchStrategy[BaseException]:
    """What a model call may raise: transient and permanent ``ModelCallError``s, timeouts,
    dropped connections and adapter bugs. With ``retry_after``, some errors carry a server
    Retry-After of up to 30 s: only for runs on a ``FakeClock``, or they really wait."""
    delays = st.sampled_from([None, 0.0, 1.0, 30.0]) if retry_after else st.just(None)
    return st.one_of(
        st.builds(
            lambda transient, after: ModelCallError(
                "server said no", transient=transient, retry_after_s=after
            ),
            st.booleans(),
            delays,
        ),
        st.just(TimeoutError("read timed out")),
        st.just(ConnectionError("connection reset")),
        st.just(RuntimeError("adapter bug")),
        # what no `except Exception` catches, raised by the model of its own accord
        st.sampled_from([SystemExit, GeneratorExit, asyncio.CancelledError]).map(lambda e: e()),
        st.just(UnreadableError()),
    )


def edge_replies() -> st.SearchStrategy[ModelResponse]:
    """Replies at the edges: empty, truncated (``length``, also mid tool call), withheld by
    the content filter, and refused by the model."""
    return st.sampled_from(EDGE_REPLIES)


def _reply_steps(
    calls: st.SearchStrategy[ToolCall], *, retry_after: bool = False
) -> st.SearchStrategy[object]:
    text = st.sampled_from(TEXTS)
    plain = st.builds(
        lambda t, reason, usage: reply(t, finish_reason=reason, usage=usage),
        text,
        st.sampled_from(list(FinishReason)),
        usages(),
    )
    with_calls = st.builds(
        lambda t, found, reason, usage: reply(t, *found, finish_reason=reason, usage=usage),
        text,
        st.lists(calls, min_size=1, max_size=4),
        st.sampled_from(
            [FinishReason.TOOL_CALLS, *(r for r in FinishReason if r.name != "TOOL_CALLS")]
        ),
        usages(),
    )
    return st.one_of(
        with_calls,
        with_calls,
        plain,
        edge_replies(),
        model_errors(retry_after=retry_after),
        st.sampled_from(GARBAGE),
    )


def replies(tool_names: Sequence[str]) -> st.SearchStrategy[object]:
    """One model behaviour step: a reply, an exception to raise, or garbage."""
    return _reply_steps(tool_calls(tool_names))


def _specs(target: Agent | Sequence[ToolSpec]) -> tuple[ToolSpec, ...]:
    return target.registry.specs if isinstance(target, Agent) else tuple(target)


def _values(schema: Any) -> st.SearchStrategy[Any]:
    """Values of a JSON Schema. Objects are composed here, property by property, and every
    other schema is left to hypothesis-jsonschema: its own object generation fails with
    recent hypothesis releases (``'many' object has no attribute 'more'``)."""
    if not isinstance(schema, dict):
        return st.just(None)
    simple_object = schema.get("type") == "object" and not (
        set(schema) & {"patternProperties", "dependentRequired", "dependentSchemas",
                       "minProperties", "maxProperties", "propertyNames", "if", "not",
                       "allOf", "anyOf", "oneOf", "$ref", "unevaluatedProperties"}
    )  # fmt: skip
    if simple_object:
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        return st.fixed_dictionaries(
            {name: _values(properties.get(name, {})) for name in sorted(required)},
            optional={n: _values(p) for n, p in properties.items() if n not in required},
        )
    try:
        return from_schema(schema)
    except Exception:  # a schema it cannot handle (e.g. a $ref out of reach): one example
        return st.just(example_arguments(schema))


@lru_cache(maxsize=256)
def _arguments(schema_json: str) -> st.SearchStrategy[str]:
    schema = json.loads(schema_json)
    validator = schema_validator(schema)
    example = example_arguments(schema)
    generated = _values(schema).filter(validator.is_valid).map(json.dumps)
    if validator.is_valid(example):
        return st.one_of(st.just(json.dumps(example)), generated)
    return generated


def arguments_for(spec: ToolSpec) -> st.SearchStrategy[str]:
    """Argument text that is valid for the tool's own JSON Schema (via hypothesis-jsonschema,
    and checked with the schema's validator)."""
    return _arguments(json.dumps(spec.parameters, sort_keys=True))


def invalid_arguments_for(spec: ToolSpec) -> st.SearchStrategy[str]:
    """JSON objects the tool's schema rejects: missing required arguments, wrong types,
    unexpected names (nothing, for a schema that accepts every object)."""
    invalid = invalid_argument_texts(spec.parameters)
    return st.sampled_from(invalid) if invalid else st.nothing()


def tool_calls_for(target: Agent | Sequence[ToolSpec]) -> st.SearchStrategy[ToolCall]:
    """Calls to an agent's tools (control-flow tools included): valid arguments from each
    schema, invalid and malformed arguments, unknown tools, duplicate call ids."""
    specs = _specs(target)
    names = [spec.name for spec in specs] or ["missing"]

    def to(name: str) -> Any:
        return lambda arguments: ToolCall(id="", name=name, arguments=arguments)

    valid = [arguments_for(spec).map(to(spec.name)) for spec in specs]
    invalid = [invalid_arguments_for(spec).map(to(spec.name)) for spec in specs]
    malformed = st.builds(
        lambda name, raw: ToolCall(id="", name=name, arguments=raw),
        st.sampled_from(names),
        st.sampled_from(MALFORMED_ARGUMENTS),
    )
    unknown = st.builds(
        lambda name: ToolCall(id="", name=name, arguments="{}"),
        st.sampled_from(["nope", names[0].upper(), "finish", "ask-user"]),
    )
    duplicate_id = st.builds(
        lambda call: call.model_copy(update={"id": "dup"}),
        st.one_of(*valid) if valid else unknown,
    )
    parts = [*valid, *valid, *invalid, malformed, unknown, duplicate_id]
    return st.one_of(*parts)


def replies_for(
    target: Agent | Sequence[ToolSpec], *, retry_after: bool = True
) -> st.SearchStrategy[object]:
    """One model step focused on an agent's real tools (``agent.registry.specs``): a reply,
    an exception to raise, or garbage that is not a reply at all. ``retry_after`` as in
    ``model_errors`` (on by default: the harness runs on a ``FakeClock``)."""
    return _reply_steps(tool_calls_for(target), retry_after=retry_after)


def repetitions(steps: st.SearchStrategy[object]) -> st.SearchStrategy[Behaviour]:
    """Endless behaviours: the same step forever, or a short cycle (period 2 to 4) forever."""
    return st.one_of(
        steps.map(lambda step: Behaviour(steps=(step,), cycle=True)),
        st.lists(steps, min_size=2, max_size=4).map(
            lambda cycle: Behaviour(steps=tuple(cycle), cycle=True)
        ),
    )


def tool_outcomes() -> st.SearchStrategy[ToolOutcome]:
    """What one tool call does: run for real, return text, raise, time out, or return a
    large output (2,000 to 200,000 characters: pressure on a context window)."""
    return st.one_of(*(st.sampled_from(kind) for kind in TOOL_OUTCOME_KINDS))


def tool_behaviours(
    tool_names: Sequence[str],
) -> st.SearchStrategy[tuple[tuple[str, tuple[ToolOutcome, ...]], ...]]:
    """For some of the tools, the outcomes their calls play in turn (cycling)."""
    if not tool_names:
        return st.just(())
    return st.dictionaries(
        st.sampled_from(list(tool_names)),
        st.lists(tool_outcomes(), min_size=1, max_size=3).map(tuple),
        max_size=len(tool_names),
    ).map(lambda found: tuple(sorted(found.items())))


def behaviours(tool_names: Sequence[str]) -> st.SearchStrategy[Behaviour]:
    """Finite or endlessly repeating model behaviours, sometimes aborted mid-run."""
    return st.builds(
        Behaviour,
        st.lists(replies(tool_names), min_size=1, max_size=12).map(tuple),
        st.booleans(),
        st.one_of(st.none(), st.integers(1, 8)),
    )


def behaviours_for(
    agent: Agent, *, tool_failures: bool = True, max_steps: int = 12
) -> st.SearchStrategy[Behaviour]:
    """Behaviours focused on ``agent``: finite scripts of one to ``max_steps`` steps, scripts
    cycled forever, one step forever and short cycles, of the steps ``replies_for(agent)``
    makes, with misbehaving tool doubles unless ``tool_failures`` is False. Never aborted
    (aborting is the caller's act, not the model's).

    Each behaviour is drawn as one record of bytes that the agent's ``Catalogue`` reads: a
    fifth of the cost of composing ``replies_for`` steps, and it shrinks as well. An agent
    with a tool whose schema defeats the catalogue's argument variants (no candidate is
    valid) gets the composed strategies, with arguments from hypothesis-jsonschema.
    """
    catalogue = _catalogue(agent, tool_failures, max_steps)
    if catalogue is not None:
        return _read(catalogue)
    steps = replies_for(agent)
    scripts = st.builds(
        Behaviour, st.lists(steps, min_size=1, max_size=max_steps).map(tuple), st.booleans()
    )
    models = st.one_of(scripts, repetitions(steps))
    if not tool_failures:
        return models
    names = [t.name for t in user_tools(agent)]
    return st.builds(
        lambda behaviour, tools: Behaviour(
            steps=behaviour.steps, cycle=behaviour.cycle, tools=tools
        ),
        models,
        tool_behaviours(names),
    )


def batches_for(
    agent: Agent, size: int, *, tool_failures: bool = True, max_steps: int = 12
) -> st.SearchStrategy[list[Behaviour]] | None:
    """Up to ``size`` different behaviours of ``behaviours_for(agent)`` at a time (``size``
    but for records drawn alike, which are played once): what ``assert_terminates`` plays per
    hypothesis example. None for an agent whose tool schemas defeat its ``Catalogue``.

    The records are drawn as one value of bytes, not as a list of them. A list would cost a
    choice per element, and hypothesis mutates a list by copying one element over another:
    most of a search would replay behaviours it had already played."""
    catalogue = _catalogue(agent, tool_failures, max_steps)
    return _read_batch(catalogue, size) if catalogue is not None else None


def _catalogue(agent: Agent, tool_failures: bool, max_steps: int) -> Catalogue | None:
    """The agent's catalogue, or None when a tool's schema defeats its argument variants."""
    names = [t.name for t in user_tools(agent)] if tool_failures else []
    catalogue = Catalogue(agent.registry.specs, names, max_steps=max_steps)
    return catalogue if catalogue.complete else None


@st.composite
def _read(draw: st.DrawFn, catalogue: Catalogue) -> Behaviour:
    """A behaviour of ``catalogue``, from one drawn record. (Composite rather than mapped or
    built: hypothesis then shows a failing case as the Behaviour, not as the bytes.)"""
    size = catalogue.record_size
    return catalogue.read(draw(st.binary(min_size=size, max_size=size)))


@st.composite
def _read_batch(draw: st.DrawFn, catalogue: Catalogue, size: int) -> list[Behaviour]:
    """Up to ``size`` behaviours of ``catalogue``, from ``size`` records drawn as one value."""
    length = catalogue.record_size * size
    return catalogue.read_batch(draw(st.binary(min_size=length, max_size=length)))


def edge_behaviours(agent: Agent) -> list[Behaviour]:
    """Behaviours every run of the harness tries first, whatever hypothesis draws: each
    control tool of ``agent`` called in the first turn, and again in the last turn the limits
    allow (after turns whose only call names an unknown tool, which the run answers with an
    error and goes on). Where a control call meets the turn limit is where guard priority
    matters most, and a random search can miss that one turn."""
    control = [name for name in (ASK_USER.name, FINISH_TASK.name) if name in agent.registry]
    if not control:
        return []
    limits = agent.limits
    last = min(limits.max_turns, limits.max_consecutive_errors)
    arguments = {ASK_USER.name: {"question": "Which one?"}, FINISH_TASK.name: {"summary": "Done."}}
    unknown = reply("", ToolCall(id="", name="no_such_tool", arguments="{}"))
    found: list[Behaviour] = []
    for name in control:
        finishing = reply("", ToolCall(id="", name=name, arguments=json.dumps(arguments[name])))
        for turn in sorted({1, last}):
            found.append(Behaviour(steps=(*[unknown] * (turn - 1), finishing), cycle=False))
    return found


def cooperative_replies_for(target: Agent | Sequence[ToolSpec]) -> st.SearchStrategy[object]:
    """One step of a model that mostly does its job: in three cases out of six a reply with
    one to three valid calls, in two a text answer, else a transient error, garbage or an
    edge reply. Each of the agent's own tools is called twice as often as ``ask_user`` or
    ``finish_task``, so that runs go on for several turns and still pause often."""
    specs = _specs(target)
    control = {ASK_USER.name, FINISH_TASK.name}

    def to(name: str) -> Any:
        return lambda arguments: ToolCall(id="", name=name, arguments=arguments)

    def calls(chosen: list[ToolSpec]) -> list[st.SearchStrategy[ToolCall]]:
        return [arguments_for(spec).map(to(spec.name)) for spec in chosen]

    own = calls([spec for spec in specs if spec.name not in control])
    flow = calls([spec for spec in specs if spec.name in control])
    answer = st.builds(reply, st.sampled_from(["Done.", "The answer is 4."]))
    if not own and not flow:
        return answer
    valid = st.one_of(*own, *own, *flow) if own else st.one_of(*flow)
    with_calls = st.builds(
        lambda text, found: reply(text, *found),
        st.sampled_from(["", "Let me check."]),
        st.lists(valid, min_size=1, max_size=3),
    )
    hiccup = st.one_of(
        st.just(ModelCallError("overloaded", transient=True)), edge_replies(), st.just(None)
    )
    return st.one_of(with_calls, with_calls, with_calls, answer, answer, hiccup)


def cooperative_behaviours_for(
    agent: Agent, *, tool_failures: bool = True, max_steps: int = 12
) -> st.SearchStrategy[Behaviour]:
    """Endless cycles of one to ``max_steps`` steps of ``cooperative_replies_for(agent)``
    (a cooperative model does not run out of replies), with tool doubles that may misbehave
    unless ``tool_failures`` is False."""
    steps = cooperative_replies_for(agent)
    models = st.lists(steps, min_size=1, max_size=max_steps).map(
        lambda found: Behaviour(steps=tuple(found), cycle=True)
    )
    if not tool_failures:
        return models
    names = [t.name for t in user_tools(agent)]
    return st.builds(
        lambda behaviour, tools: replace(behaviour, tools=tools), models, tool_behaviours(names)
    )


def window_pressure_for(agent: Agent, *, max_steps: int = 10) -> st.SearchStrategy[Behaviour]:
    """A model that keeps calling the agent's own tools (one to three valid calls a turn,
    then an answer) while every call returns a large output (1,000 to 20,000 characters), so
    the prompt outgrows a context window within a few turns and the agent's context policies
    must keep it inside; ``assert_terminates`` mixes these in for an agent with a
    ``context_window``."""
    specs = [spec for spec in _specs(agent) if spec.name not in (ASK_USER.name, FINISH_TASK.name)]
    if not specs:
        return cooperative_behaviours_for(agent)

    def calls_to(name: str) -> st.SearchStrategy[ToolCall]:
        spec = next(spec for spec in specs if spec.name == name)
        return arguments_for(spec).map(lambda found: ToolCall(id="", name=name, arguments=found))

    valid = st.one_of(*(calls_to(spec.name) for spec in specs))
    turn = st.builds(
        lambda text, found: reply(text, *found),
        st.sampled_from(["", "Reading the results."]),  # text: a summary call's answer too
        st.lists(valid, min_size=1, max_size=3),
    )
    large = st.builds(
        ToolOutcome, st.just("huge"), st.sampled_from(["x", "y"]), st.integers(1_000, 20_000)
    )
    outcomes = st.tuples(*(st.lists(large, min_size=2, max_size=4).map(tuple) for _ in specs))
    return st.builds(
        lambda steps, found: Behaviour(
            steps=(*steps, reply("Done.")),
            cycle=False,
            tools=tuple(zip((spec.name for spec in specs), found, strict=True)),
        ),
        st.lists(turn, min_size=2, max_size=max_steps),
        outcomes,
    )


def limits(**fixed: Any) -> st.SearchStrategy[Limits]:
    """Arbitrary valid limits, retry budgets included (zero retry backoff and no wait for a
    Retry-After, so runs never sleep), with no context window or one from far smaller than a
    huge tool result to roomy (``reply_tokens`` always below it), with and without a last
    answer when a limit ends the run."""
    return st.builds(
        lambda turns, budget, errors, k, p, detect, timeout, retries, run_retries, window, last: (
            Limits(
                **{
                    "max_turns": turns,
                    "token_budget": budget,
                    "max_consecutive_errors": errors,
                    "loop_threshold": k,
                    "loop_max_period": p,
                    "loop_detection": detect,
                    "timeout_s": timeout,
                    "model_retries": retries,
                    "model_retries_per_run": run_retries,
                    "retry_backoff_s": 0.0,
                    "retry_backoff_max_s": 0.0,
                    "retry_after_max_s": 0.0,
                    "context_window": window[0],
                    "reply_tokens": window[1],
                    "last_answer": last,
                    **fixed,
                }
            )
        ),
        st.integers(1, 25),
        st.one_of(st.integers(1, 400), st.integers(400, 10**7)),
        st.integers(1, 5),
        st.integers(2, 5),
        st.integers(0, 5),
        st.booleans(),
        st.one_of(st.just(1e9), st.floats(1.0, 200.0)),
        st.integers(0, 6),
        st.integers(0, 12),
        _windows(),
        st.booleans(),
    )


def _windows() -> st.SearchStrategy[tuple[int | None, int]]:
    """(context_window, reply_tokens): none, or a window with room left for a reply."""
    return st.one_of(
        st.just((None, 1_024)),
        st.integers(60, 60_000).flatmap(
            lambda window: st.tuples(st.just(window), st.integers(0, min(window - 1, 2_000)))
        ),
    )


def context_policies() -> st.SearchStrategy[list[ContextPolicy]]:
    """Zero to three of the built-in context policies, in any order and with any settings
    (``Summarize`` asks the agent's own model, so under a generated behaviour the summary may
    be a tool call, empty, or an error)."""
    policy: st.SearchStrategy[ContextPolicy] = st.one_of(
        st.builds(KeepLastTurns, st.integers(1, 4)),
        st.builds(ClearToolResults, st.integers(0, 3), st.integers(0, 300)),
        st.builds(Summarize, st.integers(1, 3)),
    )
    return st.lists(policy, max_size=3)


def _sized_text(prefix: str) -> st.SearchStrategy[str]:
    """Text from empty to ~2,000 tokens, cheap to generate (a repeated character)."""
    return st.integers(0, 8_000).map(lambda size: prefix + "x" * size)


@st.composite
def transcripts(draw: st.DrawFn, *, max_turns: int = 8) -> list[Message]:
    """Valid transcripts of every turn shape: an optional system prompt, then turns of one or
    more user messages, an assistant reply with zero to three tool calls, and their results
    in order, ending with the user's latest input (the turn to come)."""
    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(SystemMessage(content=draw(_sized_text("system "))))
    for turn in range(draw(st.integers(0, max_turns))):
        if turn == 0 or draw(st.integers(0, 3)) == 0:
            for _ in range(draw(st.integers(1, 2))):
                messages.append(UserMessage(content=draw(_sized_text("user "))))
        calls = tuple(
            ToolCall(id=f"c{turn}_{n}", name="echo", arguments=json.dumps({"text": "x" * size}))
            for n, size in enumerate(draw(st.lists(st.integers(0, 400), max_size=3)))
        )
        messages.append(AssistantMessage(content=draw(_sized_text("reply ")), tool_calls=calls))
        for one in calls:
            messages.append(
                ToolMessage(tool_call_id=one.id, name=one.name, content=draw(_sized_text("out ")))
            )
    messages.append(UserMessage(content=draw(_sized_text("latest "))))
    return messages
