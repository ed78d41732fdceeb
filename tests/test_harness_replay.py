"""Record a run, replay it offline, and catch a behaviour change as a transition diff."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_fsm import Agent, Limits, StopReason, tool
from agent_fsm.durable.tracefile import TraceWriter
from agent_fsm.errors import TraceFileError
from agent_fsm.models.base import ModelCallError
from agent_fsm.table import TABLE
from agent_fsm.testing import (
    ReplayMismatch,
    ScriptedModel,
    assert_replays,
    call,
    load_recording,
    raw_call,
    record_run,
    replay,
    reply,
)

CALLS: list[str] = []


@tool
def lookup(city: str) -> dict[str, object]:
    """Look a city up."""
    CALLS.append(city)
    return {"city": city, "population": len(city) * 1000}


@tool
def flaky(reason: str) -> str:
    """Always fails."""
    CALLS.append(reason)
    raise PermissionError(reason)


SCRIPT = [
    reply("Let me look.", call("lookup", city="Oslo"), call("flaky", reason="no access")),
    ModelCallError("rate limited", transient=True),
    reply("", raw_call("lookup", "{not json"), call("nope")),
    reply("", call("lookup", city="Bergen")),
    reply("", call("finish_task", summary="Oslo and Bergen looked up.")),
]
LIMITS = Limits(max_turns=8, retry_backoff_s=0.0, retry_backoff_max_s=0.0)


def _agent(**changes: object) -> Agent:
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[lookup, flaky], limits=LIMITS)
    return agent.replace(**changes) if changes else agent


@pytest.fixture
def recorded(tmp_path: Path) -> Path:
    path = tmp_path / "run.jsonl"
    result = record_run(_agent(), "Look up Oslo and Bergen.", path)
    assert result.stop_reason is StopReason.FINISH_TASK
    return path


def test_a_recorded_run_replays_offline_with_the_same_transitions(recorded: Path) -> None:
    recording = load_recording(recorded)
    assert recording.input == "Look up Oslo and Bergen."
    assert len(recording.replies) == len(SCRIPT)
    CALLS.clear()
    result = assert_replays(_agent(), recorded)
    assert CALLS == []  # offline: no tool ran for real
    assert result.stop_reason is StopReason.FINISH_TASK
    assert [e.label for e in result.trace] == [e.label for e in recording.trace]
    original = [m for m in load_recording(recorded).run.events if m.kind == "tool_finished"]
    replayed = replay(_agent(), recording)
    texts = [m.content for m in replayed.messages if m.role == "tool"]
    assert texts == [e.output for e in original]  # tool errors are worded as they were


def test_a_behaviour_change_fails_the_replay_with_a_diff(recorded: Path) -> None:
    with pytest.raises(ReplayMismatch) as caught:
        assert_replays(_agent(limits=LIMITS.model_copy(update={"max_turns": 3})), recorded)
    message = str(caught.value)
    assert "--- recorded" in message
    assert "+++ replayed" in message
    assert "-stopped: finish_task" in message
    assert "+stopped: max_turns" in message


def test_a_changed_table_fails_the_replay(recorded: Path) -> None:
    rows = list(TABLE)
    finish = rows.pop(next(i for i, r in enumerate(rows) if r.label == "finish_task"))
    rows.insert(next(i for i, r in enumerate(rows) if r.label == "continue"), finish)
    with pytest.raises(ReplayMismatch, match="finish_task"):
        assert_replays(
            _agent(table=tuple(rows), limits=LIMITS.model_copy(update={"max_turns": 4})), recorded
        )


def test_a_trace_file_with_several_runs_needs_a_run_id(tmp_path: Path) -> None:
    path = tmp_path / "prod.jsonl"
    agent = _agent()
    agent = agent.subscribe(TraceWriter(path, append=True))
    agent.run_sync("first", run_id="one")
    agent.replace(model=ScriptedModel(["Just text."])).run_sync("x")  # not recorded
    agent.replace(model=ScriptedModel(SCRIPT)).run_sync("y")  # replace drops subscribers
    agent.run_sync("second", run_id="two")  # reuses the exhausted script: fails at once
    with pytest.raises(TraceFileError, match="pick one with run_id=ID"):
        load_recording(path)
    assert_replays(_agent(), path, run_id="one")
    assert_replays(_agent(), path, run_id="two")
