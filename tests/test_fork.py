"""``agent.fork(run_id, at=transition)`` (issue 36): a new run from where a stored run stood
after one of its transitions, with the transcript as it was then and the stored run's
journal, so that no call that ran is run again; its turns count on from the stored run's,
so the limits and the bound hold over the whole path."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent_fsm import Agent, Limits, StopReason, tool
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import ConfigError
from agent_fsm.messages import AssistantMessage, ToolMessage
from agent_fsm.run.engine import Run
from agent_fsm.state import RunResult
from agent_fsm.table import TABLE, AgentState
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.testing.invariants import check_invariants
from tests.conftest import limits

charged: list[int] = []


@tool
def charge(amount: int) -> str:
    """Charge a card: a side effect that must not happen twice."""
    charged.append(amount)
    return f"charged {amount}"


@pytest.fixture(autouse=True)
def _clear() -> None:
    charged.clear()


def _stored(tmp_path: Path) -> tuple[Agent, str]:
    agent = Agent(
        model=ScriptedModel([reply("", call("charge", amount=30)), "Charged 30."]),
        tools=[charge],
        limits=limits(),
        store=SQLiteStore(tmp_path / "runs.sqlite3"),
    )
    result = agent.run_sync("Charge 30.")
    assert charged == [30]
    return agent, result.run_id


def _at(agent: Agent, run_id: str, source: str, dest: str) -> int:
    trace = agent.checkpoints.load(run_id).trace
    return next(
        n
        for n, (index, _) in enumerate(trace, start=1)
        if (TABLE[index].source, TABLE[index].dest) == (source, dest)
    )


def test_a_fork_before_act_answers_the_calls_from_the_journal(tmp_path: Path) -> None:
    agent, run_id = _stored(tmp_path)
    at = _at(agent, run_id, "THINK", "ACT")
    other = agent.replace(model=ScriptedModel(["Done, differently."]))
    run = other.fork(run_id, at=at, fork_id="forked")
    assert run.state.state is AgentState.ACT
    result = _drive(run)
    assert charged == [30]  # not charged again
    assert result.output == "Done, differently."
    assert result.run_id == "forked"
    answers = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert [a.content for a in answers] == ["charged 30"]
    assert answers[0].details == {"runtime": {"replayed": True}}
    check_invariants(result, limits=other.limits, bound=other.bound)
    assert agent.checkpoints.load(run_id).output == "Charged 30."  # the stored run unchanged


def _drive(run: Run) -> RunResult:
    return asyncio.run(run.run())


def test_a_fork_after_the_tools_asks_the_new_model_and_counts_turns_on(tmp_path: Path) -> None:
    agent, run_id = _stored(tmp_path)
    at = _at(agent, run_id, "REFLECT", "OBSERVE")
    other = agent.replace(model=ScriptedModel(["Another ending."]))
    result = _drive(other.fork(run_id, at=at))
    assert result.output == "Another ending."
    assert result.turns == 2  # one stored, one new
    replies = [m for m in result.messages if isinstance(m, AssistantMessage)]
    assert [r.content for r in replies] == ["", "Another ending."]
    assert charged == [30]


def test_the_turn_limit_holds_over_the_stored_run_and_the_fork(tmp_path: Path) -> None:
    agent, run_id = _stored(tmp_path)
    at = _at(agent, run_id, "REFLECT", "OBSERVE")
    tight = agent.replace(
        model=ScriptedModel(["never asked"]), limits=Limits(max_turns=1, token_budget=100_000)
    )
    result = _drive(tight.fork(run_id, at=at))
    assert result.stop_reason is StopReason.MAX_TURNS
    assert result.turns == 1


def test_a_fork_must_name_a_transition_that_did_not_end_the_run(tmp_path: Path) -> None:
    agent, run_id = _stored(tmp_path)
    last = len(agent.checkpoints.load(run_id).trace)
    for wrong in (0, last + 1, True, "2"):
        with pytest.raises(ConfigError, match="fork at one of them"):
            agent.fork(run_id, at=wrong)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ended it"):
        agent.fork(run_id, at=last)
    with pytest.raises(ConfigError):
        agent.fork(run_id, at=1, fork_id=run_id)  # a run the store holds


def test_a_fork_at_every_transition_keeps_the_run_invariants_and_runs_no_call_twice(
    tmp_path: Path,
) -> None:
    agent = Agent(
        model=ScriptedModel(
            [
                reply("", call("charge", amount=10)),
                reply("", call("charge", amount=20), call("charge", amount=5)),
                "Charged 35.",
            ]
        ),
        tools=[charge],
        limits=limits(),
        store=SQLiteStore(tmp_path / "runs.sqlite3"),
    )
    stored = agent.run_sync("Charge 10, then 20 and 5.")
    assert charged == [10, 20, 5]
    forks = 0
    for at, entry in enumerate(stored.trace, start=1):
        if entry.dest in (AgentState.DONE, AgentState.ERROR):
            continue
        other = agent.replace(model=ScriptedModel(["Fork answer."] * 3))
        result = _drive(other.fork(stored.run_id, at=at))
        check_invariants(result, limits=other.limits, bound=other.bound)
        assert result.output == "Fork answer.", (at, entry)
        assert result.trace[:at] == stored.trace[:at]
        assert charged == [10, 20, 5], (at, entry)  # every call the stored run made: no more
        forks += 1
    assert forks == len(stored.trace) - 1
