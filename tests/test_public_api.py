"""The public face: a short ``__all__``, every other name where it lives, and ``Agent`` as
frozen, keyword-only configuration."""

from __future__ import annotations

import dataclasses
import importlib

import pytest

import agent_fsm
from agent_fsm import Agent, Limits
from agent_fsm.errors import ConfigError
from agent_fsm.events import Event
from agent_fsm.testing import ScriptedModel


def test_the_public_face_has_at_most_34_names_and_each_resolves() -> None:
    """Short enough to read at a glance: 28 names, 4 for a loop of your own (Table, Row,
    CustomState, StepContext), and 2 for images and files (ImagePart, FilePart; a text part
    is a str, or ``agent_fsm.content.TextPart``)."""
    assert len(agent_fsm.__all__) <= 34
    assert len(set(agent_fsm.__all__)) == len(agent_fsm.__all__)
    for name in agent_fsm.__all__:
        assert getattr(agent_fsm, name) is not None, name


@pytest.mark.parametrize(
    ("module", "names"),
    [
        (
            "agent_fsm.events",
            ["Event", "RunStarted", "StateChanged", "ToolFinished", "RunFinished"],
        ),
        ("agent_fsm.messages", ["Message", "ToolCall", "ToolMessage", "Usage", "UserMessage"]),
        (
            "agent_fsm.errors",
            ["DiagramError", "TraceFileError", "ScriptExhaustedError", "TableError"],
        ),
        ("agent_fsm.durable", ["RunSummary", "TraceWriter", "read_run", "SQLiteStore"]),
        ("agent_fsm.tools", ["Tool", "ToolRegistry", "ToolResult", "tool"]),
    ],
)
def test_other_names_live_in_their_modules(module: str, names: list[str]) -> None:
    imported = importlib.import_module(module)
    for name in names:
        assert name in imported.__all__, name
        assert getattr(imported, name) is not None


def test_agent_is_frozen_and_keyword_only() -> None:
    agent = Agent(model=ScriptedModel([]))
    with pytest.raises(dataclasses.FrozenInstanceError):
        agent.system_prompt = "changed"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Agent(ScriptedModel([]))  # type: ignore[misc]


def test_replace_is_dataclasses_replace_and_refuses_unknown_options() -> None:
    agent = Agent(model=ScriptedModel([]), system_prompt="Be brief.")
    other = agent.replace(limits=Limits(max_turns=3))
    assert other.system_prompt == "Be brief."
    assert other.limits.max_turns == 3
    assert agent.limits.max_turns != 3
    assert dataclasses.replace(agent, limits=Limits(max_turns=3)).limits == other.limits
    with pytest.raises(ConfigError, match="unknown option"):
        agent.replace(modle=ScriptedModel([]))


def test_subscribe_returns_a_new_agent_and_leaves_a_shared_one_alone() -> None:
    shared = Agent(model=ScriptedModel(["one", "two"]))
    seen: list[Event] = []
    mine = shared.subscribe(seen.append)
    assert shared.handlers == ()
    assert mine.handlers == (seen.append,)
    shared.run_sync("first")  # not seen: the shared agent has no subscriber
    assert seen == []
    mine.run_sync("second")
    assert seen[0].kind == "run_started"
    assert seen[-1].kind == "run_finished"


def test_an_agent_copy_keeps_its_own_in_memory_store() -> None:
    agent = Agent(model=ScriptedModel([]))
    assert agent.replace().checkpoints is not agent.checkpoints


def test_a_result_repr_summarises_instead_of_dumping_the_transcript() -> None:
    result = Agent(model=ScriptedModel(["answer"]), system_prompt="x" * 10_000).run_sync("go")
    shown = repr(result)
    assert "<3 messages>" in shown  # system, user, assistant
    assert "final_answer" in shown
    assert len(shown) < 500
