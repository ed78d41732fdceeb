"""Resume is part of the table: the resumed rows, their verification and bound, the machine
that fires them, and what each stop accepts."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from agent_fsm import Agent, Limits, StopReason
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.errors import ConfigError, ResumeError
from agent_fsm.events import Event, RunResumed, StateChanged
from agent_fsm.loop.verify import termination_bound, verify_table
from agent_fsm.models.base import ModelCallError
from agent_fsm.table import (
    TABLE,
    AgentState,
    Row,
    Trigger,
    Verb,
    resumable_stops,
)
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply

S = AgentState


async def _no_sleep(_: float) -> None:
    return None


def _resume_rows() -> list[Row]:
    return [row for row in TABLE if row.resumes]


def test_the_resumable_stops_come_from_the_rows() -> None:
    assert resumable_stops(TABLE) == {
        StopReason.ASK_USER,
        StopReason.APPROVAL_REQUIRED,
        StopReason.ABORTED,
        StopReason.TIMEOUT,
        StopReason.MODEL_ERROR,
        StopReason.CONTEXT_WINDOW,
        StopReason.SUB_AGENT_PAUSED,
    }
    without_recovery = tuple(r for r in TABLE if r.outcome is not Verb.RECOVER)
    assert StopReason.MODEL_ERROR not in resumable_stops(without_recovery)


def test_every_resume_row_leaves_a_stop_for_the_loop() -> None:
    rows = _resume_rows()
    loop = (S.OBSERVE, S.COMPACT, S.SUMMARISE, S.THINK, S.ACT, S.REFLECT, S.LAST_ANSWER)
    assert [(r.source, r.dest, r.outcome) for r in rows] == [
        (S.DONE, S.OBSERVE, Verb.ANSWER),
        (S.DONE, S.ACT, Verb.CARRY_OUT),
        (S.DONE, S.ACT, Verb.CARRY_OUT),  # a sub-agent's pause: the answer goes down to it
        (S.ERROR, S.OBSERVE, Verb.RESUME),
        (S.ERROR, S.OBSERVE, Verb.RECOVER),
        (S.ERROR, S.OBSERVE, Verb.RESUME),
        # a crash is recovered through a row too: each loop state restarts itself
        *((state, state, Verb.RESTART) for state in loop),
    ]
    assert all(r.trigger is Trigger.RESUMED and r.stop_reason is None for r in rows)
    assert [r.guards for r in rows if r.restarts] == [("stopped_by_crash",)] * len(loop)


def _with(index: int, **changes: object) -> tuple[Row, ...]:
    rows = list(TABLE)
    rows[index] = dataclasses.replace(rows[index], **changes)  # type: ignore[arg-type]
    return tuple(rows)


def test_a_resume_row_must_name_one_stop_and_stay_in_the_loop() -> None:
    first = TABLE.index(_resume_rows()[0])
    with pytest.raises(ConfigError, match="must name exactly one of"):
        verify_table(_with(first, guards=("reply_given",)))
    with pytest.raises(ConfigError, match="a resume row goes from DONE/ERROR into the loop"):
        verify_table(_with(first, dest=S.ERROR))
    with pytest.raises(ConfigError, match="outcome must be a Verb"):
        verify_table(_with(first, outcome=StopReason.ASK_USER))
    with pytest.raises(ConfigError, match="only a resumed row may"):
        verify_table(_with(first, trigger=Trigger.REFLECTED))


def test_the_bound_counts_what_each_resume_may_add() -> None:
    bound = termination_bound(TABLE, Limits(max_turns=10, model_retries_per_run=0))
    assert (bound.transitions, bound.per_resume) == (52, 6)
    assert bound.with_resumes(3) == 52 + 18
    # the most a resume may add is a crash's in THINK: the restart row, then a call whose
    # count was never saved, and the longest way on from it
    no_crash = tuple(r for r in TABLE if not r.restarts)
    assert termination_bound(no_crash, Limits(max_turns=10)).per_resume == 5
    # without the resume into ACT, a resume enters OBSERVE only: the row, then at most
    # OBSERVE -> COMPACT -> ERROR, or OBSERVE -> COMPACT -> THINK as the first of the
    # activation's turns
    only_observe = tuple(r for r in no_crash if r.outcome is not Verb.CARRY_OUT)
    assert termination_bound(only_observe, Limits(max_turns=10)).per_resume == 3


def test_the_machine_fires_the_resume_row_as_a_traced_step() -> None:
    model = ScriptedModel([reply("", call("ask_user", question="Which city?")), "Sunny."])
    seen: list[Event] = []
    agent = Agent(model=model)
    paused = agent.run_sync("Weather?")
    run = agent.reopen(paused.run_id, "Oslo")
    run.subscribe(seen.append)
    assert run.state.state is S.DONE
    assert not run.done
    result = asyncio.run(run.run())
    resumed = result.trace[len(paused.trace)]
    assert (resumed.trigger, resumed.source, resumed.dest, resumed.label) == (
        Trigger.RESUMED,
        S.DONE,
        S.OBSERVE,
        "answer",
    )
    changes = [e for e in seen if isinstance(e, StateChanged) and e.trigger == "resumed"]
    assert [(e.source, e.dest) for e in changes] == [(S.DONE, S.OBSERVE)]
    (announced,) = [e for e in seen if isinstance(e, RunResumed)]
    assert (announced.state, announced.answered) == (S.OBSERVE, "reply")
    check_invariants(result, limits=agent.limits, bound=agent.bound)


def _outage_agent(*script: object) -> Agent:
    return Agent(
        model=ScriptedModel(list(script)),  # type: ignore[arg-type]
        limits=Limits(model_retries=1, retry_backoff_s=0, retry_backoff_max_s=0),
        sleep=_no_sleep,
    )


def test_a_run_stopped_by_a_transient_model_failure_recovers_on_resume() -> None:
    down = ModelCallError("cannot reach the server", transient=True)
    agent = _outage_agent(down, down, "Back again.")
    failed = agent.run_sync("Hello?")
    assert (failed.stop_reason, failed.status) == (StopReason.MODEL_ERROR, "failed")
    assert agent.reopen(failed.run_id).resumable is False  # reopened: not stopped any more
    result = agent.resume_sync(failed.run_id)
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Back again.")
    recovered = result.trace[len(failed.trace)]
    assert (recovered.source, recovered.dest, recovered.label) == (S.ERROR, S.OBSERVE, "recover")
    assert (result.turns, result.retries) == (2, 1)  # the recovery is a new turn
    check_invariants(result, limits=agent.limits, bound=agent.bound)


def test_a_permanent_model_failure_cannot_be_resumed_and_nothing_changes() -> None:
    agent = _outage_agent(ModelCallError("401 invalid API key", transient=False))
    failed = agent.run_sync("Hello?")
    assert failed.stop_reason is StopReason.MODEL_ERROR
    before = agent.checkpoints.load(failed.run_id)
    with pytest.raises(ResumeError, match=r"401 invalid API key.*no resume row accepts it"):
        agent.resume_sync(failed.run_id)
    assert agent.checkpoints.load(failed.run_id) == before


def test_a_finished_run_is_refused_with_what_can_be_resumed() -> None:
    agent = Agent(model=ScriptedModel(["Done."]), store=MemoryStore())
    result = agent.run_sync("Hi")
    with pytest.raises(ResumeError, match=r"has finished \(final_answer\)"):
        agent.resume_sync(result.run_id)
