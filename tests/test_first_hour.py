"""The first hour (issue 40): what a newcomer trips over."""

from __future__ import annotations

import pytest

from agent_fsm import Agent, ConfigError, KeepLastTurns, Limits, tool
from agent_fsm.testing import ScriptedModel


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return city


def test_an_agents_repr_is_a_summary() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        tools=[lookup],
        system_prompt="You answer questions about cities, briefly and politely, always.",
        limits=Limits(max_turns=3),
    )
    shown = repr(agent)
    assert shown == (
        "Agent(model=ScriptedModel('scripted'), tools=['lookup'], system_prompt='You answer "
        "questions about cities, br...', limits=Limits(max_turns=3))"
    )
    assert len(repr(Agent(model=ScriptedModel([])))) < 200


def test_a_policy_class_instead_of_a_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"got the class KeepLastTurns.*KeepLastTurns\(\.\.\.\)"):
        Agent(
            model=ScriptedModel([]),
            context_policy=KeepLastTurns,  # type: ignore[arg-type]
            limits=Limits(context_window=4_000, reply_tokens=500),
        )
