"""Tools that end the run (``terminal=True``): a successful call's output is the run's output,
ranked after ask_user and finish_task and before approvals and the limits, at most one call of
a terminal tool runs per reply, and a failed one goes back to the model to correct."""

from __future__ import annotations

from typing import Any

import pytest

from agent_fsm import Agent, ConfigError, Limits, RunStatus, StopReason, Tool, tool
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.table import AgentState
from agent_fsm.testing import ScriptedModel, assert_terminates, call, reply
from agent_fsm.testing.invariants import InvariantViolation, check_invariants
from tests.conftest import Recorder

submitted: list[str] = []
looked_up: list[str] = []


@tool(terminal=True)
def submit_answer(answer: str) -> str:
    """Deliver the final answer to the caller."""
    if not answer.strip():
        raise ValueError("the answer is empty")
    submitted.append(answer)
    return f"ANSWER: {answer}"


@tool
def look_up(topic: str) -> str:
    """Look something up."""
    looked_up.append(topic)
    return f"notes on {topic}"


@tool(terminal=True, requires_approval=True)
def publish(text: str) -> str:
    """Publish the result (a person approves first)."""
    submitted.append(f"published {text}")
    return f"published: {text}"


@tool(requires_approval=True)
def send_mail(to: str) -> str:
    """Send a mail (a person approves first)."""
    submitted.append(f"mailed {to}")
    return "sent"


@pytest.fixture(autouse=True)
def _clear() -> None:
    submitted.clear()
    looked_up.clear()


def _run(*replies: Any, limits: Limits | None = None) -> tuple[Any, Agent]:
    agent = Agent(
        model=ScriptedModel(list(replies)),
        tools=[submit_answer, look_up, publish, send_mail],
        limits=limits or Limits(max_turns=5),
    )
    recorder = Recorder()
    agent = agent.subscribe(recorder)
    result = agent.run_sync("What is 6 x 7?")
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=recorder)
    return result, agent


def _results(result: Any) -> list[ToolMessage]:
    return [m for m in result.messages if isinstance(m, ToolMessage)]


def test_a_terminal_tool_ends_the_run_with_its_output() -> None:
    result, _ = _run(
        reply("", call("look_up", topic="arithmetic")),
        reply("", call("submit_answer", answer="42")),
    )
    assert (result.final_state, result.stop_reason) == (AgentState.DONE, StopReason.TERMINAL_TOOL)
    assert result.status is RunStatus.COMPLETED
    assert result.output == "ANSWER: 42"
    assert submitted == ["42"]
    last = _results(result)[-1]
    assert last.details == {"runtime": {"ends_run": True}}
    assert result.turns == 2


def test_a_failed_terminal_call_goes_back_to_the_model_which_corrects_it() -> None:
    result, _ = _run(
        reply("", call("submit_answer", answer="  ")),
        reply("", call("submit_answer", answer="42")),
    )
    first = _results(result)[0]
    assert first.status is ToolStatus.ERROR
    assert "the answer is empty" in first.content
    assert (result.stop_reason, result.output) == (StopReason.TERMINAL_TOOL, "ANSWER: 42")


def test_only_the_first_terminal_call_of_a_reply_runs_and_ordinary_calls_run_too() -> None:
    result, _ = _run(
        reply(
            "",
            call("look_up", topic="x"),
            call("submit_answer", answer="first"),
            call("submit_answer", answer="second"),
        )
    )
    assert submitted == ["first"]
    assert looked_up == ["x"]
    statuses = [m.status for m in _results(result)]
    assert statuses == [ToolStatus.OK, ToolStatus.OK, ToolStatus.SKIPPED]
    assert result.output == "ANSWER: first"


def test_an_invalid_terminal_call_does_not_block_a_valid_one_after_it() -> None:
    result, _ = _run(
        reply("", call("submit_answer", nope=1), call("submit_answer", answer="42")),
    )
    assert [m.status for m in _results(result)] == [ToolStatus.ERROR, ToolStatus.OK]
    assert result.stop_reason is StopReason.TERMINAL_TOOL


@pytest.mark.parametrize(
    ("control", "stop"),
    [
        (call("ask_user", question="Which base?"), StopReason.ASK_USER),
        (call("finish_task", summary="Done."), StopReason.FINISH_TASK),
    ],
)
def test_ask_user_and_finish_task_outrank_a_terminal_tool(control: Any, stop: StopReason) -> None:
    result, _ = _run(reply("", call("submit_answer", answer="42"), control))
    assert result.stop_reason is stop
    assert submitted == [], "the control tool won the turn: nothing else ran"


def test_a_terminal_tool_outranks_calls_left_awaiting_approval() -> None:
    result, _ = _run(reply("", call("send_mail", to="bob"), call("submit_answer", answer="42")))
    assert result.stop_reason is StopReason.TERMINAL_TOOL
    assert submitted == ["42"], "the call awaiting approval never runs"


def test_a_terminal_tool_outranks_the_limits_on_the_last_turn() -> None:
    result, _ = _run(reply("", call("submit_answer", answer="42")), limits=Limits(max_turns=1))
    assert result.stop_reason is StopReason.TERMINAL_TOOL


def test_a_terminal_call_awaiting_approval_is_the_one_of_its_reply() -> None:
    """The first valid terminal call of a reply is the one: another after it is skipped even
    while the first waits for a person."""
    result, _ = _run(reply("", call("publish", text="draft"), call("submit_answer", answer="42")))
    assert result.stop_reason is StopReason.APPROVAL_REQUIRED
    assert [m.status for m in _results(result)][-1] is ToolStatus.SKIPPED
    assert submitted == []


def test_an_approved_terminal_tool_ends_the_run_when_carried_out() -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("publish", text="report"))]),
        tools=[publish],
    )
    paused = agent.run_sync("Publish it.")
    assert paused.stop_reason is StopReason.APPROVAL_REQUIRED
    result = agent.resume_sync(paused.run_id, approvals=True, pause=paused.pending.pause)
    assert (result.stop_reason, result.output) == (StopReason.TERMINAL_TOOL, "published: report")
    assert submitted == ["published report"]


def test_terminal_must_be_a_bool() -> None:
    with pytest.raises(ConfigError, match="terminal must be a bool"):
        Tool("t", "d", {"type": "object"}, lambda: "x", terminal="yes")  # type: ignore[arg-type]


def test_the_harness_proves_an_agent_with_a_terminal_tool_terminates() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        tools=[submit_answer, look_up],
        limits=Limits(max_turns=4, retry_backoff_s=0.0, retry_backoff_max_s=0.0),
    )
    assert_terminates(agent, max_examples=200)


def test_the_invariants_catch_a_run_that_ignored_a_terminal_tool() -> None:
    """Demote the terminal row below the turn limit: the turn limit then speaks first (the
    verifier accepts such a table, since it still terminates). The invariants read that
    priority from the table they are given (issue 32: the rows decide), and name a run that
    stopped so against the default table, where the terminal tool outranks every limit."""
    from agent_fsm.table import TABLE

    rows = list(TABLE)
    terminal = rows.pop(next(i for i, r in enumerate(rows) if r.label == "terminal_tool"))
    rows.insert(next(i for i, r in enumerate(rows) if r.label == "continue"), terminal)
    agent = Agent(
        model=ScriptedModel([reply("", call("submit_answer", answer="42"))]),
        tools=[submit_answer],
        limits=Limits(max_turns=1),
        table=tuple(rows),
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.MAX_TURNS
    check_invariants(result, limits=agent.limits, rows=agent.machine.rows)
    with pytest.raises(InvariantViolation, match="terminal_tool was called but the run stopped"):
        check_invariants(result, limits=agent.limits, rows=TABLE)
