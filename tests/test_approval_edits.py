"""Approve with edited arguments (issue 36): ``Approval(allow=True, arguments={...})`` runs
the call with the person's arguments, checked against the tool's schema like a model's call
(a misfit is a ``ResumeError`` and the run stays paused), recorded in the run's decisions
through a checkpoint, screened by ``before_tool`` again, and told to the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from agent_fsm import Agent, StepHooks, StopReason, tool
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import ResumeError
from agent_fsm.events import ToolStarted
from agent_fsm.hooks import Deny
from agent_fsm.messages import AssistantMessage, ToolCall, ToolMessage, UserMessage
from agent_fsm.state import Approval
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import Recorder, limits

ran: list[tuple[int, str]] = []


@tool(requires_approval=True)
def transfer(amount: int, to: str) -> str:
    """Send money."""
    ran.append((amount, to))
    return f"sent {amount} to {to}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def _paused(tmp_path: Path, **options: Any) -> tuple[Agent, str, str]:
    agent = Agent(
        model=ScriptedModel([reply("", call("transfer", amount=500, to="bob")), "Done."]),
        tools=[transfer],
        limits=limits(),
        store=SQLiteStore(tmp_path / "runs.sqlite3"),
        **options,
    )
    result = agent.run_sync("pay bob")
    assert result.stop_reason is StopReason.APPROVAL_REQUIRED
    assert result.pending is not None
    return agent, result.run_id, result.pending.pending_calls[0].id


def test_an_approval_with_edited_arguments_runs_them_and_tells_the_model(tmp_path: Path) -> None:
    agent, run_id, call_id = _paused(tmp_path)
    recorder = Recorder()
    watched = agent.subscribe(recorder)
    edit = Approval(allow=True, arguments={"amount": 50, "to": "bob"}, reason="too much")
    result = watched.resume_sync(run_id, approvals={call_id: edit})
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    assert ran == [(50, "bob")]
    assert result.stop_reason is StopReason.FINAL_ANSWER
    told = [m.content for m in result.messages if isinstance(m, UserMessage)][-1]
    assert '"amount": 50' in told
    assert "changed its arguments" in told
    assert "Reason given: too much" in told
    assert "sent 50 to bob" in told
    started = [e.call for e in recorder if isinstance(e, ToolStarted)]
    assert [c.arguments for c in started] == ['{"amount":50,"to":"bob"}']
    # the transcript keeps the model's own call
    made = [m for m in result.messages if isinstance(m, AssistantMessage) and m.tool_calls]
    assert [c.arguments for c in made[0].tool_calls] == ['{"amount": 500, "to": "bob"}']


def test_edited_arguments_that_misfit_the_schema_are_refused_and_the_run_stays_paused(
    tmp_path: Path,
) -> None:
    agent, run_id, call_id = _paused(tmp_path)
    bad = Approval(allow=True, arguments={"amount": "lots", "to": "bob"})
    with pytest.raises(
        ResumeError, match=r"(?s)do not fit the tool: .*at amount: 'lots' is not of type"
    ):
        agent.resume_sync(run_id, approvals={call_id: bad})
    with pytest.raises(ResumeError, match="do not fit the tool"):
        agent.resume_sync(run_id, approvals={call_id: Approval(allow=True, arguments={})})
    assert ran == []
    stored = agent.checkpoints.load(run_id)
    assert stored.stop_reason is StopReason.APPROVAL_REQUIRED
    assert stored.decisions == []
    result = agent.resume_sync(run_id, approvals={call_id: True})  # still answerable
    assert ran == [(500, "bob")]
    assert result.stop_reason is StopReason.FINAL_ANSWER


def test_the_decision_with_its_arguments_is_checkpointed(tmp_path: Path) -> None:
    agent, run_id, call_id = _paused(tmp_path)
    edit = Approval(allow=True, arguments={"amount": 7, "to": "ann"})
    run = agent.reopen(run_id, approvals={call_id: edit})
    assert [d.approval for d in run.state.decisions] == [edit]
    agent.checkpoints.save(run.state)
    reloaded = SQLiteStore(tmp_path / "runs.sqlite3").load(run_id)
    assert reloaded.decisions[0].approval.arguments == {"amount": 7, "to": "ann"}
    assert reloaded.decisions[0].call.arguments == '{"amount": 500, "to": "bob"}'


def test_before_tool_screens_the_edited_arguments(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []

    def guard(call: ToolCall, arguments: dict[str, Any]) -> Deny | None:
        seen.append(arguments)
        return Deny(reason="no payments to eve") if arguments["to"] == "eve" else None

    agent, run_id, call_id = _paused(tmp_path, hooks=StepHooks(before_tool=guard))
    assert seen == [{"amount": 500, "to": "bob"}]
    edit = Approval(allow=True, arguments={"amount": 5, "to": "eve"})
    result = agent.resume_sync(run_id, approvals={call_id: edit})
    assert seen[-1] == {"amount": 5, "to": "eve"}
    assert ran == []
    told = [m.content for m in result.messages if isinstance(m, UserMessage)][-1]
    assert "no payments to eve" in told
    assert not [m for m in result.messages if isinstance(m, ToolMessage) and m.is_error]


def test_arguments_come_only_with_an_approval() -> None:
    with pytest.raises(ValidationError, match="allow=True"):
        Approval(allow=False, arguments={"amount": 1})
