"""Guard priority, pinned case by case through real runs."""

from __future__ import annotations

from agent_fsm import Agent, AgentState, Run, RunStatus, StopReason
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage, ToolStatus
from agent_fsm.testing import FunctionModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import limits, make_agent


def _results(messages: tuple[object, ...]) -> list[ToolMessage]:
    return [m for m in messages if isinstance(m, ToolMessage)]


def test_finish_task_on_the_last_allowed_turn_is_finish_task_not_max_turns() -> None:
    agent, _ = make_agent(
        [reply("", call("echo", text="a")), reply("", call("finish_task", summary="done"))],
        max_turns=2,
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.FINISH_TASK
    assert result.status is RunStatus.COMPLETED
    assert result.output == "done"
    assert result.turns == 2
    check_invariants(result, limits=agent.limits, bound=agent.bound)


def test_ask_user_beats_finish_task_whatever_the_order() -> None:
    for calls in (
        (call("finish_task", summary="done"), call("ask_user", question="Which city?")),
        (call("ask_user", question="Which city?"), call("finish_task", summary="done")),
    ):
        agent, _ = make_agent([reply("", *calls)])
        result = agent.run_sync("go")
        assert result.stop_reason is StopReason.ASK_USER
        assert result.status is RunStatus.NEEDS_INPUT
        assert result.output == "Which city?"
        assert result.pending is not None
        assert result.pending.text == "Which city?"
        check_invariants(result, limits=agent.limits)


def test_finish_task_three_times_in_one_reply_runs_once_and_stops() -> None:
    agent, model = make_agent(
        [
            reply(
                "",
                call("finish_task", summary="first"),
                call("echo", text="x"),
                call("finish_task", summary="second"),
                call("finish_task", summary="third"),
            )
        ]
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.FINISH_TASK
    assert result.output == "first"
    statuses = [r.status for r in _results(result.messages)]
    assert statuses == [ToolStatus.OK] + [ToolStatus.SKIPPED] * 3
    assert len(model.requests) == 1
    check_invariants(result, limits=agent.limits)


def test_control_tool_buried_among_calls_still_stops_the_run() -> None:
    agent, _ = make_agent(
        [
            reply(
                "", call("echo", text="a"), call("finish_task", summary="s"), call("echo", text="b")
            )
        ]
        * 5
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.FINISH_TASK
    assert result.turns == 1


async def test_abort_beats_everything() -> None:
    """Aborted while the model answers with control tools, on the last turn, with the
    error limit and the budget both tripped: ERROR aborted, and every call answered."""
    runs: list[Run] = []

    def decide(request: ModelRequest) -> ModelResponse:
        runs[0].abort("user pressed stop")
        return reply(
            "",
            call("finish_task", summary="s"),
            call("ask_user", question="q"),
            usage=(50_000, 10),
        )

    agent = Agent(
        model=FunctionModel(decide),
        limits=limits(max_turns=1, max_consecutive_errors=1, token_budget=1_000),
    )
    run = agent.start("go")
    runs.append(run)
    result = await run.run()
    assert result.stop_reason is StopReason.ABORTED
    assert result.final_state is AgentState.ERROR
    assert result.error == "user pressed stop"
    assert [r.status for r in _results(result.messages)] == [ToolStatus.SKIPPED] * 2
    check_invariants(result, limits=agent.limits)


def test_ask_user_on_last_turn_with_errors_and_budget_spent_still_asks() -> None:
    agent, _ = make_agent(
        [
            reply("", call("boom")),
            reply("", call("boom"), call("ask_user", question="help?"), usage=(10_000, 10)),
        ],
        max_turns=2,
        max_consecutive_errors=2,
        token_budget=5_000,
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.ASK_USER


def test_consecutive_errors_beat_budget_turns_and_loops() -> None:
    agent, _ = make_agent(
        [reply("", call("boom")), reply("", call("boom"), usage=(50_000, 10))],
        max_turns=2,
        max_consecutive_errors=2,
        token_budget=5_000,
        loop_threshold=2,
    )
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.CONSECUTIVE_ERRORS


def test_budget_beats_max_turns_beats_loop() -> None:
    agent, _ = make_agent(
        [reply("", call("echo", text="x")), reply("", call("echo", text="x"), usage=(9_000, 10))],
        max_turns=2,
        token_budget=5_000,
        loop_threshold=2,
    )
    assert agent.run_sync("go").stop_reason is StopReason.TOKEN_BUDGET
    agent, _ = make_agent(
        [reply("", call("echo", text="x")), reply("", call("echo", text="x"))],
        max_turns=2,
        loop_threshold=2,
    )
    assert agent.run_sync("go").stop_reason is StopReason.MAX_TURNS
