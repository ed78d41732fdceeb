"""Conversations (issue 14, first part): a run that starts from an earlier one's transcript,
repaired so that every tool call has exactly one result."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm import Agent, CheckpointError, ConfigError, SQLiteStore, StopReason
from agent_fsm.events import Event, HistoryRepaired
from agent_fsm.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from agent_fsm.run.history import INTERRUPTED
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply
from agent_fsm.testing.invariants import transcript_problems
from tests.conftest import echo


def test_a_follow_up_question_sees_the_earlier_conversation() -> None:
    model = ScriptedModel([reply("", call("echo", text="Paris")), "Paris.", "Madrid."])
    agent = Agent(model=model, tools=[echo], system_prompt="Be brief.")
    first = agent.run_sync("Capital of France?")
    second = agent.run_sync("And of Spain?", history=first)
    assert second.output == "Madrid."
    sent = model.requests[-1].messages
    assert [m.role for m in sent] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert sent[-1] == UserMessage(content="And of Spain?")
    # A new run: its own id, and turns and usage from zero.
    assert second.run_id != first.run_id
    assert second.turns == 1
    assert second.usage.requests == 1
    assert list(second.messages[: len(first.messages)]) == list(first.messages)
    check_invariants(second, limits=agent.limits, bound=agent.bound)


def test_a_history_with_unanswered_and_stray_results_is_repaired_and_reported() -> None:
    history = [
        SystemMessage(content="An old prompt."),
        UserMessage(content="Look these up."),
        AssistantMessage(
            content="",
            tool_calls=(
                ToolCall(id="a", name="echo", arguments='{"text": "x"}'),
                ToolCall(id="b", name="echo", arguments='{"text": "y"}'),
            ),
        ),
        ToolMessage(tool_call_id="a", name="echo", content="x"),
        ToolMessage(tool_call_id="zz", name="echo", content="a result of no call"),
        UserMessage(content="Never mind."),
    ]
    events: list[Event] = []
    model = ScriptedModel(["Fine."])
    agent = Agent(model=model, tools=[echo], system_prompt="Be brief.").subscribe(events.append)
    result = agent.run_sync("What now?", history=history)
    assert result.output == "Fine."
    repaired = [e for e in events if isinstance(e, HistoryRepaired)]
    assert len(repaired) == 1
    assert (repaired[0].answered, repaired[0].dropped, repaired[0].system_messages) == (
        ("b",),
        ("zz",),
        1,
    )
    sent = list(model.requests[0].messages)
    assert transcript_problems(sent) == []
    assert sent[0] == SystemMessage(content="Be brief.")
    interrupted = [m for m in sent if isinstance(m, ToolMessage) and m.tool_call_id == "b"]
    assert interrupted[0].content == INTERRUPTED
    assert interrupted[0].status is ToolStatus.ERROR
    assert [e.kind for e in events][:2] == ["run_started", "history_repaired"]


def test_a_history_of_plain_dicts_is_validated() -> None:
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    model = ScriptedModel(["Again."])
    Agent(model=model).run_sync("Hi again", history=history)  # type: ignore[arg-type]
    assert [m.role for m in model.requests[0].messages] == ["user", "assistant", "user"]
    with pytest.raises(ConfigError, match=r"history\[0\] is not a transcript message"):
        Agent(model=model).run_sync("x", history=[{"role": "robot"}])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="history must be a list of messages"):
        Agent(model=model).run_sync("x", history="Hi")  # type: ignore[arg-type]


def test_continuing_a_stored_run_is_one_call(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        model = ScriptedModel(["Paris.", "Madrid."])
        agent = Agent(model=model, store=store)
        first = agent.run_sync("Capital of France?")
        second = agent.run_sync("And of Spain?", continues=first.run_id)
        assert second.output == "Madrid."
        assert [m.content for m in second.messages] == [
            "Capital of France?",
            "Paris.",
            "And of Spain?",
            "Madrid.",
        ]
        assert store.load(first.run_id).messages == list(first.messages)  # left as it was
        with pytest.raises(CheckpointError, match="no checkpoint"):
            agent.run_sync("?", continues="never-ran")
        with pytest.raises(ConfigError, match="not both"):
            agent.run_sync("?", continues=first.run_id, history=first)


def test_the_in_process_store_says_how_to_continue_a_finished_run() -> None:
    agent = Agent(model=ScriptedModel(["Paris.", "Madrid."]))
    first = agent.run_sync("Capital of France?")
    with pytest.raises(ConfigError, match="pass its messages as history=result"):
        agent.run_sync("And of Spain?", continues=first.run_id)
    assert agent.run_sync("And of Spain?", history=first).stop_reason is StopReason.FINAL_ANSWER
