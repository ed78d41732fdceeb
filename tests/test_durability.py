"""Pause, steer, follow up, abort, time out and resume (issue #5), through real agents on the
scripted and function models; the durable cases on every checkpoint store."""

from __future__ import annotations

import asyncio

import pytest

from agent_fsm import Agent, AgentState, Approval, CheckpointStore, StopReason, tool
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.errors import CheckpointError, ResumeError
from agent_fsm.events import (
    AbortRequested,
    FollowUpQueued,
    ModelResponded,
    RunPaused,
    RunResumed,
    SteeringQueued,
)
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage, ToolStatus, UserMessage
from agent_fsm.state import RUN_STATE_ADAPTER, RunState, RunStatus
from agent_fsm.testing import FunctionModel, ScriptedModel, call, reply
from agent_fsm.testing.invariants import transcript_problems
from tests.conftest import Recorder, SpyStore, echo, limits
from tests.stores import Opener


def _user_texts(state_messages: object) -> list[str]:
    assert isinstance(state_messages, tuple | list)
    return [m.content for m in state_messages if isinstance(m, UserMessage)]


async def test_ask_user_pauses_and_resume_continues_with_the_reply() -> None:
    model = ScriptedModel(
        [reply("", call("ask_user", question="Which city?")), reply("Sunny in Oslo")]
    )
    agent = Agent(model=model, tools=[echo], limits=limits())
    events = Recorder()
    agent = agent.subscribe(events)
    paused = await agent.run("Weather?")
    assert (paused.status, paused.stop_reason) == (RunStatus.NEEDS_INPUT, StopReason.ASK_USER)
    assert paused.pending is not None
    assert paused.pending.text == "Which city?"
    assert [e.question for e in events if isinstance(e, RunPaused)] == ["Which city?"]

    done = await agent.resume(paused.run_id, "Oslo")
    assert (done.status, done.output) == (RunStatus.COMPLETED, "Sunny in Oslo")
    assert _user_texts(done.messages) == ["Weather?", "Oslo"]
    assert done.resumed_at == (len(paused.trace),)
    assert done.turns == 2
    assert not transcript_problems(done.messages)
    resumed = [e for e in events if isinstance(e, RunResumed)]
    assert [(e.answered, e.state) for e in resumed] == [("reply", AgentState.OBSERVE)]
    # The model saw the question answered and the reply as the last message.
    assert model.requests[-1].messages[-1] == UserMessage(content="Oslo")
    # A completed run is dropped from the in-process store, which still knows it finished.
    with pytest.raises(ResumeError, match=rf"{paused.run_id} has finished \(final_answer\)"):
        await agent.resume(paused.run_id, "again")


async def test_resume_refuses_what_does_not_fit_and_changes_nothing(
    store: CheckpointStore,
) -> None:
    agent = Agent(
        model=ScriptedModel([reply("", call("ask_user", question="Which city?"))]),
        limits=limits(),
        store=store,
    )
    paused = await agent.run("Weather?")
    before = RUN_STATE_ADAPTER.dump_json(store.load(paused.run_id))
    with pytest.raises(ResumeError, match="reply="):
        await agent.resume(paused.run_id)
    with pytest.raises(ResumeError, match="not approvals"):
        await agent.resume(paused.run_id, approvals=True, pause=paused.pending.pause)
    with pytest.raises(ResumeError, match="must be a str"):
        await agent.resume(paused.run_id, 42)  # type: ignore[arg-type]
    assert RUN_STATE_ADAPTER.dump_json(store.load(paused.run_id)) == before
    with pytest.raises(CheckpointError, match="nope"):
        await agent.resume("nope", "x")

    finished = Agent(model=ScriptedModel(["done"]), limits=limits(), store=store)
    result = await finished.run("hi")
    with pytest.raises(ResumeError, match=r"has finished \(final_answer\)"):
        await finished.resume(result.run_id, "more")


async def test_endless_follow_ups_still_stop_at_max_turns() -> None:
    agent = Agent(model=FunctionModel(lambda r: f"answer {r.turn}"), limits=limits(max_turns=5))
    run = agent.start("first")
    events = Recorder()
    run.subscribe(events)

    def keep_asking(event: object) -> None:
        if isinstance(event, ModelResponded):
            run.follow_up(f"and then? ({event.turn})")

    run.subscribe(keep_asking)
    result = await run.run()
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.MAX_TURNS)
    assert result.turns == 5
    assert _user_texts(result.messages) == ["first"] + [f"and then? ({t})" for t in range(1, 5)]
    assert sum(isinstance(e, FollowUpQueued) for e in events) == 5
    assert not transcript_problems(result.messages)


async def test_a_follow_up_waits_until_the_run_would_end() -> None:
    def model(request: ModelRequest) -> ModelResponse | str:
        if request.turn == 1:
            run.follow_up("Now in Fahrenheit")
            return reply("", call("echo", text="20C"))
        return f"reply {request.turn}"

    agent = Agent(model=FunctionModel(model), tools=[echo], limits=limits())
    run = agent.start("Temperature?")
    result = await run.run()
    # Queued during turn 1, it was not observed after the tool turn, only once turn 2's
    # final answer would have ended the run.
    assert _user_texts(result.messages) == ["Temperature?", "Now in Fahrenheit"]
    assert result.messages[-1].content == "reply 3"
    assert result.stop_reason is StopReason.FINAL_ANSWER
    labels = [entry.label for entry in result.trace]
    assert labels.count("follow_up") == 1


async def test_steering_is_observed_before_the_next_model_call() -> None:
    def model(request: ModelRequest) -> ModelResponse | str:
        if request.turn == 1:
            run.steer("Actually, use Celsius")
            return reply("", call("echo", text="x"))
        return "ok"

    agent = Agent(model=FunctionModel(model), tools=[echo], limits=limits())
    run = agent.start("Temperature?")
    events = Recorder()
    run.subscribe(events)
    result = await run.run()
    assert _user_texts(result.messages) == ["Temperature?", "Actually, use Celsius"]
    assert [e.message for e in events if isinstance(e, SteeringQueued)] == ["Actually, use Celsius"]
    with pytest.raises(Exception, match="has ended"):
        run.steer("too late")


async def test_abort_cancels_a_slow_model_call_and_the_run_can_resume() -> None:
    started = asyncio.Event()

    async def slow_then_fast(request: ModelRequest) -> str:
        if request.turn == 1:
            started.set()
            await asyncio.sleep(30)
        return "finally"

    store = SpyStore()
    agent = Agent(model=FunctionModel(slow_then_fast), limits=limits(), store=store)
    run = agent.start("Go")
    events = Recorder()
    run.subscribe(events)
    task = asyncio.create_task(run.run())
    await started.wait()
    run.abort("the user pressed stop")
    result = await asyncio.wait_for(task, 5)
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.ABORTED)
    assert result.error == "the user pressed stop"
    assert [e.reason for e in events if isinstance(e, AbortRequested)] == ["the user pressed stop"]
    assert store.load(run.run_id).state is AgentState.ERROR

    resumed = await agent.resume(run.run_id)
    assert (resumed.status, resumed.output) == (RunStatus.COMPLETED, "finally")
    assert resumed.turns == 2


async def test_the_deadline_interrupts_a_slow_model_call() -> None:
    async def never(request: ModelRequest) -> str:
        await asyncio.sleep(30)
        return "late"

    agent = Agent(model=FunctionModel(never), limits=limits(timeout_s=0.05))
    result = await asyncio.wait_for(agent.run("Go"), 5)
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.TIMEOUT)
    assert "interrupted" not in (result.error or "")
    assert result.error is not None
    assert "timed out" in result.error


async def test_a_durable_store_gets_a_checkpoint_per_transition_and_a_crash_resumes(
    open_store: Opener,
) -> None:
    script = [reply("", call("echo", text="a")), reply("done")]
    store = SpyStore()
    agent = Agent(model=ScriptedModel(script), tools=[echo], limits=limits(), store=store)
    result = await agent.run("Go", run_id="r1")
    # The start, then every transition but a turn's end that goes on (REFLECT -> OBSERVE),
    # which is saved with the next step, before anything comes in from outside.
    turn_end = (AgentState.REFLECT, AgentState.OBSERVE)
    carried = [e for e in result.trace if (e.source, e.dest) == turn_end]
    assert carried  # the run took one, and it was not saved on its own
    assert len(store.saved) == len(result.trace) + 1 - len(carried)
    assert store.load("r1").state is AgentState.DONE

    # "Crash" after each checkpoint in turn: a fresh agent resumes from it, in a store of
    # every kind, and completes with the same transcript.
    fresh_store = open_store()
    for snapshot in store.saved[:-1]:
        crashed = RUN_STATE_ADAPTER.validate_json(snapshot)
        fresh_store.delete("r1")  # its journal too: the crash came before any tool call
        fresh_store.save(crashed)
        remaining = ScriptedModel(script[crashed.turns :])
        again = Agent(model=remaining, tools=[echo], limits=limits(), store=fresh_store)
        resumed = await again.resume("r1")
        assert resumed.output == "done"
        assert resumed.messages == result.messages
        assert not transcript_problems(resumed.messages)


async def test_resuming_a_crashed_run_with_an_answer_is_refused(store: CheckpointStore) -> None:
    store.save(RunState(run_id="r", pending_input=["hi"]))
    agent = Agent(model=ScriptedModel(["x"]), limits=limits(), store=store)
    with pytest.raises(ResumeError, match="interrupted in OBSERVE"):
        await agent.resume("r", "an answer")


def _approval_agent(store: MemoryStore | None = None) -> tuple[Agent, list[str]]:
    done: list[str] = []

    @tool(requires_approval=lambda args: args["path"].startswith("/prod"))
    def delete(path: str) -> str:
        """Delete a file."""
        done.append(path)
        return f"deleted {path}"

    model = ScriptedModel(
        [
            reply(
                "",
                call("delete", path="/prod/a"),
                call("echo", text="x"),
                call("delete", path="/tmp/b"),
            ),
            reply("", call("delete", path="/prod/c")),
            "finished",
        ]
    )
    return Agent(model=model, tools=[delete, echo], limits=limits(), store=store), done


async def test_approvals_allowed_and_denied_each_reach_the_model() -> None:
    agent, done = _approval_agent()
    paused = await agent.run("Clean up")
    assert (paused.status, paused.stop_reason) == (
        RunStatus.NEEDS_INPUT,
        StopReason.APPROVAL_REQUIRED,
    )
    assert paused.pending is not None
    assert [c.arguments for c in paused.pending.pending_calls] == ['{"path": "/prod/a"}']
    assert done == ["/tmp/b"]  # the call that needed no approval ran
    assert not transcript_problems(paused.messages)  # every call answered, even the pending one
    first = paused.pending.pending_calls[0].id

    with pytest.raises(ResumeError, match="waits for approvals, not a reply"):
        await agent.resume(paused.run_id, "yes")
    with pytest.raises(ResumeError, match="no decision"):
        await agent.resume(paused.run_id, approvals={})
    with pytest.raises(ResumeError, match="not pending"):
        await agent.resume(paused.run_id, approvals={first: True, "other": False})

    paused_again = await agent.resume(paused.run_id, approvals={first: True})
    assert done == ["/tmp/b", "/prod/a"]
    decision = _user_texts(paused_again.messages)[-1]
    assert "approved and run" in decision
    assert "deleted /prod/a" in decision
    assert paused_again.stop_reason is StopReason.APPROVAL_REQUIRED

    second = paused_again.pending.pending_calls[0].id if paused_again.pending else ""
    final = await agent.resume(
        paused.run_id, approvals={second: Approval(allow=False, reason="keep /prod/c")}
    )
    assert final.output == "finished"
    assert done == ["/tmp/b", "/prod/a"]  # the denied call never ran
    denial = _user_texts(final.messages)[-1]
    assert "denied, so it was not run. Reason given: keep /prod/c" in denial
    assert not transcript_problems(final.messages)
    assert len(final.resumed_at) == 2


async def test_steering_mid_act_skips_the_calls_not_yet_started() -> None:
    ran: list[str] = []

    @tool
    def step(name: str) -> str:
        """Do one step."""
        ran.append(name)
        if name == "one":
            run.steer("Stop, do something else")
        return name

    model = ScriptedModel(
        [
            reply(
                "", call("step", name="one"), call("step", name="two"), call("step", name="three")
            ),
            "ok",
        ]
    )
    agent = Agent(model=model, tools=[step], limits=limits(), parallel_tool_calls=False)
    run = agent.start("Go")
    result = await run.run()
    assert ran == ["one"]
    results = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert [r.status for r in results] == [ToolStatus.OK, ToolStatus.SKIPPED, ToolStatus.SKIPPED]
    assert "a new user message arrived" in results[1].content
    assert _user_texts(result.messages) == ["Go", "Stop, do something else"]
    assert not transcript_problems(result.messages)


async def test_abort_during_a_slow_tool_cancels_it_and_answers_the_call(
    store: CheckpointStore,
) -> None:
    started = asyncio.Event()
    cancelled: list[bool] = []

    @tool
    async def slow(n: int) -> str:
        """Take a long time."""
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    model = ScriptedModel([reply("", call("slow", n=1), call("echo", text="fast")), "after"])
    agent = Agent(model=model, tools=[slow, echo], limits=limits(), store=store)
    run = agent.start("Go")
    task = asyncio.create_task(run.run())
    await started.wait()
    run.abort("stop now")
    result = await asyncio.wait_for(task, 5)
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.ABORTED)
    assert cancelled == [True]
    answers = {m.name: m for m in result.messages if isinstance(m, ToolMessage)}
    assert answers["slow"].status is ToolStatus.ERROR
    assert "cancel" in answers["slow"].content.lower()
    assert not transcript_problems(result.messages)
    assert store.load(run.run_id).state is AgentState.ERROR
    resumed = await agent.resume(run.run_id, "carry on")
    assert resumed.output == "after"


async def test_the_diagram_of_a_checkpointed_run_by_id() -> None:
    store = SpyStore()
    model = ScriptedModel([reply("", call("ask_user", question="Which city?")), "Sunny"])
    agent = Agent(model=model, limits=limits(), store=store)
    paused = await agent.run("Weather?", run_id="seen")
    drawn = agent.diagram(run="seen")
    assert drawn == agent.diagram(run=paused)
    assert "stopped﹕ ask_user, 1 turn (run seen)" in drawn
    # A run that has not ended (as after a crash) shows where it is.
    store.save(RUN_STATE_ADAPTER.validate_json(store.saved[2]))
    assert "run did not finish﹕ last state ACT, 1 turn" in agent.diagram(run="seen")
    with pytest.raises(CheckpointError, match="nope"):
        agent.diagram(run="nope")


async def test_denying_every_pending_call_is_no_failed_turn() -> None:
    """Nothing ran, so nothing failed: even a limit of one consecutive error is not hit."""

    @tool(requires_approval=True)
    def delete(path: str) -> str:
        """Delete a file."""
        return f"deleted {path}"

    model = ScriptedModel([reply("", call("delete", path="/prod/a")), "finished"])
    agent = Agent(model=model, tools=[delete], limits=limits(max_consecutive_errors=1))
    paused = await agent.run("Clean up")
    assert paused.pending is not None
    pending = paused.pending.pending_calls[0].id
    final = await agent.resume(paused.run_id, approvals={pending: False})
    assert (final.stop_reason, final.output) == (StopReason.FINAL_ANSWER, "finished")
