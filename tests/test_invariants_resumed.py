"""check_invariants on resumed runs (issue #7): every kind of resume passes; the same results
with their resume positions lost or moved, or with impossible resumes, are flagged."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from agent_fsm import Agent, Approval, StopReason, tool
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import ResumeError
from agent_fsm.limits import Limits
from agent_fsm.loop.verify import TerminationBound
from agent_fsm.messages import ModelRequest
from agent_fsm.state import RUN_STATE_ADAPTER, RunResult
from agent_fsm.table import AgentState, Trigger
from agent_fsm.testing import FakeClock, FunctionModel, ScriptedModel, call, reply
from agent_fsm.testing.invariants import (
    InvariantViolation,
    activations,
    check_invariants,
    state_problems,
    trace_problems,
)
from tests.conftest import Recorder, SpyStore, echo, limits


def _check(result: RunResult, agent: Agent, events: Recorder | None = None) -> None:
    assert result.resumed_at, "not a resumed run: the test would prove nothing"
    check_invariants(result, limits=agent.limits, bound=agent.bound, events=events)


def _violations(result: RunResult, agent: Agent) -> str:
    with pytest.raises(InvariantViolation) as caught:
        check_invariants(result, limits=agent.limits, bound=agent.bound)
    return str(caught.value)


async def _ask_user_run() -> tuple[Agent, RunResult, Recorder]:
    """A run that asked the user twice, resumed both times, then answered."""
    model = ScriptedModel(
        [
            reply("", call("echo", text="a")),
            reply("", call("ask_user", question="Which city?")),
            reply("", call("ask_user", question="Sure?")),
            "Sunny in Oslo",
        ]
    )
    agent = Agent(model=model, tools=[echo], limits=limits())
    events = Recorder()
    agent = agent.subscribe(events)
    paused = await agent.run("Weather?")
    again = await agent.resume(paused.run_id, "Oslo")
    assert again.stop_reason is StopReason.ASK_USER
    done = await agent.resume(paused.run_id, "yes")
    assert done.output == "Sunny in Oslo"
    return agent, done, events


# -- every kind of resume passes -------------------------------------------------------


async def test_ask_user_answered_twice() -> None:
    agent, done, events = await _ask_user_run()
    assert len(done.resumed_at) == 2
    _check(done, agent, events)


async def test_approvals_allowed_then_denied() -> None:
    @tool(requires_approval=lambda args: args["path"].startswith("/prod"))
    def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    model = ScriptedModel(
        [
            reply("", call("delete", path="/prod/a"), call("echo", text="x")),
            reply("", call("delete", path="/prod/c")),
            "finished",
        ]
    )
    agent = Agent(model=model, tools=[delete, echo], limits=limits())
    events = Recorder()
    agent = agent.subscribe(events)
    paused = await agent.run("Clean up")
    assert paused.stop_reason is StopReason.APPROVAL_REQUIRED
    again = await agent.resume(paused.run_id, approvals=True, pause=paused.pending.pause)
    assert again.stop_reason is StopReason.APPROVAL_REQUIRED
    # the approved turn continues in ACT: the resume row goes from DONE to ACT there
    resumed = again.trace[again.resumed_at[0]]
    assert (resumed.trigger, resumed.source, resumed.dest) == (
        Trigger.RESUMED,
        AgentState.DONE,
        AgentState.ACT,
    )
    _check(again, agent, events)
    final = await agent.resume(
        paused.run_id, approvals=Approval(allow=False, reason="no"), pause=again.pending.pause
    )
    assert final.output == "finished"
    _check(final, agent, events)


async def test_abort_between_steps_then_resume_with_a_reply() -> None:
    model = ScriptedModel([reply("", call("echo", text="a")), "after the abort"])
    agent = Agent(model=model, tools=[echo], limits=limits())
    events = Recorder()
    agent = agent.subscribe(events)
    run = agent.start("Go")
    await run.step()
    await run.step()  # THINK -> ACT: the abort lands in ACT
    run.abort("stop")
    aborted = await run.run()
    assert aborted.stop_reason is StopReason.ABORTED
    done = await agent.resume(run.run_id, "carry on")
    assert done.output == "after the abort"
    _check(done, agent, events)


async def test_abort_during_a_model_call_then_resume() -> None:
    started = asyncio.Event()

    async def slow_then_fast(request: ModelRequest) -> str:
        if request.turn == 1:
            started.set()
            await asyncio.sleep(30)
        return "finally"

    agent = Agent(model=FunctionModel(slow_then_fast), limits=limits())
    events = Recorder()
    agent = agent.subscribe(events)
    run = agent.start("Go")
    task = asyncio.create_task(run.run())
    await started.wait()
    run.abort("pressed stop")
    assert (await asyncio.wait_for(task, 5)).stop_reason is StopReason.ABORTED
    done = await agent.resume(run.run_id)
    assert done.output == "finally"
    _check(done, agent, events)


async def test_timeout_on_a_fake_clock_then_resume() -> None:
    clock = FakeClock()
    model = ScriptedModel([reply("", call("echo", text="a")), "in time"])
    agent = Agent(
        model=model, tools=[echo], limits=limits(timeout_s=10), clock=clock, sleep=clock.sleep
    )
    run = agent.start("Go")
    await run.step()
    clock.now += 11  # the tool turn took too long: REFLECT stops the run
    timed_out = await run.run()
    assert timed_out.stop_reason is StopReason.TIMEOUT
    done = await agent.resume(run.run_id)  # a resume restarts the clock
    assert done.output == "in time"
    _check(done, agent)


def _crash_after(snapshot: bytes, store: MemoryStore | SQLiteStore) -> str:
    """Put a checkpoint taken mid-run back into ``store``, as a crashed process leaves it."""
    state = RUN_STATE_ADAPTER.validate_json(snapshot)
    store.save(state)
    return state.run_id


SCRIPT = [reply("", call("echo", text="a")), reply("", call("echo", text="b")), "done"]


async def test_a_crash_at_every_checkpoint_resumes_from_sqlite(tmp_path: Path) -> None:
    spy = SpyStore()
    finished = await Agent(
        model=ScriptedModel(SCRIPT), tools=[echo], limits=limits(), store=spy
    ).run("Go")
    checked = 0
    for number, snapshot in enumerate(spy.saved[:-1]):
        with SQLiteStore(tmp_path / f"runs{number}.sqlite3") as store:
            run_id = _crash_after(snapshot, store)
            turns = RUN_STATE_ADAPTER.validate_json(snapshot).turns
            agent = Agent(
                model=ScriptedModel(SCRIPT[turns:]), tools=[echo], limits=limits(), store=store
            )
            run = agent.reopen(run_id)  # a fresh process: reopen, then drive it
            resumed = await run.run()
        assert resumed.messages == finished.messages
        # a crash does not break the path: the trace is the uninterrupted one, with the row
        # that restarted the step of the checkpoint where the run was reopened
        (restart,) = [i for i, e in enumerate(resumed.trace) if e.label == "restart"]
        assert resumed.resumed_at == (restart,)
        entry = resumed.trace[restart]
        assert entry.source == entry.dest == RUN_STATE_ADAPTER.validate_json(snapshot).state
        assert entry.guards == ("stopped_by_crash",)
        assert [(e.source, e.dest) for e in resumed.trace if e.label != "restart"] == [
            (e.source, e.dest) for e in finished.trace
        ]
        _check(resumed, agent)
        checked += 1
    # the start, then every transition but the last and the turn ends saved with the next step
    carried = [e for e in finished.trace if (e.source, e.dest) == ("REFLECT", "OBSERVE")]
    assert checked == len(finished.trace) - len(carried) > 0


async def test_crash_before_the_first_step_and_right_after_a_resume() -> None:
    store = MemoryStore()
    model = ScriptedModel([reply("", call("ask_user", question="Which city?")), "Sunny"])
    agent = Agent(model=model, limits=limits(), store=store)
    run = agent.start("Weather?", run_id="r")
    store.save(run.state)  # the process died before its first transition
    paused = await agent.resume("r")
    assert paused.resumed_at == (0,)
    assert paused.stop_reason is StopReason.ASK_USER
    _check(paused, agent)
    # answered, but killed before the resume row was taken: the answer was never accepted,
    # so the checkpoint still waits for it
    reopened = agent.reopen("r", "Oslo")
    assert store.load("r").pending_input == []
    with pytest.raises(ResumeError, match="pass the answer"):
        agent.reopen("r")
    # answered, the resume row taken (and checkpointed), then killed
    await reopened.step()
    assert store.load("r").state is AgentState.OBSERVE
    done = await agent.resume("r")
    assert done.resumed_at == (0, len(paused.trace), len(paused.trace) + 1)
    assert done.output == "Sunny"
    _check(done, agent)


# -- corrupted results are still flagged -------------------------------------------------


async def test_losing_the_resume_positions_is_flagged() -> None:
    agent, done, _ = await _ask_user_run()
    found = _violations(done.model_copy(update={"resumed_at": ()}), agent)
    first = done.resumed_at[0]
    assert f"transition {first} resumes the run, which was not reopened there" in found


async def test_a_resume_position_moved_off_the_jump_is_flagged() -> None:
    agent, done, _ = await _ask_user_run()
    first, second = done.resumed_at
    moved = done.model_copy(update={"resumed_at": (first - 1, second)})
    found = _violations(moved, agent)
    assert f"transition {first} resumes the run, which was not reopened there" in found


async def test_a_resume_after_a_finished_run_is_flagged() -> None:
    agent, done, _ = await _ask_user_run()
    trace = list(done.trace)
    stop = done.resumed_at[0] - 1
    trace[stop] = dataclasses.replace(trace[stop], label=StopReason.FINISH_TASK.value)
    found = _violations(done.model_copy(update={"trace": tuple(trace)}), agent)
    at = stop + 1
    assert f"transition {at} resumes the run after DONE (finish_task), which its row" in found


async def test_a_resume_in_the_wrong_state_is_flagged() -> None:
    agent, done, _ = await _ask_user_run()
    trace = list(done.trace)
    at = done.resumed_at[0]
    trace[at] = dataclasses.replace(trace[at], source=AgentState.ACT)
    found = _violations(done.model_copy(update={"trace": tuple(trace)}), agent)
    assert f"trace jumps from DONE to ACT at {at}" in found


async def test_turn_counts_going_back_across_a_resume_are_flagged() -> None:
    agent, done, _ = await _ask_user_run()
    trace = list(done.trace)
    at = done.resumed_at[-1]
    trace[at] = dataclasses.replace(trace[at], turn=0)
    found = _violations(done.model_copy(update={"trace": tuple(trace)}), agent)
    assert f"transition {at}: the turn count goes back" in found


async def test_impossible_resume_positions_are_flagged() -> None:
    agent, done, _ = await _ask_user_run()
    first, second = done.resumed_at
    backwards = _violations(done.model_copy(update={"resumed_at": (second, first)}), agent)
    assert "are not in order" in backwards
    beyond = _violations(done.model_copy(update={"resumed_at": (first, second, 99)}), agent)
    assert "are not in order" in beyond
    at_end = done.model_copy(update={"resumed_at": (first, second, len(done.trace))})
    assert "but its trace ends there" in _violations(at_end, agent)


async def test_the_bound_holds_per_activation() -> None:
    agent, done, _ = await _ask_user_run()
    sizes = activations(done.trace)
    assert sum(sizes) == len(done.trace)
    assert len(sizes) == 3  # split before each resume row
    check_invariants(done, limits=agent.limits, bound=agent.bound)
    # each activation fits max(sizes), but the whole run needs what its two resumes add
    tight = TerminationBound(
        model_calls=20, transitions=max(sizes), per_resume=len(done.trace), formula="test"
    )
    check_invariants(done, limits=agent.limits, bound=tight)
    no_room = TerminationBound(model_calls=20, transitions=max(sizes), per_resume=0, formula="t")
    with pytest.raises(InvariantViolation, match="of a run resumed 2 times"):
        check_invariants(done, limits=agent.limits, bound=no_room)
    tighter = TerminationBound(
        model_calls=20, transitions=max(sizes) - 1, per_resume=0, formula="test"
    )
    with pytest.raises(InvariantViolation, match="transitions in activation"):
        check_invariants(done, limits=agent.limits, bound=tighter)


async def test_max_turns_counts_every_activation() -> None:
    _, done, _ = await _ask_user_run()
    assert done.turns == 4
    check_invariants(done, limits=limits(max_turns=4))
    with pytest.raises(InvariantViolation, match="4 turns exceed max_turns=3"):
        check_invariants(done, limits=limits(max_turns=3))


async def test_a_crash_resume_must_continue_where_the_checkpoint_was() -> None:
    spy = SpyStore()
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[echo], limits=limits(), store=spy)
    finished = await agent.run("Go")
    store = MemoryStore()
    run_id = _crash_after(spy.saved[3], store)  # after OBSERVE -> THINK -> ACT -> REFLECT
    again = Agent(model=ScriptedModel(SCRIPT[1:]), tools=[echo], limits=limits(), store=store)
    resumed = await again.resume(run_id)
    assert resumed.resumed_at == (3,)
    _check(resumed, again)
    trace = list(resumed.trace)
    trace[3] = dataclasses.replace(trace[3], source=AgentState.OBSERVE)
    found = _violations(resumed.model_copy(update={"trace": tuple(trace)}), again)
    assert "trace jumps from REFLECT to OBSERVE at 3" in found
    assert resumed.trace[3].label == "restart"  # REFLECT, done again
    assert len(finished.trace) + 1 == len(resumed.trace)


def test_a_live_trace_resumed_but_not_yet_stepped_leads_to_its_resume_state() -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("ask_user", question="q?"))]), limits=limits()
    )
    paused = agent.run_sync("Go")
    run = agent.reopen(paused.run_id, "answer")
    trace = paused.trace
    assert run.state.resumed_at == [len(trace)]
    assert run.state.state is AgentState.DONE  # the resume row is its first step
    assert not trace_problems(trace, run.state.resumed_at, now=AgentState.DONE)
    assert trace_problems(trace, run.state.resumed_at, now=AgentState.ACT) == [
        "the trace ends in DONE, not ACT"
    ]
    entry = asyncio.run(run.step())
    assert (entry.trigger, entry.source, entry.dest) == (
        Trigger.RESUMED,
        AgentState.DONE,
        AgentState.OBSERVE,
    )


# -- an engine bug the resumed-run invariants found ---------------------------------------


async def test_resuming_after_the_last_turn_makes_no_more_model_calls() -> None:
    model = ScriptedModel(
        [reply("", call("echo", text="a")), reply("", call("ask_user", question="q?")), "x"]
    )
    agent = Agent(model=model, tools=[echo], limits=Limits(max_turns=2))
    paused = await agent.run("Go")
    assert (paused.stop_reason, paused.turns) == (StopReason.ASK_USER, 2)
    resumed = await agent.resume(paused.run_id, "answer")
    assert (resumed.stop_reason, resumed.turns) == (StopReason.MAX_TURNS, 2)
    assert resumed.messages[-1].content == "answer"  # the reply is kept, then the run stops
    check_invariants(resumed, limits=agent.limits, bound=agent.bound)


async def test_state_problems_between_steps() -> None:
    agent = Agent(model=ScriptedModel(SCRIPT), tools=[echo], limits=limits(max_turns=3))
    run = agent.start("Go")
    rows = agent.machine.rows
    seen = set()
    while not run.done:
        await run.step()
        seen.add(run.state.state)
        assert not state_problems(run.state, rows, limits=agent.limits, bound=agent.bound)
    assert AgentState.ACT in seen  # checked while a reply's calls were still to run
    acting = RUN_STATE_ADAPTER.validate_python(
        {**RUN_STATE_ADAPTER.dump_python(run.state), "state": AgentState.ACT}
    )
    acting.trace[-1] = (next(i for i, r in enumerate(rows) if r.label == "act"), 3)
    acting.turns = 4
    found = state_problems(acting, rows, limits=agent.limits, bound=agent.bound)
    assert "4 turns exceed max_turns=3" in found
    assert "the run is about to act, but its last message is no tool call" in found
