"""Bounded exhaustive checking: every sequence of abstract model events up to a length.

Where ``assert_terminates`` samples, ``check_exhaustively`` covers small cases completely:
for an alphabet of abstract events (by default ``text``, ``tool_call``, ``control_call``,
``error`` and ``repeat``) it plays every sequence of length 1 to ``max_length`` against the
agent, each followed by the model running out (a permanent failure), and checks every run
invariant. With ``a`` events that is ``a + a² + … + a^n`` runs, reported in ``checked``.
No hypothesis needed.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.messages import ToolCall, ToolSpec
from agent_fsm.models.base import ModelCallError
from agent_fsm.testing.behaviour import Behaviour, example_arguments, user_tools
from agent_fsm.testing.harness import DEFAULT_INPUT, CaseResult, HarnessFailure, LoopRunner, Stage
from agent_fsm.testing.models import call, raw_call, reply

if TYPE_CHECKING:
    from agent_fsm.agent import Agent

__all__ = ["DEFAULT_EVENTS", "ExhaustiveReport", "check_exhaustively", "default_alphabet"]

DEFAULT_EVENTS = ("text", "tool_call", "control_call", "error", "repeat")
"""The abstract model events of the default alphabet."""

EventFactory = Callable[[object | None], object]
"""Makes a concrete script item for an abstract event, given the previous concrete item."""


@dataclass(frozen=True, slots=True)
class ExhaustiveReport:
    """What ``check_exhaustively`` did."""

    alphabet: tuple[str, ...]
    max_length: int
    checked: int
    """How many sequences were played: ``a + a² + … + a^max_length`` for ``a`` events."""
    failures: tuple[tuple[tuple[str, ...], CaseResult], ...]
    """(abstract sequence, its case) for every sequence that broke an invariant."""

    @property
    def ok(self) -> bool:
        return not self.failures

    def assert_ok(self) -> None:
        """Raise a HarnessFailure for the shortest failing sequence, if there is one."""
        if self.failures:
            sequence, case = min(self.failures, key=lambda f: len(f[0]))
            raise HarnessFailure(
                case,
                header=f"check_exhaustively: {len(self.failures)} of {self.checked} sequences "
                f"broke a run invariant; the shortest is {list(sequence)}.",
            )


def _call_of(spec: ToolSpec) -> ToolCall:
    arguments = example_arguments(spec.parameters)
    if isinstance(arguments, dict):
        return call(spec.name, **arguments)
    return raw_call(spec.name, json.dumps(arguments))


def default_alphabet(agent: Agent) -> dict[str, EventFactory]:
    """The default abstract events for ``agent``: a plain text answer, a call to its first
    tool with small valid arguments, a control-flow call (``finish_task``, else
    ``ask_user``), a transient model error, and a repeat of the previous item (the first
    event of a sequence repeats nothing: it is a tool call)."""
    tools = user_tools(agent)
    specs = {spec.name: spec for spec in agent.registry.specs}
    tool_reply = reply("", _call_of(tools[0].spec)) if tools else reply("", call("missing"))
    control_name = next((n for n in ("finish_task", "ask_user") if n in specs), "finish_task")
    control_reply = (
        reply("", _call_of(specs[control_name]))
        if control_name in specs
        else reply("", call("finish_task", summary="done"))
    )

    def repeat(previous: object | None) -> object:
        return tool_reply if previous is None else previous

    return {
        "text": lambda _: reply("The answer."),
        "tool_call": lambda _: tool_reply,
        "control_call": lambda _: control_reply,
        "error": lambda _: ModelCallError("temporarily unavailable", transient=True),
        "repeat": repeat,
    }


def _script(sequence: Sequence[str], alphabet: Mapping[str, EventFactory]) -> tuple[object, ...]:
    items: list[object] = []
    for event in sequence:
        items.append(alphabet[event](items[-1] if items else None))
    return tuple(items)


def check_exhaustively(
    agent: Agent,
    *,
    max_length: int = 4,
    alphabet: Mapping[str, EventFactory] | None = None,
    user_input: str = DEFAULT_INPUT,
    store: CheckpointStore | None = None,
    real_tools: bool = False,
) -> ExhaustiveReport:
    """Play every sequence of abstract model events of length 1..``max_length``.

    Args:
        agent: the agent under test (its model is never called; see ``harness.Stage``).
        max_length: the longest sequence; the number of runs grows as ``a**max_length``.
        alphabet: event name → factory of the concrete item (given the previous item);
            ``default_alphabet(agent)`` by default.
        user_input: the message every run starts with.
        store: where the runs are checkpointed; an in-memory store of the harness by default,
            never the agent's own.
        real_tools: call the agent's real tools (``harness.Stage``); by default each call
            plays a double built from the tool, which answers "ok".

    Returns:
        A report with the number of sequences checked and every failure with its
        reproducer; call ``assert_ok()`` on it to fail a test.
    """
    if max_length < 1:
        raise ValueError("max_length must be at least 1")
    stage = Stage(agent, user_input=user_input, store=store, real_tools=real_tools)
    events = dict(alphabet) if alphabet is not None else default_alphabet(stage.agent)
    names = tuple(events)
    checked = 0
    failures: list[tuple[tuple[str, ...], CaseResult]] = []
    loop = LoopRunner()
    try:
        for length in range(1, max_length + 1):
            for sequence in itertools.product(names, repeat=length):
                case = stage.play(Behaviour(steps=_script(sequence, events), cycle=False), loop)
                checked += 1
                if not case.ok:
                    failures.append((sequence, case))
    finally:
        loop.close()
    return ExhaustiveReport(
        alphabet=names, max_length=max_length, checked=checked, failures=tuple(failures)
    )
