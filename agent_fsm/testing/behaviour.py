"""What the harness plays against an agent, without hypothesis: model behaviours, tool doubles
and a fake clock.

A ``Behaviour`` is a list of script items (replies, exceptions to raise, garbage) that a
``BehaviourModel`` plays in order, optionally cycling forever, plus what each tool does when
it is called (``ToolOutcome``). Hypothesis generates them (``strategies.py``), reading two
drawn values with a ``Catalogue`` of what misbehaviour is made of (below); the bounded
exhaustive checker enumerates them (``exhaustive.py``); both play them through ``harness.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from agent_fsm.errors import ConfigError
from agent_fsm.limits import Limits
from agent_fsm.messages import (
    FinishReason,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    Usage,
)
from agent_fsm.models.base import ModelCallError
from agent_fsm.testing.models import reply
from agent_fsm.tools.patterns import schema_validator
from agent_fsm.tools.results import ToolResult
from agent_fsm.tools.tool import Tool

if TYPE_CHECKING:
    from agent_fsm.agent import Agent

__all__ = [
    "Behaviour",
    "BehaviourModel",
    "Catalogue",
    "FakeClock",
    "ToolOutcome",
    "UnreadableError",
    "example_arguments",
    "play_outcome",
    "tool_double",
    "user_tools",
    "with_tool_doubles",
]

ToolOutcomeKind = Literal["real", "returns", "raises", "exits", "timeout", "huge"]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one call of a tool double does. Its ``repr`` is the Python source that builds it.

    kinds: ``real`` runs the real tool (a sync one inline, not in a worker thread);
    ``returns`` returns ``text``; ``raises`` raises ``RuntimeError(text)``; ``exits`` raises
    what no ``except Exception`` catches, named by ``text`` (``SystemExit``,
    ``GeneratorExit``, ``CancelledError``, or ``unreadable``: an ``UnreadableError``);
    ``timeout`` raises an error result worded exactly as the tool runtime answers a call that
    ran past its timeout (without waiting for it); ``huge`` returns ``text`` (``"x"`` if
    empty) repeated ``size`` times.
    """

    kind: ToolOutcomeKind
    text: str = ""
    size: int = 0


@dataclass(frozen=True)
class Behaviour:
    """A model behaviour: ``steps`` played in order, then cycled forever if ``cycle``."""

    steps: tuple[object, ...]
    cycle: bool
    abort_at_turn: int | None = None
    """Abort the run from inside the model call of this turn (None: never)."""
    tools: tuple[tuple[str, tuple[ToolOutcome, ...]], ...] = ()
    """Tool doubles: (tool name, outcomes cycled call by call); unnamed tools run for real."""


EXHAUSTED = ModelCallError("behaviour exhausted", transient=False)
"""What a finite behaviour raises once its steps are used up (like an exhausted script)."""


class BehaviourModel:
    """Plays a Behaviour; aborts its run at ``abort_at_turn`` through ``on_abort``.

    ``played`` holds what each request got, in order (``EXHAUSTED`` past a finite script).
    """

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.requests: list[ModelRequest] = []
        self.played: list[object] = []
        self.aborted_at: int | None = None
        self.on_abort: Any = None

    @property
    def name(self) -> str:
        return "behaviour"

    async def request(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        index = len(self.requests) - 1
        behaviour = self.behaviour
        if behaviour.abort_at_turn == request.turn and self.on_abort is not None:
            self.aborted_at = index + 1
            self.on_abort("aborted by the test")
        steps = behaviour.steps
        step = (
            EXHAUSTED
            if not steps or (index >= len(steps) and not behaviour.cycle)
            else steps[index % len(steps)]
        )
        self.played.append(step)
        if isinstance(step, BaseException):
            raise step
        return step  # type: ignore[return-value]  # garbage is part of the behaviour


class FakeClock:
    """A clock that moves only when the run sleeps: ``agent.replace(clock=c, sleep=c.sleep)``.

    Retry backoff then costs no real time, and time limits still trip deterministically.
    """

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(seconds, 0.0)


class UnreadableError(Exception):
    """An exception whose message cannot be read (its ``__str__`` raises), as hostile or
    careless code raises: the engine must report it, not fail while reporting it."""

    def __str__(self) -> str:
        raise RuntimeError("this exception has no readable message")

    def __repr__(self) -> str:
        return "UnreadableError()"


_EXITS: dict[str, type[BaseException]] = {
    "SystemExit": SystemExit,
    "GeneratorExit": GeneratorExit,
    "CancelledError": asyncio.CancelledError,
}
"""What an ``exits`` outcome raises, by name (any other name: ``UnreadableError``)."""


async def play_outcome(tool: Tool, outcome: ToolOutcome, arguments: dict[str, Any]) -> Any:
    """What a tool double does for ``outcome``: return its text, raise, exit, answer as timed
    out, return a huge output, or call the real ``tool`` with ``arguments``."""
    if outcome.kind == "returns":
        return outcome.text
    if outcome.kind == "raises":
        raise RuntimeError(outcome.text)
    if outcome.kind == "exits":
        raise _EXITS.get(outcome.text, UnreadableError)()
    if outcome.kind == "timeout":
        # The runtime's own words for a call that ran past its time, without the wait. (A
        # TimeoutError raised *by* a tool is a failure of the tool, reported as such.)
        limit = tool.timeout_s if tool.timeout_s is not None else Limits().tool_timeout_s
        return ToolResult(output=f"Tool '{tool.name}' timed out after {limit:g} s.", is_error=True)
    if outcome.kind == "huge":
        return (outcome.text or "x") * max(outcome.size, 0)
    assert tool.fn is not None
    if tool.is_async:
        return await tool.fn(**arguments)
    # Inline, not in a worker thread: a thread per call (and per event loop) made each run
    # of the harness ten times slower. A real tool that blocks is therefore not timed out.
    return tool.fn(**arguments)


def tool_double(tool: Tool, outcomes: Sequence[ToolOutcome]) -> Tool:
    """A copy of ``tool`` (same name and schema) whose calls play ``outcomes`` in turn, cycling.

    Arguments are validated against the real schema before the double is called, exactly as
    for the real tool.
    """
    if tool.control is not None:
        raise ConfigError(f"{tool.name!r} is a control-flow tool; the engine runs it itself")
    if not outcomes:
        raise ConfigError(f"tool_double({tool.name!r}) needs at least one outcome")
    cycle = itertools.cycle(tuple(outcomes))

    async def double(**arguments: Any) -> Any:
        return await play_outcome(tool, next(cycle), arguments)

    return replace(tool, fn=double)


def user_tools(agent: Agent) -> list[Tool]:
    """The agent's own tools, in order, without the built-in control-flow tools and the
    output tool (``Agent(output_type=...)`` adds it, whatever ``tools`` says)."""
    output = agent.output_tool_name
    found = (agent.registry.get(spec.name) for spec in agent.registry.specs)
    return [t for t in found if t is not None and t.control is None and t.name != output]


def with_tool_doubles(agent: Agent, doubles: Mapping[str, Sequence[ToolOutcome]]) -> Agent:
    """A copy of ``agent`` whose tools named in ``doubles`` play the given outcomes.

    Raises:
        ConfigError: for a name that is not one of the agent's own tools.
    """
    tools = user_tools(agent)
    unknown = sorted(set(doubles) - {t.name for t in tools})
    if unknown:
        raise ConfigError(f"with_tool_doubles: the agent has no tool(s) {unknown}")
    return agent.replace(
        tools=[tool_double(t, doubles[t.name]) if t.name in doubles else t for t in tools]
    )


_TYPE_EXAMPLES: dict[str, Any] = {
    "string": "x",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "null": None,
}


def example_arguments(schema: Mapping[str, Any]) -> Any:
    """A small instance of a JSON Schema, built without hypothesis: the first enum value or
    const, else a value of the first type, with every required property of an object filled
    in. Not guaranteed to be valid for every schema (check it with the tool's validator)."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    for key in ("anyOf", "oneOf", "allOf"):
        if schema.get(key):
            return example_arguments(schema[key][0])
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = kind[0] if kind else "object"
    if kind == "object":
        properties = schema.get("properties", {})
        return {
            name: example_arguments(properties.get(name, {})) for name in schema.get("required", ())
        }
    if kind == "string":
        return "x" * max(int(schema.get("minLength", 1)), 1)
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    return _TYPE_EXAMPLES.get(kind)


# -- what generated behaviours are made of, and how bytes pick them ----------------------------

LONE_SURROGATE = "\ud83d"
"""Half a surrogate pair: text that cannot be encoded as UTF-8 (``os.listdir`` returns it for
a file name in another encoding)."""

TEXTS = ("", "ok", "thinking…", "the answer is 4", f"bad {LONE_SURROGATE}")
"""The text of a generated reply."""

GARBAGE: tuple[object, ...] = (None, 42, {"content": "a dict, not a reply"})
"""What a broken adapter returns instead of a reply."""

EDGE_REPLIES: tuple[ModelResponse, ...] = (
    reply(""),
    reply("", finish_reason=FinishReason.TOOL_CALLS),
    reply("The answer is", finish_reason=FinishReason.LENGTH),
    reply("", finish_reason=FinishReason.LENGTH),
    reply("", ToolCall(id="", name="missing", arguments='{"a": '),
          finish_reason=FinishReason.LENGTH),
    reply("", finish_reason=FinishReason.CONTENT_FILTER),
    reply("partial", finish_reason=FinishReason.CONTENT_FILTER),
    reply("I can't help with that.", finish_reason=FinishReason.REFUSAL),
    reply("", finish_reason=FinishReason.REFUSAL),
)  # fmt: skip
"""Replies at the edges: empty, truncated (``length``, also mid tool call), withheld by the
content filter, and refused by the model."""

TOOL_OUTCOME_KINDS: tuple[tuple[ToolOutcome, ...], ...] = (
    (ToolOutcome("real"),),
    tuple(ToolOutcome("returns", text) for text in ("", "ok", "same", "{}")),
    tuple(ToolOutcome("raises", text) for text in ("boom", "permission denied")),
    tuple(
        ToolOutcome("exits", name)
        for name in ("SystemExit", "GeneratorExit", "CancelledError", "unreadable")
    ),
    (ToolOutcome("returns", f"report{LONE_SURROGATE}.txt"),),
    (ToolOutcome("timeout"),),
    tuple(ToolOutcome("huge", "x", size) for size in (2_000, 10_000, 200_000)),
)
"""What one tool call does, by kind: run for real, return text, raise, exit (what no
``except Exception`` catches), return a lone surrogate, time out, or return a large output
(pressure on a context window)."""

MALFORMED_ARGUMENTS = ("{", "[1, 2]", "not json", '{"a": }', "", "null", '"text"')
"""Argument text that is no JSON object."""


def model_error_kinds(*, retry_after: bool) -> tuple[tuple[Callable[[], BaseException], ...], ...]:
    """What a model call may raise, by kind, as factories (an exception is raised afresh in
    each run): transient and permanent ``ModelCallError``s (with a server Retry-After of up
    to 30 s when ``retry_after``: only for runs on a ``FakeClock``), timeouts, dropped
    connections, adapter bugs, what no ``except Exception`` catches, and an exception whose
    message cannot be read."""
    delays = (None, 0.0, 1.0, 30.0) if retry_after else (None,)
    return (
        tuple(
            partial(ModelCallError, "server said no", transient=transient, retry_after_s=delay)
            for transient in (True, False)
            for delay in delays
        ),
        (partial(TimeoutError, "read timed out"),),
        (partial(ConnectionError, "connection reset"),),
        (partial(RuntimeError, "adapter bug"),),
        (SystemExit, GeneratorExit, asyncio.CancelledError),
        (UnreadableError,),
    )


_TELLING_VALUES: dict[str, tuple[Any, ...]] = {
    "string": ("", "Beijing", "Zürich", "東京", "two\nlines", "x" * 2_000, LONE_SURROGATE),
    "integer": (0, 1, -1, 2.0, 10**6, -(2**63), 2**64),
    "number": (0, 0.5, -1.5, 7, 1e300),
    "boolean": (True, False),
    "null": (None,),
    "object": ({},),
}
"""Values of each JSON type that tend to find bugs: empty, non-ASCII, long, a lone surrogate,
huge and negative numbers, and ``2.0``, which JSON Schema's ``integer`` accepts."""


def _telling_values(schema: Any) -> list[Any]:
    """Candidate values for one property (not all valid: the caller validates)."""
    if not isinstance(schema, dict):
        return []
    values: list[Any] = [*schema.get("enum", ())]
    if "const" in schema:
        values.append(schema["const"])
    kinds = schema.get("type", [])
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        if kind == "array":
            item = example_arguments(schema.get("items", {}))
            values += [[], [item], [item] * 3]
        else:
            values += _TELLING_VALUES.get(kind, ())
    for key in ("anyOf", "oneOf"):
        for option in schema.get(key, ()):
            values += _telling_values(option)
    return values


def argument_variants(schema: Mapping[str, Any]) -> list[Any]:
    """Valid instances of a tool's JSON Schema, built without hypothesis: the small example
    (``example_arguments``), then the example with one property at a time set to each of a
    few telling values of its type (and each optional property filled in). Only what the
    schema's validator accepts is kept, the example first; empty when nothing is valid."""
    validator = schema_validator(dict(schema))
    example = example_arguments(schema)
    candidates = [example]
    if isinstance(example, dict):
        for name, prop in schema.get("properties", {}).items():
            candidates.append({**example, name: example_arguments(prop)})
            candidates += [{**example, name: value} for value in _telling_values(prop)]
    found: dict[str, Any] = {}
    for candidate in candidates:
        key = json.dumps(candidate)
        if key not in found and validator.is_valid(candidate):
            found[key] = candidate
    return list(found.values())


_WRONG_VALUES: tuple[Any, ...] = (None, 3, "x", [1], {"a": 1}, True, -1, "")


def invalid_argument_texts(schema: Mapping[str, Any]) -> list[str]:
    """JSON objects (as text) a tool's schema rejects: missing required arguments, wrong
    types, unexpected names; sorted, and empty for a schema that accepts every object."""
    validator = schema_validator(dict(schema))
    candidates: list[dict[str, Any]] = [{}, {"unexpected_argument": 1}]
    example = example_arguments(schema)
    for name in schema.get("properties", {}):
        for value in _WRONG_VALUES:
            candidates.append({name: value})
            if isinstance(example, dict):
                candidates.append({**example, name: value})
    return sorted({json.dumps(c) for c in candidates if not validator.is_valid(c)})


def call_kinds(specs: Sequence[ToolSpec]) -> tuple[tuple[ToolCall, ...], ...]:
    """Tool calls by kind, for tools with these specs: valid calls to each tool (twice, so
    they are half of all calls), invalid ones to each, malformed argument text, unknown
    tool names, and valid calls under a duplicate id. Empty kinds are left out."""
    names = [spec.name for spec in specs] or ["missing"]
    valid = [
        tuple(
            ToolCall(id="", name=spec.name, arguments=json.dumps(arguments))
            for arguments in argument_variants(spec.parameters)
        )
        for spec in specs
    ]
    invalid = [
        tuple(
            ToolCall(id="", name=spec.name, arguments=text)
            for text in invalid_argument_texts(spec.parameters)
        )
        for spec in specs
    ]
    malformed = tuple(
        ToolCall(id="", name=name, arguments=text) for name in names for text in MALFORMED_ARGUMENTS
    )
    unknown = tuple(
        ToolCall(id="", name=name, arguments="{}")
        for name in ("nope", names[0].upper(), "finish", "ask-user")
    )
    every_valid = [one for kind in valid for one in kind] or unknown
    duplicate = tuple(one.model_copy(update={"id": "dup"}) for one in every_valid)
    kinds = (*valid, *valid, *invalid, malformed, unknown, duplicate)
    return tuple(kind for kind in kinds if kind)


T = TypeVar("T")


def pick(options: Sequence[T], byte: int) -> T:
    """The option a byte (0-255) picks: each gets an equal share of the byte values, in
    order, so that a smaller byte picks an earlier (simpler) option."""
    return options[byte * len(options) // 256]


def equal_shares(kinds: Sequence[Sequence[T]]) -> tuple[T, ...]:
    """The options of every kind in one tuple, each kind repeating its own to fill an equal
    share, so that ``pick`` chooses each kind as often as any other (a kind of eight
    variants no more often than a kind of one). Keep it under 256 long: ``pick`` reaches
    every option then."""
    share = math.lcm(*(len(kind) for kind in kinds))
    return tuple(option for kind in kinds for option in kind for _ in range(share // len(kind)))


def _usages() -> tuple[Usage | None, ...]:
    """Reported usage: none (the engine estimates), plausible, or absurd (up to 2**64, past
    SQLite's INTEGER), a third each."""
    plausible = [
        Usage(input_tokens=i, output_tokens=o, requests=1)
        for i in (0, 50, 200, 800, 2_000)
        for o in (0, 20, 100, 500)
    ]
    absurd = [
        Usage(input_tokens=i, output_tokens=o, requests=1)
        for i in (0, 10**9, 2**63)
        for o in (0, 10**9, 2**64)
        if i or o
    ]
    return equal_shares([[None], plausible, absurd])


USAGES = _usages()
TOOL_OUTCOMES = equal_shares(TOOL_OUTCOME_KINDS)
SHAPES = ("script", "cycled script", "one step forever", "short cycle")
"""How a behaviour plays its script: once, cycled, only its first step forever, or its first
two to four steps forever (when the script is that long)."""
STEP_KINDS = ("calls", "calls", "text", "edge", "error", "garbage")
"""What a step is: a reply with tool calls (a third of the steps), a plain reply, an edge
reply, an exception to raise, or garbage."""
CALL_FINISHES = (FinishReason.TOOL_CALLS, *(r for r in FinishReason if r.name != "TOOL_CALLS"))
PALETTE_CALLS = 6
"""How many calls the call palette holds."""
CALL_SETS = tuple(
    subset for size in range(1, 5) for subset in itertools.combinations(range(PALETTE_CALLS), size)
)
"""Which calls of the call palette a reply makes (one to four, in order)."""

PALETTE_STEPS = 8
"""How many steps the step palette holds: each byte of a script picks one (``pick``)."""
CALL_BYTES = 2
"""One call of the palette: its kind, then which call of that kind."""
STEP_BYTES = 5
"""One step of the palette: its kind (``STEP_KINDS``), its detail (the finish reason of a
reply, or which edge reply, error or garbage), its text, its usage, and which calls a reply
with calls makes (``CALL_SETS``)."""
TOOL_BYTES = 4
"""One tool's doubles: how many outcomes (0 to 3; 0 runs it for real), then each outcome."""


class Catalogue:
    """Every step, tool call and tool outcome the harness generates against one agent, by
    kind and simplest first, and how two drawn values pick a ``Behaviour`` from them.

    Hypothesis draws a behaviour as one *record* of ``record_size`` bytes (``behaviours_for``;
    ``batches_for`` draws several records as one value): a *block* of ``block_size`` bytes,
    a length byte, and a *script* of up to ``max_steps`` bytes, one per model request. The
    block holds, in order: the shape (one byte, ``SHAPES``); ``TOOL_BYTES`` for each of
    ``tool_names`` (its doubles); a palette of ``PALETTE_CALLS`` calls, ``CALL_BYTES`` each;
    and a palette of ``PALETTE_STEPS`` steps, ``STEP_BYTES`` each, whose replies make calls
    of the call palette. Each byte of the script picks the palette step the model plays at
    that request. Every byte picks from a list (``pick``), so a zero byte is the simplest
    choice: hypothesis shrinks a failure by lowering bytes (the length byte first among
    equals), which ends in few, simple steps.

    Why not compose hypothesis strategies (``replies_for``): each hypothesis choice costs
    some 200 k instructions, and each byte of a fixed-size one about 5 k (callgrind; a byte
    of a variable-size one costs twice that, a text character five times). A composed
    behaviour made some thirty choices, 8.4 M instructions (twice the run it generated); a
    record costs about 0.4 M, and a share of one choice in a batch. The palettes keep repeats
    (the same step or call again, loops) as likely as a model makes them.
    """

    def __init__(
        self,
        specs: Sequence[ToolSpec],
        tool_names: Sequence[str] = (),
        *,
        retry_after: bool = True,
        max_steps: int = 12,
    ) -> None:
        self.calls = call_kinds(specs)
        self.errors = equal_shares(model_error_kinds(retry_after=retry_after))
        self.tool_names = tuple(tool_names)
        self.complete = all(argument_variants(spec.parameters) for spec in specs)
        """Every tool has valid arguments here (else generate them from its schema)."""
        self._calls_at = 1 + TOOL_BYTES * len(self.tool_names)
        self._steps_at = self._calls_at + CALL_BYTES * PALETTE_CALLS
        self.block_size = self._steps_at + STEP_BYTES * PALETTE_STEPS
        self.max_steps = max_steps
        self.record_size = self.block_size + 1 + max_steps

    def read(self, record: bytes) -> Behaviour:
        """The behaviour a record of ``record_size`` bytes picks (see the class)."""
        block, length = record[: self.block_size], record[self.block_size]
        steps = 1 + length * self.max_steps // 256
        start = self.block_size + 1
        return self.behaviour(block, record[start : start + steps])

    def read_batch(self, records: bytes) -> list[Behaviour]:
        """The behaviours of consecutive records, each once: a record equal to an earlier one
        (the all-zero start of a search, above all) is skipped, not played twice."""
        size = self.record_size
        distinct = dict.fromkeys(records[at : at + size] for at in range(0, len(records), size))
        return [self.read(record) for record in distinct]

    def behaviour(self, block: bytes, script: bytes) -> Behaviour:
        """The behaviour ``block`` and ``script`` pick (see the class)."""
        shape = pick(SHAPES, block[0])
        order = [byte * PALETTE_STEPS // 256 for byte in script]
        if shape == "one step forever":
            order = order[:1]
        elif shape == "short cycle":
            order = order[:4]
        calls = block[self._calls_at : self._steps_at]
        palette = [
            pick(pick(self.calls, kind), which)
            for kind, which in zip(calls[0::2], calls[1::2], strict=True)
        ]
        steps: dict[int, object] = {}
        for index in order:
            if index not in steps:
                at = self._steps_at + index * STEP_BYTES
                steps[index] = self.step(block[at : at + STEP_BYTES], palette)
        return Behaviour(
            steps=tuple(steps[index] for index in order),
            cycle=shape != "script",
            tools=self.tools(block[1 : self._calls_at]),
        )

    def step(self, record: bytes, calls: Sequence[ToolCall]) -> object:
        """One script item from its ``STEP_BYTES``, given the call palette."""
        kind, detail, text, usage, which = record
        match pick(STEP_KINDS, kind):
            case "calls":
                return reply(
                    pick(TEXTS, text),
                    *(calls[n] for n in pick(CALL_SETS, which)),
                    finish_reason=pick(CALL_FINISHES, detail),
                    usage=pick(USAGES, usage),
                )
            case "text":
                return reply(
                    pick(TEXTS, text),
                    finish_reason=pick(tuple(FinishReason), detail),
                    usage=pick(USAGES, usage),
                )
            case "edge":
                return pick(EDGE_REPLIES, detail)
            case "error":
                return pick(self.errors, detail)()
            case _:
                return pick(GARBAGE, detail)

    def tools(self, record: bytes) -> tuple[tuple[str, tuple[ToolOutcome, ...]], ...]:
        """The tool doubles of ``Behaviour.tools``, from ``TOOL_BYTES`` per tool."""
        found = []
        for number, name in enumerate(self.tool_names):
            count, *outcomes = record[number * TOOL_BYTES : (number + 1) * TOOL_BYTES]
            chosen = tuple(pick(TOOL_OUTCOMES, byte) for byte in outcomes[: count * 4 // 256])
            if chosen:
                found.append((name, chosen))
        return tuple(sorted(found))
