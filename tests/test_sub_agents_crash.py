"""Durable nesting under a real crash: the parent's process is killed (SIGKILL) while its
sub-agent's call is in flight; the parent, resumed by a new agent, finds its child's run in
the same store under the id its call names, and goes on with it from its checkpoint: the
child is not started again, and its side effect does not happen twice."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm import SQLiteStore, StopReason
from agent_fsm.messages import AssistantMessage, ToolMessage, UserMessage
from agent_fsm.run.delegation import child_run_id
from agent_fsm.table import AgentState
from agent_fsm.testing.invariants import check_invariants, transcript_problems
from tests.nested_crash_child import build

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")


def test_a_parent_killed_mid_child_resumes_the_child_where_it_was(tmp_path: Path) -> None:
    log, db = tmp_path / "effects.log", tmp_path / "runs.db"
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.nested_crash_child", str(log), str(db)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "effect"  # the child's call is in flight
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=30)

    store = SQLiteStore(db)
    parent = store.load("parent")
    assert parent.state is AgentState.ACT
    (asked,) = [m for m in parent.messages if isinstance(m, AssistantMessage)]
    child_id = child_run_id("parent", 1, asked.tool_calls[0].id)
    child = store.load(child_id)
    assert child.state is AgentState.ACT  # killed mid-call, checkpointed before it
    assert child.parent is not None
    assert child.parent.run_id == "parent"

    agent = build(db, log, hang=False)  # a new process's agent
    result = agent.resume_sync("parent")
    check_invariants(result, limits=agent.limits, bound=agent.bound, rows=agent.machine.rows)
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert log.read_text().splitlines() == ["child effect"]  # never twice
    (answer,) = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert answer.content.startswith("child done:")  # the child went on, and answered
    assert "outcome" in answer.content.lower()  # its call's outcome is unknown after the kill
    ended = SQLiteStore(db).load(child_id)
    assert ended.stop_reason is StopReason.FINAL_ANSWER
    assert not transcript_problems(ended.messages)
    users = [m for m in ended.messages if isinstance(m, UserMessage)]
    calls = [m for m in ended.messages if isinstance(m, AssistantMessage) and m.tool_calls]
    assert (len(users), len(calls)) == (1, 1)  # where it was, not started again
    assert result.turns == 2 + ended.turns
