"""A turn's calls: ordering under concurrency, the concurrency limit, sequential tools, the
per-turn output limit, events, and errors counted per turn."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Collection, Sequence
from typing import Any

import structlog
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm import Limits, StopReason, Tool, tool
from agent_fsm.cancellation import StopEvent
from agent_fsm.durable.journal import ToolJournal
from agent_fsm.events import EVENT_ADAPTER, Event, EventBus, ToolFinished, ToolRetried, ToolStarted
from agent_fsm.loop.machine import AgentMachine
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus
from agent_fsm.run.acting import answer_calls
from agent_fsm.run.context import RunConfig, RunContext
from agent_fsm.run.engine import new_run_state
from agent_fsm.state import RunState
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.tools.tool import ToolRegistry
from tests.conftest import make_agent


def c(index: int, name: str, **arguments: Any) -> ToolCall:
    return ToolCall(id=f"c{index}", name=name, arguments=json.dumps(arguments))


def fresh_state() -> RunState:
    """A run in its first turn, its input already observed."""
    state = new_run_state("run", "", "go", 0)
    state.pending_input.clear()
    state.turns = 1
    return state


async def act_on(
    tools: Sequence[Tool],
    calls: Sequence[ToolCall],
    *,
    lim: Limits | None = None,
    parallel: bool = True,
    state: RunState | None = None,
    events: list[Event] | None = None,
    journal: ToolJournal | None = None,
    stop: StopEvent | None = None,
    approved: Collection[str] = (),
) -> list[ToolMessage]:
    """The ACT step's ``answer_calls`` on its own, with a context built for it."""
    config = RunConfig(
        model=ScriptedModel([]),
        tools=ToolRegistry(tools),
        limits=lim or Limits(retry_backoff_s=0, retry_backoff_max_s=0),
        machine=AgentMachine(),
        parallel_tool_calls=parallel,
    )
    ctx = RunContext(
        state=state or fresh_state(),
        config=config,
        bus=EventBus([events.append] if events is not None else []),
        stop=stop or StopEvent(),
        journal=journal,
        log=structlog.get_logger("test"),
        limits=config.limits,
        clock=time.monotonic,
        sleep=asyncio.sleep,
    )
    return await answer_calls(ctx, calls, approved)


class Tracker:
    """Counts how many calls run at once and the order they start and end in."""

    def __init__(self) -> None:
        self.running = 0
        self.most = 0
        self.log: list[str] = []

    def enter(self, tag: str) -> None:
        self.running += 1
        self.most = max(self.most, self.running)
        self.log.append(f"+{tag}")

    def leave(self, tag: str) -> None:
        self.running -= 1
        self.log.append(f"-{tag}")


def tracked_tools(tracker: Tracker) -> list[Tool]:
    @tool
    async def wait(ms: int, tag: str) -> str:
        """Wait ``ms`` milliseconds and return the tag."""
        tracker.enter(tag)
        await asyncio.sleep(ms / 1000)
        tracker.leave(tag)
        return tag

    @tool(sequential=True)
    async def alone(tag: str) -> str:
        """Must run by itself."""
        tracker.enter(tag)
        await asyncio.sleep(0.002)
        tracker.leave(tag)
        return tag

    return [wait, alone]


@settings(max_examples=25, deadline=None)
@given(delays=st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=7))
def test_results_keep_call_order_whatever_the_completion_order(delays: list[int]) -> None:
    tracker = Tracker()
    calls = [c(i, "wait", ms=ms, tag=f"t{i}") for i, ms in enumerate(delays)]
    results = asyncio.run(act_on(tracked_tools(tracker), calls))
    assert [r.tool_call_id for r in results] == [call.id for call in calls]
    assert [r.content for r in results] == [f"t{i}" for i in range(len(delays))]
    assert tracker.running == 0


def test_the_concurrency_limit_is_respected() -> None:
    tracker = Tracker()
    calls = [c(i, "wait", ms=3, tag=str(i)) for i in range(10)]
    results = asyncio.run(act_on(tracked_tools(tracker), calls, lim=Limits(max_parallel_tools=3)))
    assert tracker.most == 3
    assert [r.content for r in results] == [str(i) for i in range(10)]
    starts = [entry for entry in tracker.log if entry.startswith("+")]
    assert starts == [f"+{i}" for i in range(10)]  # calls start in call order


def test_parallel_false_runs_one_call_at_a_time_in_order() -> None:
    tracker = Tracker()
    calls = [c(i, "wait", ms=4 - i, tag=str(i)) for i in range(4)]
    asyncio.run(act_on(tracked_tools(tracker), calls, parallel=False))
    assert tracker.most == 1
    assert tracker.log == ["+0", "-0", "+1", "-1", "+2", "-2", "+3", "-3"]


def test_a_sequential_tool_runs_alone_between_the_calls_before_and_after_it() -> None:
    tracker = Tracker()
    calls = [
        c(0, "wait", ms=3, tag="a"),
        c(1, "wait", ms=1, tag="b"),
        c(2, "alone", tag="S"),
        c(3, "wait", ms=1, tag="d"),
        c(4, "wait", ms=1, tag="e"),
    ]
    results = asyncio.run(act_on(tracked_tools(tracker), calls))
    assert [r.content for r in results] == ["a", "b", "S", "d", "e"]
    position = tracker.log.index("+S")
    assert tracker.log[position + 1] == "-S"
    assert set(tracker.log[:position]) == {"+a", "-a", "+b", "-b"}
    assert tracker.most == 2


def test_the_turn_output_limit_shares_characters_fairly() -> None:
    outputs = {"small": "s" * 100, "medium": "m" * 1_000, "large": "l" * 5_000}
    tools = [Tool(name, "d", {"type": "object"}, lambda v=v: v) for name, v in outputs.items()]
    calls = [c(i, name) for i, name in enumerate(outputs)]
    lim = Limits(turn_max_output_chars=1_500, tool_max_output_chars=4_000)
    small, medium, large = asyncio.run(act_on(tools, calls, lim=lim))
    assert small.content == "s" * 100
    assert medium.content.startswith("m" * 700 + "\n[output truncated: 300 of 1,000 characters")
    assert large.content.startswith("l" * 700 + "\n[output truncated: 4,300 of 5,000 characters")
    assert large.details == {
        "runtime": {"original_chars": 5_000, "shown_chars": 700, "cut_by_turn_limit": True}
    }


def test_events_tell_start_retry_and_finish_and_survive_json() -> None:
    attempts: list[int] = []

    @tool(idempotent=True)
    def flaky(n: int) -> str:
        """Fails once."""
        attempts.append(n)
        if len(attempts) == 1:
            raise TimeoutError("slow upstream")
        return "x" * n

    events: list[Event] = []
    calls = [c(0, "flaky", n=5), c(1, "nope")]
    asyncio.run(act_on([flaky], calls, events=events))
    assert [e.kind for e in events] == [
        "tool_started",
        "tool_retried",
        "tool_finished",
        "tool_started",  # a call answered without running starts and finishes at once
        "tool_finished",
    ]
    started, retried, done, _, unknown = events
    assert isinstance(started, ToolStarted)
    assert isinstance(retried, ToolRetried)
    assert (retried.call_id, retried.attempt, retried.delay_s) == ("c0", 1, 0.0)
    assert retried.error == "Tool 'flaky' failed: TimeoutError: slow upstream"
    assert isinstance(done, ToolFinished)
    assert (done.status, done.is_error, done.output_chars, done.attempts) == (
        ToolStatus.OK,
        False,
        5,
        2,
    )
    assert done.details == {"runtime": {"attempts": 2, "retries": [
        {"attempt": 1, "error": retried.error, "delay_s": 0.0}
    ]}}  # fmt: skip
    assert done.duration_s >= 0
    assert isinstance(unknown, ToolFinished)
    assert (unknown.is_error, unknown.attempts, unknown.duration_s) == (True, 0, 0.0)
    for event in events:
        assert EVENT_ADAPTER.validate_json(EVENT_ADAPTER.dump_json(event)) == event


def test_a_model_stuck_on_a_broken_tool_stops_with_consecutive_errors() -> None:
    script = [reply("", call("boom", reason=f"try {i}"), call("nope")) for i in range(6)]
    agent, _ = make_agent(script, max_consecutive_errors=3)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.CONSECUTIVE_ERRORS
    assert result.turns == 3
