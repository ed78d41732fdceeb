"""What the harness plays against an agent, without hypothesis: model behaviours, tool doubles
and a fake clock.

A ``Behaviour`` is a list of script items (replies, exceptions to raise, garbage) that a
``BehaviourModel`` plays in order, optionally cycling forever, plus what each tool does when
it is called (``ToolOutcome``). Hypothesis generates them (``strategies.py``); the bounded
exhaustive checker enumerates them (``exhaustive.py``); both play them through ``harness.py``.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from agent_fsm.errors import ConfigError
from agent_fsm.limits import Limits
from agent_fsm.messages import ModelRequest, ModelResponse
from agent_fsm.models.base import ModelCallError
from agent_fsm.tools.results import ToolResult
from agent_fsm.tools.tool import Tool

if TYPE_CHECKING:
    from agent_fsm.agent import Agent

__all__ = [
    "Behaviour",
    "BehaviourModel",
    "FakeClock",
    "ToolOutcome",
    "UnreadableError",
    "example_arguments",
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


async def _outcome(tool: Tool, outcome: ToolOutcome, arguments: dict[str, Any]) -> Any:
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
        return await _outcome(tool, next(cycle), arguments)

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
