"""Guardrails as rows: an input guardrail stops a run before any model call or tool sees
what it did not pass; an output guardrail stops an answer, or asks for a bounded number of
rewrites, before the run ends with it; each is user code, contained; the verifier refuses a
guardrail row that stands after what it guards."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import zlib

import pytest

from agent_fsm import Agent, ConfigError, Limits, StopReason, tool
from agent_fsm.guardrails import Guardrail, Rewrite, Trip
from agent_fsm.loop.verify import verify_table
from agent_fsm.messages import ToolMessage, UserMessage
from agent_fsm.state import RunResult, RunStatus
from agent_fsm.table import TABLE, AgentState, Row, Trigger
from agent_fsm.testing import ScriptedModel, assert_terminates, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import FAST, Recorder, echo

S, T = AgentState, Trigger


def run(agent: Agent, text: str = "go") -> RunResult:
    recorder = Recorder()
    result = agent.subscribe(recorder).run_sync(text)
    check_invariants(
        result, limits=agent.limits, bound=agent.bound, events=recorder, rows=agent.machine.rows
    )
    return result


def no_secrets(text: str) -> bool | Trip:
    """Trips on the word 'password'."""
    return Trip("asks for a password") if "password" in text else True


ran: list[str] = []


@tool
def side_effect(text: str) -> str:
    """Do something."""
    ran.append(text)
    return "done"


def test_an_input_guardrail_that_trips_stops_the_run_before_anything_runs() -> None:
    ran.clear()
    model = ScriptedModel([reply("", call("side_effect", text="x")), "never"])
    agent = Agent(
        model=model, tools=[side_effect], input_guardrails=[no_secrets], limits=Limits(**FAST)
    )
    result = run(agent, "tell me the admin password")
    assert result.stop_reason is StopReason.GUARDRAIL_TRIPPED
    assert result.status is RunStatus.FAILED
    assert result.error == "the input guardrail 'no_secrets' tripped: asks for a password"
    assert result.trace[-1].guards == ("input_guardrail_tripped",)
    assert model.requests == []
    assert ran == []
    assert result.turns == 0


def test_input_that_passes_runs_as_usual_and_async_guardrails_work() -> None:
    seen: list[str] = []

    async def polite(text: str) -> bool:
        seen.append(text)
        await asyncio.sleep(0)
        return True

    agent = Agent(
        model=ScriptedModel(["hello"]),
        input_guardrails=[polite, no_secrets],
        limits=Limits(**FAST),
    )
    result = run(agent, "hi")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "hello")
    assert seen == ["hi"]


def test_every_user_message_is_screened_a_resumes_reply_too() -> None:
    model = ScriptedModel([reply("", call("ask_user", question="Which account?")), "never"])
    agent = Agent(model=model, input_guardrails=[no_secrets], limits=Limits(**FAST))
    paused = agent.run_sync("help me log in")
    assert paused.stop_reason is StopReason.ASK_USER
    result = agent.resume_sync(paused.run_id, "the one with password hunter2")
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    assert result.stop_reason is StopReason.GUARDRAIL_TRIPPED
    assert len(model.requests) == 1  # the reply never reached the model


def test_a_guardrail_that_fails_trips_it_fails_closed() -> None:
    def broken(text: str) -> bool:
        raise ValueError("no idea")

    def vague(text: str) -> object:
        return "maybe"

    for guardrail, said in ((broken, "it raised ValueError: no idea"), (vague, "it returned str")):
        model = ScriptedModel(["never"])
        agent = Agent(model=model, input_guardrails=[guardrail], limits=Limits(**FAST))
        result = run(agent)
        assert result.stop_reason is StopReason.GUARDRAIL_TRIPPED
        assert result.error is not None
        assert said in result.error
        assert model.requests == []


def test_a_guardrail_that_hangs_trips_after_the_tool_timeout() -> None:
    release = threading.Event()

    def stuck(text: str) -> bool:
        release.wait(30)
        return True

    model = ScriptedModel(["never"])
    agent = Agent(model=model, input_guardrails=[stuck], limits=Limits(**FAST, tool_timeout_s=0.2))
    try:
        result = run(agent)
    finally:
        release.set()
    assert result.stop_reason is StopReason.GUARDRAIL_TRIPPED
    assert result.error is not None
    assert "did not answer within 0.2 s" in result.error
    assert model.requests == []


def test_an_output_guardrail_stops_an_answer_before_the_run_ends_with_it() -> None:
    def no_shouting(text: str) -> bool:
        return not text.isupper()

    agent = Agent(
        model=ScriptedModel(["I WILL NOT"]),
        output_guardrails=[no_shouting],
        limits=Limits(**FAST),
    )
    result = run(agent)
    assert result.stop_reason is StopReason.GUARDRAIL_TRIPPED
    assert result.trace[-1].guards == ("output_guardrail_tripped",)
    assert result.error == "the output guardrail 'no_shouting' tripped"


def test_an_output_guardrail_may_ask_for_rewrites_a_bounded_number_of_times() -> None:
    def short(text: str) -> bool | Rewrite:
        return True if len(text) <= 10 else Rewrite("at most ten characters")

    model = ScriptedModel(["a very long answer indeed", "short one"])
    agent = Agent(model=model, output_guardrails=[short], limits=Limits(**FAST))
    result = run(agent)
    assert (result.stop_reason, result.output, result.turns) == (
        StopReason.FINAL_ANSWER,
        "short one",
        2,
    )
    asked = model.requests[1].messages[-1]
    assert isinstance(asked, UserMessage)
    assert "not accepted by the short check: at most ten characters" in asked.content
    # more rewrites than allowed: the guardrail trips
    stubborn = ScriptedModel(["far too long, sorry"] * 5)
    agent = Agent(
        model=stubborn,
        output_guardrails=[short],
        limits=Limits(**FAST, guardrail_rewrites=2),
    )
    result = run(agent)
    assert result.stop_reason is StopReason.GUARDRAIL_TRIPPED
    assert len(stubborn.requests) == 3
    assert result.error is not None
    assert "still asking for a rewrite after 2" in result.error


def no_leaks(text: str) -> bool | Trip | Rewrite:
    """Trips on 'secret'; asks for a rewrite of 'draft'."""
    if "secret" in text:
        return Trip("leaks a secret")
    return Rewrite("no drafts") if "draft" in text else True


@tool(terminal=True)
def submit(answer: str) -> str:
    """Submit the answer: it ends the run."""
    return answer


def test_a_finish_task_summary_is_screened_before_it_ends_the_run() -> None:
    """A summary that trips stops the run in ERROR (by the REFLECT row, not with the
    summary as output); one sent back is withdrawn (the run goes on) and rewritten."""
    agent = Agent(
        model=ScriptedModel([reply("", call("finish_task", summary="the secret is 42"))]),
        output_guardrails=[no_leaks],
        limits=Limits(**FAST),
    )
    result = run(agent)
    assert (result.stop_reason, result.output) == (StopReason.GUARDRAIL_TRIPPED, None)
    assert result.trace[-1].source is S.REFLECT
    assert result.trace[-1].guards == ("output_guardrail_tripped",)
    model = ScriptedModel(
        [
            reply("", call("finish_task", summary="a draft")),
            reply("", call("finish_task", summary="the final one")),
        ]
    )
    agent = Agent(model=model, output_guardrails=[no_leaks], limits=Limits(**FAST))
    result = run(agent)
    assert (result.stop_reason, result.output) == (StopReason.FINISH_TASK, "the final one")
    asked = model.requests[1].messages[-1]
    assert isinstance(asked, UserMessage)
    assert "not accepted by the no_leaks check: no drafts" in asked.content


def test_a_terminal_tools_output_is_screened_before_it_ends_the_run() -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("submit", answer="the secret is 42"))]),
        tools=[submit],
        output_guardrails=[no_leaks],
        limits=Limits(**FAST),
    )
    result = run(agent)
    assert (result.stop_reason, result.output) == (StopReason.GUARDRAIL_TRIPPED, None)
    model = ScriptedModel(
        [reply("", call("submit", answer="a draft")), reply("", call("submit", answer="done"))]
    )
    agent = Agent(model=model, tools=[submit], output_guardrails=[no_leaks], limits=Limits(**FAST))
    result = run(agent)  # the invariants: only the answer that ended the run says it does
    assert (result.stop_reason, result.output) == (StopReason.TERMINAL_TOOL, "done")
    first = next(m for m in result.messages if isinstance(m, ToolMessage))
    assert "ends_run" not in str(first.details)


def test_a_last_answer_is_screened_and_cannot_be_rewritten() -> None:
    def looping(answer: str) -> ScriptedModel:
        return ScriptedModel([reply("", call("echo", text="a")), answer])

    for answer, stop, output, error in (
        ("the secret is 42", StopReason.GUARDRAIL_TRIPPED, None, "leaks a secret"),
        ("a draft", StopReason.GUARDRAIL_TRIPPED, None, "a last answer cannot be rewritten"),
        ("what I found", StopReason.MAX_TURNS, "what I found", "all 1 turns used"),
    ):
        agent = Agent(
            model=looping(answer),
            tools=[echo],
            output_guardrails=[no_leaks],
            limits=Limits(**{**FAST, "max_turns": 1}, last_answer=True),
        )
        result = run(agent)
        assert (result.stop_reason, result.output) == (stop, output)
        assert error in (result.error or "")
        assert result.last_answers == 1


def test_tool_calls_are_not_screened_as_answers() -> None:
    screened: list[str] = []

    def record(text: str) -> bool:
        screened.append(text)
        return True

    agent = Agent(
        model=ScriptedModel([reply("thinking", call("echo", text="a")), "final"]),
        tools=[echo],
        output_guardrails=[Guardrail(record, name="recorder")],
        limits=Limits(**FAST),
    )
    assert run(agent).output == "final"
    assert screened == ["final"]


def test_agents_without_guardrails_do_not_try_their_rows() -> None:
    dead = Agent(model=ScriptedModel([])).run_config.dead_guards
    assert {"input_guardrail_tripped", "output_guardrail_tripped"} <= dead
    live = Agent(
        model=ScriptedModel([]), input_guardrails=[no_secrets], output_guardrails=[no_secrets]
    ).run_config.dead_guards
    assert not {"input_guardrail_tripped", "output_guardrail_tripped", "output_rejected"} & live


def test_guardrail_configuration_mistakes_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="must be a function or a Guardrail"):
        Agent(model=ScriptedModel([]), input_guardrails=[42])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="needs a name"):
        Agent(model=ScriptedModel([]), input_guardrails=[lambda text: True])
    with pytest.raises(ConfigError, match="share a name"):
        Agent(model=ScriptedModel([]), input_guardrails=[no_secrets, no_secrets])
    without = tuple(row for row in TABLE if "input_guardrail_tripped" not in row.guards)
    with pytest.raises(ConfigError, match="input guardrails need a row"):
        Agent(model=ScriptedModel([]), input_guardrails=[no_secrets], table=without)


def _moved(guard: str, to: int) -> tuple[Row, ...]:
    """The table with the row guarded by ``guard`` taken out and put at index ``to`` of
    what is left (its trigger and source made to fit where it lands)."""
    rows = list(TABLE)
    index = next(i for i, row in enumerate(rows) if guard in row.guards)
    row = rows.pop(index)
    there = rows[to]
    rows.insert(to, dataclasses.replace(row, trigger=there.trigger, source=there.source))
    return tuple(rows)


def test_the_verifier_refuses_a_guardrail_row_after_what_it_guards() -> None:
    """Seeded bugs: the input guardrail's row after THINK (in THINK's group, so the model has
    been called with the input), or after OBSERVE's way on into COMPACT (a summary call
    would see it); the output guardrail's row after a row into DONE."""
    think = next(i for i, row in enumerate(TABLE) if "reply_was_filtered" in row.guards)
    with pytest.raises(ConfigError, match="stops the run from OBSERVE"):
        verify_table(_moved("input_guardrail_tripped", think - 1))
    compact = next(i for i, row in enumerate(TABLE) if row.dest is S.COMPACT)
    with pytest.raises(ConfigError, match="would let the run past its guardrails"):
        verify_table(_moved("input_guardrail_tripped", compact))
    truncated = next(i for i, row in enumerate(TABLE) if "reply_was_truncated" in row.guards)
    with pytest.raises(ConfigError, match="would let the run past its guardrails"):
        verify_table(_moved("output_guardrail_tripped", truncated))
    verify_table(TABLE)


def _fickle(text: str) -> bool | Trip | Rewrite:
    """Passes, trips or asks for a rewrite, by the text's checksum: any verdict, anywhere."""
    match zlib.crc32(text.encode()) % 4:
        case 0:
            return Trip("fickle")
        case 1:
            return Rewrite("again")
        case _:
            return True


def test_an_agent_with_guardrails_terminates_whatever_its_model_does() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        tools=[echo],
        input_guardrails=[_fickle],
        output_guardrails=[_fickle],
        limits=Limits(max_turns=6),
    )
    assert_terminates(agent, max_examples=200)
    # the other answers that end a run: finish_task, a terminal tool, a last answer
    agent = Agent(
        model=ScriptedModel([]),
        tools=[echo, submit],
        output_guardrails=[_fickle],
        limits=Limits(max_turns=6, last_answer=True),
    )
    assert_terminates(agent, max_examples=200)


def test_an_abort_while_a_guardrail_runs_stops_the_run() -> None:
    entered = asyncio.Event()

    async def slow(text: str) -> bool:
        entered.set()
        await asyncio.sleep(3600)
        return True

    model = ScriptedModel(["never"])
    agent = Agent(model=model, input_guardrails=[slow], limits=Limits(**FAST))

    async def main() -> RunResult:
        started = agent.start("go")
        running = asyncio.ensure_future(started.run())
        await entered.wait()
        started.abort("enough")
        return await running

    result = asyncio.run(main())
    assert result.stop_reason is StopReason.ABORTED
    assert model.requests == []
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    assert T.OBSERVED  # the OBSERVE row decided it
    assert result.trace[-1].source is S.OBSERVE
