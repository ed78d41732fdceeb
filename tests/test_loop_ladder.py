"""The loop ladder (``Limits.loop_ladder``): before loop detection stops a run, a nudge, then
the repeated tool withheld, then the last answer (when wanted) and the stop, each a row of
the table."""

from __future__ import annotations

import itertools

from agent_fsm import Agent, Limits, StopReason
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage, ToolStatus, UserMessage
from agent_fsm.state import RunResult
from agent_fsm.testing import FunctionModel, ScriptedModel, assert_terminates, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import FAST, Recorder, add, echo


def run(agent: Agent) -> RunResult:
    recorder = Recorder()
    result = agent.subscribe(recorder).run_sync("go")
    check_invariants(
        result, limits=agent.limits, bound=agent.bound, events=recorder, rows=agent.machine.rows
    )
    return result


def stubborn(*tools: str) -> FunctionModel:
    """Calls the first offered tool of ``tools`` with the same arguments for ever."""
    turns = itertools.count()

    def decide(request: ModelRequest) -> ModelResponse:
        next(turns)
        offered = {spec.name for spec in request.tools}
        for name in tools:
            if name in offered:
                return reply(
                    "", call(name, text="same") if name == "echo" else call(name, a=1, b=2)
                )
        return reply("I give up: here is what I have.")

    return FunctionModel(decide)


def test_without_the_ladder_a_loop_stops_the_run_at_once() -> None:
    agent = Agent(model=stubborn("echo"), tools=[echo], limits=Limits(**FAST))
    result = run(agent)
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert result.turns == 3
    assert {"nudge_due", "withhold_due"} <= agent.run_config.dead_guards


def test_the_ladder_nudges_then_withholds_the_repeated_tool() -> None:
    """Three calls of echo: a loop, the nudge; three more: the loop again, echo withheld;
    the model, without echo, answers."""
    model = stubborn("echo")
    agent = Agent(model=model, tools=[echo], limits=Limits(**FAST, loop_ladder=True))
    result = run(agent)
    labels = [entry.label for entry in result.trace]
    assert labels.count("nudge") == 1
    assert labels.count("withhold") == 1
    assert labels.index("nudge") < labels.index("withhold")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == "I give up: here is what I have."
    users = [m.content for m in result.messages if isinstance(m, UserMessage)]
    assert any("repeating yourself" in text for text in users)
    assert any("The tool echo is no longer available" in text for text in users)
    assert all(spec.name != "echo" for spec in model.requests[-1].tools)


def test_a_withheld_tool_the_model_still_calls_is_answered_not_run() -> None:
    script = [reply("", call("echo", text="same"))] * 6 + [
        reply("", call("echo", text="again")),
        "done",
    ]
    agent = Agent(
        model=ScriptedModel(script), tools=[echo], limits=Limits(**FAST, loop_ladder=True)
    )
    result = run(agent)
    last_result = [m for m in result.messages if isinstance(m, ToolMessage)][-1]
    assert last_result.status is ToolStatus.ERROR
    assert "is no longer available in this run" in last_result.content
    assert result.output == "done"


def test_the_third_loop_ends_the_run_with_its_last_answer() -> None:
    """echo loops (nudge), then again (echo withheld), then add loops: the stop, after a
    last answer."""
    agent = Agent(
        model=stubborn("echo", "add"),
        tools=[echo, add],
        limits=Limits(**FAST, loop_ladder=True, last_answer=True),
    )
    result = run(agent)
    assert result.stop_reason is StopReason.LOOP_DETECTED
    labels = [entry.label for entry in result.trace]
    assert (labels.count("nudge"), labels.count("withhold")) == (1, 1)
    assert labels[-2:] == ["last_answer", "loop_detected"]
    assert result.last_answers == 1
    assert result.output == "I give up: here is what I have."


def test_an_agent_on_the_ladder_terminates_whatever_its_model_does() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        tools=[echo, add],
        limits=Limits(max_turns=12, loop_ladder=True, last_answer=True),
    )
    assert_terminates(agent, max_examples=200)
