"""Each guard tripping on its own, through real runs."""

from __future__ import annotations

import itertools

from agent_fsm import Agent, AgentState, Limits, RunStatus, StopReason
from agent_fsm.messages import FinishReason, ModelRequest, ModelResponse
from agent_fsm.models import ModelCallError
from agent_fsm.state import RunState
from agent_fsm.testing import FunctionModel, ScriptedModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import echo, limits, make_agent


def _check(agent: Agent, user_input: str = "go") -> object:
    result = agent.run_sync(user_input)
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    return result


def test_final_answer() -> None:
    agent, _ = make_agent(["hello"])
    result = agent.run_sync("hi")
    assert (result.stop_reason, result.status, result.output) == (
        StopReason.FINAL_ANSWER,
        RunStatus.COMPLETED,
        "hello",
    )


def test_max_turns_with_distinct_calls() -> None:
    agent, model = make_agent(
        [reply("", call("echo", text=str(i))) for i in range(10)], max_turns=4
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.MAX_TURNS
    assert result.final_state is AgentState.ERROR
    assert result.turns == 4
    assert len(model.requests) == 4
    check_invariants(result, limits=agent.limits, bound=agent.bound)


def test_token_budget_after_a_call_from_reported_usage() -> None:
    agent, model = make_agent(
        [reply("", call("echo", text="a"), usage=(900, 200)), "never"], token_budget=1_000
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert len(model.requests) == 1
    assert result.usage.total_tokens == 1_100


def test_token_budget_before_a_call_never_starts_an_unaffordable_call() -> None:
    agent, model = make_agent(["never"], token_budget=20)
    result = agent.run_sync("a long question " * 20)
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    assert result.turns == 0
    assert model.requests == []
    assert "next prompt needs about" in (result.error or "")


def test_consecutive_tool_errors() -> None:
    agent, _ = make_agent(
        [reply("", call("boom", reason=str(i))) for i in range(5)], max_consecutive_errors=3
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.CONSECUTIVE_ERRORS
    assert result.turns == 3


def test_a_successful_call_resets_the_error_count() -> None:
    script = [
        reply("", call("boom", reason="1")),
        reply("", call("boom", reason="2")),
        reply("", call("echo", text="ok")),
        reply("", call("boom", reason="3")),
        reply("", call("boom", reason="4")),
        "done",
    ]
    agent, _ = make_agent(script, max_consecutive_errors=3)
    assert agent.run_sync("go").stop_reason is StopReason.FINAL_ANSWER


def test_permanent_model_error_ends_at_once() -> None:
    agent, model = make_agent([ModelCallError("401 invalid key", transient=False), "never"])
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.error == "401 invalid key"
    assert len(model.requests) == 1


def test_transient_model_errors_are_retried_then_stop() -> None:
    agent, model = make_agent(
        [ModelCallError("503"), TimeoutError("slow"), "recovered"], model_retries=2
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert (result.turns, result.retries) == (1, 2)
    assert [t.label for t in result.trace].count("retry") == 2

    agent, model = make_agent([ModelCallError("503")] * 5, model_retries=2)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert len(model.requests) == 3


def test_a_retry_takes_no_turn() -> None:
    """With one turn left, a failed call is still retried: max_turns counts real turns, and
    retries have their own bound."""
    agent, model = make_agent([ModelCallError("503")] * 3 + ["ok"], max_turns=1, model_retries=5)
    result = agent.run_sync("go")
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "ok")
    assert (result.turns, result.retries, len(model.requests)) == (1, 3, 4)


def test_backoff_honours_retry_after_and_grows() -> None:
    delays: list[float] = []

    async def sleep(seconds: float) -> None:
        delays.append(seconds)

    agent = Agent(
        model=ScriptedModel(
            [
                ModelCallError("429", retry_after_s=7.0),
                ModelCallError("503"),
                ModelCallError("503"),
                "ok",
            ]
        ),
        limits=Limits(retry_backoff_s=1.0, retry_backoff_max_s=3.0, max_consecutive_errors=5),
        sleep=sleep,
    )
    assert agent.run_sync("go").stop_reason is StopReason.FINAL_ANSWER
    assert delays[0] == 7.0
    assert 1.0 <= delays[1] <= 2.0  # second failure: 2 s with jitter in [0.5, 1]
    assert 1.5 <= delays[2] <= 3.0  # capped at 3 s


def test_content_filter_and_max_tokens() -> None:
    agent, _ = make_agent([reply("", finish_reason=FinishReason.CONTENT_FILTER)])
    result = agent.run_sync("go")
    assert (result.stop_reason, result.final_state) == (StopReason.CONTENT_FILTER, AgentState.ERROR)
    agent, _ = make_agent([reply("partial ans", finish_reason=FinishReason.LENGTH)])
    result = agent.run_sync("go")
    assert (result.stop_reason, result.status, result.output) == (
        StopReason.MAX_TOKENS,
        RunStatus.INCOMPLETE,
        "partial ans",
    )


def test_tool_calls_with_a_stop_finish_reason_still_act() -> None:
    agent, _ = make_agent(
        [reply("", call("echo", text="x"), finish_reason=FinishReason.STOP), "ok"]
    )
    result = agent.run_sync("go")
    assert [t.label for t in result.trace][:2] == ["think", "act"]


def test_timeout_with_a_fake_clock() -> None:
    now = itertools.count(0.0, 10.0)
    agent = Agent(
        model=ScriptedModel([reply("", call("echo", text=str(i))) for i in range(20)]),
        tools=[echo],
        limits=limits(timeout_s=45.0, max_turns=20),
        clock=lambda: float(next(now)),
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.TIMEOUT
    assert result.turns < 20


def test_loop_same_call() -> None:
    agent, _ = make_agent([reply("", call("echo", text="same"))] * 10, loop_threshold=3)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert result.turns == 3
    assert "echo" in (result.error or "")


def test_loop_same_results_from_different_calls() -> None:
    script = [reply("", call("add", a=i, b=10 - i)) for i in range(10)]
    agent, _ = make_agent(script, loop_threshold=4)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert "same tool results" in (result.error or "")
    assert result.turns == 4


def test_loop_same_text() -> None:
    # the same text with the same call: the text is seen first, in THINK (the same preamble
    # before calls that change is no loop: tests/test_newcomer.py)
    script = [reply("thinking…", call("echo", text="same")) for _ in range(10)]
    agent, _ = make_agent(script, loop_threshold=3)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert "same reply text" in (result.error or "")


def test_loop_periodic_cycle() -> None:
    a, b = call("echo", text="A"), call("add", a=1, b=2)
    agent, _ = make_agent([reply("", x) for x in [a, b] * 10], loop_threshold=3, loop_max_period=4)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    assert "cycle of 2 turns" in (result.error or "")
    assert result.turns == 6


def test_no_false_positive_on_a_long_run_of_distinct_calls() -> None:
    script = [reply(f"step {i}", call("echo", text=f"item {i}")) for i in range(300)]
    agent, _ = make_agent([*script, "all done"], max_turns=400, token_budget=10_000_000)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.turns == 301


def test_loop_detection_can_be_turned_off() -> None:
    agent, _ = make_agent(
        [reply("", call("echo", text="poll"))] * 6 + ["done"], loop_detection=False
    )
    assert agent.run_sync("go").stop_reason is StopReason.FINAL_ANSWER


def test_reflector_can_end_the_run() -> None:
    def enough(state: RunState) -> bool:
        return state.turns >= 2

    agent = Agent(
        model=ScriptedModel([reply("", call("echo", text=str(i))) for i in range(9)]),
        tools=[echo],
        limits=limits(),
        reflector=enough,
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.REFLECTOR_DONE
    assert result.status is RunStatus.COMPLETED
    assert result.turns == 2


def test_model_returning_garbage_is_a_recoverable_error() -> None:
    replies: list[object] = [None, {"text": "hi"}, "fine"]

    def garbage(request: ModelRequest) -> ModelResponse:
        return replies.pop(0)  # type: ignore[return-value]

    agent = Agent(model=FunctionModel(garbage), limits=limits())
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert result.output == "fine"
    assert (result.turns, result.retries) == (1, 2)
    assert len(result.messages) == 2  # the user message and the one good reply


def test_empty_reply_is_retried() -> None:
    agent, _ = make_agent([reply(""), reply(""), "third time"])
    result = agent.run_sync("go")
    assert result.output == "third time"
    assert (result.turns, result.retries) == (1, 2)
