"""A graceful last answer (``Limits.last_answer``): when a limit ends a run, the model gets one
tool-less call for its best answer, and the run still ends with the stop that fired."""

from __future__ import annotations

import asyncio
import io
import itertools
from typing import Any

import pytest

from agent_fsm import Agent, ClearToolResults, ConfigError, StopReason, tool
from agent_fsm.events import Event, ModelFailed, ModelRequested, ModelResponded
from agent_fsm.messages import AssistantMessage, ModelRequest, ModelResponse, UserMessage
from agent_fsm.state import RunResult, RunStatus
from agent_fsm.table import AgentState
from agent_fsm.testing import FunctionModel, ScriptedModel, call, reply
from agent_fsm.testing.invariants import check_invariants, transcript_problems
from tests.conftest import Recorder, echo, limits

ANSWER = "Best so far: echo said hello each time."


def run(agent: Agent, text: str = "Say hello, a few times.") -> tuple[Recorder, RunResult]:
    recorder = Recorder()
    result = agent.subscribe(recorder).run_sync(text)
    check_invariants(
        result, limits=agent.limits, bound=agent.bound, events=recorder, rows=agent.machine.rows
    )
    return recorder, result


def tool_turns(n: int, **usage: Any) -> list[ModelResponse]:
    """``n`` replies that each call echo with new text (no loop)."""
    return [reply("", call("echo", text=f"hello {i}"), **usage) for i in range(n)]


def researcher(usage: tuple[int, int] | None = None, answer: str = ANSWER) -> FunctionModel:
    """Calls echo with new text for as long as it is offered tools, then answers."""
    turns = itertools.count()

    def decide(request: ModelRequest) -> ModelResponse:
        if request.tools:
            return reply("", call("echo", text=f"hello {next(turns)}"), usage=usage)
        return reply(answer, usage=usage)

    return FunctionModel(decide)


def last_request(model: ScriptedModel | FunctionModel) -> ModelRequest:
    return model.requests[-1]


def assert_last_answer(
    result: RunResult, stop: StopReason, model: ScriptedModel | FunctionModel
) -> None:
    """The run ended with ``stop``, after one tool-less call whose text is its output."""
    assert result.stop_reason is stop
    assert result.status is RunStatus.FAILED
    assert result.final_state is AgentState.ERROR
    assert result.error  # says which limit, as without a last answer
    assert result.output == ANSWER
    assert result.last_answers == 1
    assert result.trace[-2].dest is AgentState.LAST_ANSWER
    assert result.trace[-1].source is AgentState.LAST_ANSWER
    assert len(model.requests) == result.turns + result.retries + 1
    request = last_request(model)
    assert request.tools == ()
    assert isinstance(request.messages[-1], UserMessage)
    assert "You cannot call tools any more" in request.messages[-1].content
    # The question and the answer join the transcript, which stays valid.
    assert result.messages[-2:] == (request.messages[-1], AssistantMessage(content=ANSWER))
    assert transcript_problems(result.messages) == []


# --- off by default -------------------------------------------------------------------------


def test_without_last_answer_a_limit_ends_the_run_with_no_more_calls() -> None:
    model = ScriptedModel([*tool_turns(2), ANSWER])
    agent = Agent(model=model, tools=[echo], limits=limits(max_turns=2))
    events, result = run(agent)
    assert result.stop_reason is StopReason.MAX_TURNS
    assert (len(model.requests), result.last_answers, result.output) == (2, 0, None)
    assert AgentState.LAST_ANSWER not in {entry.dest for entry in result.trace}
    assert not any(isinstance(e, ModelRequested) and e.last_answer for e in events)
    assert agent.bound.last_answers == 0


# --- each limit -----------------------------------------------------------------------------


def test_max_turns_gets_a_last_answer() -> None:
    model = ScriptedModel([*tool_turns(3), ANSWER])
    agent = Agent(model=model, tools=[echo], limits=limits(max_turns=3, last_answer=True))
    events, result = run(agent)
    assert_last_answer(result, StopReason.MAX_TURNS, model)
    assert result.turns == 3  # the last answer is no turn
    assert "used all the turns" in last_request(model).messages[-1].content
    assert result.trace[-2].source is AgentState.REFLECT
    responded = [e for e in events if isinstance(e, ModelResponded)]
    assert [e.last_answer for e in responded] == [False, False, False, True]
    assert agent.bound.model_calls == 3 + agent.limits.model_retries_per_run + 1


def test_a_spent_token_budget_gets_a_last_answer() -> None:
    # Each reply reports 400 tokens, few of them prompt tokens (so the estimate of the next
    # prompt stays small): the budget of 1,100 is spent by the third.
    model = researcher(usage=(10, 390))
    agent = Agent(model=model, tools=[echo], limits=limits(token_budget=1_100, last_answer=True))
    _, result = run(agent)
    assert_last_answer(result, StopReason.TOKEN_BUDGET, model)
    assert result.trace[-2].source is AgentState.REFLECT
    assert result.turns == 3
    assert "token budget" in last_request(model).messages[-1].content
    # The last answer's tokens are spent past the budget, as the limits say.
    assert result.usage.total_tokens == 4 * 400


def test_a_prompt_the_budget_cannot_afford_gets_a_last_answer_from_observe() -> None:
    @tool
    def fetch(page: int) -> str:
        """Fetch a big page."""
        return f"page {page} " + "lorem ipsum " * 400

    model = ScriptedModel([reply("", call("fetch", page=1)), ANSWER])
    agent = Agent(model=model, tools=[fetch], limits=limits(token_budget=900, last_answer=True))
    _, result = run(agent, "Read page 1.")
    assert_last_answer(result, StopReason.TOKEN_BUDGET, model)
    assert result.trace[-2].source is AgentState.OBSERVE


def test_a_loop_gets_a_last_answer_that_names_it() -> None:
    same = [reply("", call("echo", text="again")) for _ in range(3)]
    model = ScriptedModel([*same, ANSWER])
    agent = Agent(model=model, tools=[echo], limits=limits(loop_threshold=3, last_answer=True))
    _, result = run(agent)
    assert_last_answer(result, StopReason.LOOP_DETECTED, model)
    asked = last_request(model).messages[-1].content
    assert "going round in circles" in asked
    assert "echo" in asked  # what the detector found


def test_time_running_out_between_calls_gets_a_last_answer() -> None:
    ticks = itertools.count(0.0, 4.0)  # each reading of the clock is 4 "seconds" later
    model = researcher()
    agent = Agent(
        model=model,
        tools=[echo],
        limits=limits(timeout_s=10.0, last_answer=True),
        clock=lambda: next(ticks),
    )
    _, result = run(agent)
    assert_last_answer(result, StopReason.TIMEOUT, model)
    assert result.trace[-2].source is AgentState.REFLECT
    assert "run out of time" in last_request(model).messages[-1].content


def test_a_model_call_the_deadline_cancels_gets_a_last_answer() -> None:
    """The deadline fires during a call that never returns: THINK's timeout row softened."""
    calls = 0

    async def hang_then_answer(request: ModelRequest) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            await asyncio.Event().wait()  # until the run's deadline cancels it
        return ANSWER

    model = FunctionModel(hang_then_answer)
    agent = Agent(model=model, tools=[echo], limits=limits(timeout_s=0.2, last_answer=True))
    _, result = run(agent)
    assert result.stop_reason is StopReason.TIMEOUT
    assert result.trace[-2].source is AgentState.THINK
    assert (result.output, result.last_answers, len(model.requests)) == (ANSWER, 1, 2)
    assert model.requests[-1].tools == ()


# --- the stop that fired stands -------------------------------------------------------------


def test_the_stop_stands_whatever_the_last_answer_costs() -> None:
    """max_turns fired; the last answer alone spends the whole budget, and the run still
    ends with max_turns (the closing guard, not the budget guard, decides)."""
    model = ScriptedModel([*tool_turns(2, usage=(10, 5)), reply(ANSWER, usage=(50_000, 500))])
    agent = Agent(
        model=model,
        tools=[echo],
        limits=limits(max_turns=2, token_budget=10_000, last_answer=True),
    )
    _, result = run(agent)
    assert_last_answer(result, StopReason.MAX_TURNS, model)
    assert result.usage.total_tokens > agent.limits.token_budget


def test_the_run_deadline_does_not_cut_the_last_answer_short() -> None:
    """max_turns fired; the run's time runs out while the last answer is being written, and
    the answer is still taken (it has its own time limit)."""
    started: list[object] = []

    async def answer_after_the_deadline(request: ModelRequest) -> ModelResponse | str:
        if request.tools:
            return reply("", call("echo", text="hi"))
        run_state = started[0]
        while not run_state.timed_out:  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)
        return ANSWER

    model = FunctionModel(answer_after_the_deadline)
    agent = Agent(
        model=model, tools=[echo], limits=limits(max_turns=1, timeout_s=0.2, last_answer=True)
    )

    async def go() -> RunResult:
        active = agent.start("Say hi.")
        started.append(active.state)
        return await active.run()

    result = asyncio.run(go())
    assert result.stop_reason is StopReason.MAX_TURNS
    assert result.output == ANSWER


# --- a last answer that does not come -------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (RuntimeError("server down"), "the call failed: RuntimeError: server down"),
        (ConnectionError("reset"), "the call failed"),
        ("", "the reply had no text"),
        ("   ", "the reply had no text"),
    ],
)
def test_a_failed_or_empty_last_answer_leaves_no_output_and_is_not_retried(
    answer: object, why: str
) -> None:
    def model_fn(request: ModelRequest) -> Any:
        if request.tools:
            return reply("", call("echo", text="hi"))
        if isinstance(answer, BaseException):
            raise answer
        return answer

    model = FunctionModel(model_fn)
    agent = Agent(model=model, tools=[echo], limits=limits(max_turns=1, last_answer=True))
    events, result = run(agent)
    assert result.stop_reason is StopReason.MAX_TURNS
    assert result.output is None
    assert result.error == "all 1 turns used"
    assert (len(model.requests), result.last_answers) == (2, 1)  # one try, no retry
    failed = [e for e in events if isinstance(e, ModelFailed)]
    assert len(failed) == 1
    assert failed[0].message.startswith("no last answer was written: ")
    assert why in failed[0].message
    assert result.messages[-1].role == "tool"  # the transcript is as the limit left it


def test_a_model_that_returns_no_response_gives_no_last_answer() -> None:
    def model_fn(request: ModelRequest) -> Any:
        return reply("", call("echo", text="hi")) if request.tools else None

    agent = Agent(
        model=FunctionModel(model_fn), tools=[echo], limits=limits(max_turns=1, last_answer=True)
    )
    events, result = run(agent)
    assert result.output is None
    assert any("not a ModelResponse" in e.message for e in events if isinstance(e, ModelFailed))


def test_a_slow_last_answer_is_given_up_after_last_answer_timeout_s() -> None:
    async def model_fn(request: ModelRequest) -> ModelResponse:
        if request.tools:
            return reply("", call("echo", text="hi"))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    agent = Agent(
        model=FunctionModel(model_fn),
        tools=[echo],
        limits=limits(max_turns=1, last_answer=True, last_answer_timeout_s=0.1),
    )
    events, result = run(agent)
    assert (result.stop_reason, result.output) == (StopReason.MAX_TURNS, None)
    assert any("took longer than 0.1 s" in e.message for e in events if isinstance(e, ModelFailed))


def test_abort_cancels_the_last_answer_and_the_stop_stands() -> None:
    active: list[Any] = []

    async def model_fn(request: ModelRequest) -> ModelResponse:
        if request.tools:
            return reply("", call("echo", text="hi"))
        active[0].abort("the user closed the tab")
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    recorder = Recorder()
    agent = Agent(
        model=FunctionModel(model_fn),
        tools=[echo],
        limits=limits(max_turns=1, last_answer=True),
        handlers=[recorder],
    )

    async def go() -> RunResult:
        started = agent.start("Say hi.")
        active.append(started)
        return await started.run()

    result = asyncio.run(go())
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=recorder)
    assert (result.stop_reason, result.output) == (StopReason.MAX_TURNS, None)
    assert any(
        "interrupted: the user closed the tab" in e.message
        for e in recorder
        if isinstance(e, ModelFailed)
    )


def test_an_abort_before_the_last_answer_means_no_call() -> None:
    active: list[Any] = []

    def model_fn(request: ModelRequest) -> ModelResponse:
        active[0].abort("stop")  # during the only turn: REFLECT's abort row wins
        return reply("", call("echo", text="hi"))

    agent = Agent(
        model=FunctionModel(model_fn),
        tools=[echo],
        limits=limits(max_turns=1, last_answer=True),
    )

    async def go() -> RunResult:
        started = agent.start("Say hi.")
        active.append(started)
        return await started.run()

    result = asyncio.run(go())
    assert result.stop_reason is StopReason.ABORTED
    assert result.last_answers == 0


# --- what the last answer is made of --------------------------------------------------------


def test_tool_calls_in_the_last_answer_are_dropped_and_its_text_kept() -> None:
    greedy = reply(ANSWER, call("echo", text="one more"))
    model = ScriptedModel([*tool_turns(1), greedy])
    agent = Agent(model=model, tools=[echo], limits=limits(max_turns=1, last_answer=True))
    _, result = run(agent)
    assert_last_answer(result, StopReason.MAX_TURNS, model)
    assert result.messages[-1] == AssistantMessage(content=ANSWER)


def test_an_agent_writes_its_own_last_answer_prompt() -> None:
    model = ScriptedModel([*tool_turns(1), ANSWER])
    agent = Agent(
        model=model,
        tools=[echo],
        limits=limits(max_turns=1, last_answer=True),
        last_answer_prompt="Time to wrap up ({reason}). Reply in French.",
    )
    _, result = run(agent)
    assert result.output == ANSWER
    assert last_request(model).messages[-1].content == (
        "Time to wrap up (This task has used all the turns it is allowed.). Reply in French."
    )


@pytest.mark.parametrize("bad", ["", "   ", 42, b"bytes"])
def test_a_last_answer_prompt_must_be_text(bad: object) -> None:
    with pytest.raises(ConfigError, match="last_answer_prompt"):
        Agent(model=ScriptedModel([]), last_answer_prompt=bad)  # type: ignore[arg-type]


@tool
def dump(part: int) -> str:
    """Dump a big part of a log."""
    return f"part {part}\n" + "GET /items 200 3 ms\n" * 300


def test_a_last_answer_too_big_for_the_window_is_not_sent() -> None:
    # One dump is ~2,000 tokens; the window leaves 1,000 for the prompt.
    model = ScriptedModel([reply("", call("dump", part=1)), ANSWER])
    agent = Agent(
        model=model,
        tools=[dump],
        limits=limits(max_turns=1, last_answer=True, context_window=1_500, reply_tokens=500),
    )
    events, result = run(agent)
    assert (result.stop_reason, result.output) == (StopReason.MAX_TURNS, None)
    assert len(model.requests) == 1
    assert any(
        "does not fit the context window" in e.message for e in events if isinstance(e, ModelFailed)
    )


def test_a_last_answer_is_shrunk_by_the_context_policies_to_fit() -> None:
    model = ScriptedModel([reply("", call("dump", part=1)), ANSWER])
    agent = Agent(
        model=model,
        tools=[dump],
        limits=limits(max_turns=1, last_answer=True, context_window=1_500, reply_tokens=500),
        context_policy=ClearToolResults(keep_last_turns=0),
    )
    events, result = run(agent)  # the invariants check every prompt sent fit the window
    assert_last_answer(result, StopReason.MAX_TURNS, model)
    sent = [e for e in events if isinstance(e, ModelRequested) and e.last_answer]
    assert len(sent) == 1
    assert sent[0].estimated_prompt_tokens + 500 <= 1_500
    # What was sent lost the dump; the transcript kept it.
    assert "GET /items" not in "".join(m.content for m in last_request(model).messages)
    assert any("GET /items" in m.content for m in result.messages)


# --- a run that goes on ----------------------------------------------------------------------


def test_a_timed_out_run_with_its_last_answer_resumes_and_finishes() -> None:
    step = [4.0]  # each step takes 4 "seconds" of a 10-second activation, until changed
    now = [0.0]

    def clock() -> float:
        now[0] += step[0]
        return now[0]

    answers = iter([ANSWER, "All done."])

    def decide(request: ModelRequest) -> ModelResponse:
        if request.tools and len(request.messages) < 4:
            return reply("", call("echo", text="hello"))
        return reply(next(answers))

    model = FunctionModel(decide)
    recorder = Recorder()
    agent = Agent(
        model=model,
        tools=[echo],
        limits=limits(timeout_s=10.0, last_answer=True),
        clock=clock,
        handlers=[recorder],
    )
    first = agent.run_sync("Say hello.")
    assert (first.stop_reason, first.output) == (StopReason.TIMEOUT, ANSWER)
    step[0] = 0.0  # the resumed activation has all the time it needs
    resumed = agent.resume_sync(first.run_id, "Go on.")
    assert (resumed.stop_reason, resumed.output) == (StopReason.FINAL_ANSWER, "All done.")
    assert resumed.last_answers == 1
    check_invariants(resumed, limits=agent.limits, bound=agent.bound, events=recorder)


def test_events_mark_the_last_answer() -> None:
    model = ScriptedModel([*tool_turns(1), ANSWER])
    agent = Agent(model=model, tools=[echo], limits=limits(max_turns=1, last_answer=True))
    events, _ = run(agent)
    kinds: list[tuple[str, bool]] = [
        (e.kind, e.last_answer) for e in events if isinstance(e, ModelRequested | ModelResponded)
    ]
    assert kinds == [
        ("model_requested", False),
        ("model_responded", False),
        ("model_requested", True),
        ("model_responded", True),
    ]
    finished: list[Event] = [e for e in events if e.kind == "run_finished"]
    assert finished[0].output == ANSWER  # type: ignore[attr-defined]


def test_the_command_line_summary_shows_the_last_answer_of_a_failed_run() -> None:
    from agent_fsm.cli import _summary  # the summary `agent-fsm run` and `resume` print

    model = researcher()
    agent = Agent(model=model, tools=[echo], limits=limits(max_turns=1, last_answer=True))
    _, result = run(agent)
    out = io.StringIO()
    _summary(out, result)
    lines = out.getvalue().splitlines()
    assert lines[1:3] == ["error: all 1 turns used", f"last answer: {ANSWER}"]
