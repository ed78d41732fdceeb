"""Approval-gated tools: the call is not run, every call of the turn is answered, and the run
pauses in DONE/approval_required with the pending calls in RunResult.pending."""

from __future__ import annotations

from typing import Any

import pytest

from agent_fsm import Agent, RunStatus, StopReason, tool
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.state import ControlKind
from agent_fsm.table import AgentState
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import Recorder, echo, limits

ran: list[str] = []


@tool(requires_approval=lambda args: args["amount"] > 100)
def transfer(amount: int, to: str) -> str:
    """Send money."""
    ran.append(f"transfer {amount} to {to}")
    return f"sent {amount}"


@tool(requires_approval=True)
def delete_file(path: str) -> str:
    """Delete a file."""
    ran.append(f"delete {path}")
    return "deleted"


def _broken_rule(args: dict[str, Any]) -> bool:
    raise KeyError("rule bug")


@tool(requires_approval=_broken_rule)
def risky() -> str:
    """Guarded by a rule that fails."""
    ran.append("risky")
    return "done"


@pytest.fixture(autouse=True)
def _clear() -> None:
    ran.clear()


def _run(*calls: Any) -> tuple[Any, Agent, Recorder]:
    agent = Agent(
        model=ScriptedModel([reply("", *calls), "never reached"]),
        tools=[transfer, delete_file, risky, echo],
        limits=limits(),
    )
    recorder = Recorder()
    agent = agent.subscribe(recorder)
    result = agent.run_sync("go")
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=recorder)
    return result, agent, recorder


def test_calls_needing_approval_pause_the_run_and_the_others_run() -> None:
    result, _, recorder = _run(
        call("transfer", amount=500, to="bob"),
        call("echo", text="hi"),
        call("transfer", amount=5, to="ann"),
        call("delete_file", path="/tmp/x"),
    )
    assert (result.final_state, result.stop_reason, result.status) == (
        AgentState.DONE,
        StopReason.APPROVAL_REQUIRED,
        RunStatus.NEEDS_INPUT,
    )
    assert ran == ["transfer 5 to ann"]
    answers = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert [a.status for a in answers] == [
        ToolStatus.SKIPPED,
        ToolStatus.OK,
        ToolStatus.OK,
        ToolStatus.SKIPPED,
    ]
    assert "Awaiting the user's approval: this call was not run" in answers[0].content
    assert "will arrive in the next user message" in answers[0].content
    pending = result.pending
    assert pending is not None
    assert pending.kind is ControlKind.APPROVAL
    assert [c.name for c in pending.pending_calls] == ["transfer", "delete_file"]
    assert pending.tool_call_id == pending.pending_calls[0].id == answers[0].tool_call_id
    assert pending.text == (
        "Approval needed to run 2 tool calls: transfer(amount=500, to=bob); "
        "delete_file(path=/tmp/x)"
    )
    assert result.output == pending.text
    assert result.turns == 1
    assert "tool_finished" in recorder.kinds()


def test_a_single_pending_call_has_a_short_summary() -> None:
    result, _, _ = _run(call("delete_file", path="a.txt"))
    assert result.pending is not None
    assert result.pending.text == "Approval needed to run delete_file(path=a.txt)"


def test_a_rule_that_raises_counts_as_needing_approval() -> None:
    result, _, _ = _run(call("risky"))
    assert result.stop_reason is StopReason.APPROVAL_REQUIRED
    assert ran == []


def test_a_small_transfer_needs_no_approval() -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("transfer", amount=5, to="ann")), "done"]),
        tools=[transfer],
        limits=limits(),
    )
    result = agent.run_sync("go")
    assert (result.stop_reason, result.pending) == (StopReason.FINAL_ANSWER, None)
    assert ran == ["transfer 5 to ann"]


def test_ask_user_wins_over_approval() -> None:
    result, _, _ = _run(
        call("delete_file", path="x"),
        call("ask_user", question="Which file?"),
        call("echo", text="e"),
    )
    assert result.stop_reason is StopReason.ASK_USER
    assert result.pending is not None
    assert result.pending.kind is ControlKind.ASK_USER
    assert ran == []
    answers = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert [a.status for a in answers] == [ToolStatus.SKIPPED, ToolStatus.OK, ToolStatus.SKIPPED]


def test_an_invalid_call_to_an_approval_tool_gets_its_error_and_needs_no_approval() -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("transfer", amount="lots", to="bob")), "sorry"]),
        tools=[transfer],
        limits=limits(),
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    error = result.messages[-2]
    assert isinstance(error, ToolMessage)
    assert error.status is ToolStatus.ERROR
    assert "- at amount: 'lots' is not of type 'integer'" in error.content
