"""StopEvent and StopScope: how a run cancels the model or tool call in flight, in its own task."""

from __future__ import annotations

import asyncio

import pytest

from agent_fsm import Agent, AgentState, StopReason, tool
from agent_fsm.cancellation import REGRACE_S, StopEvent, StopScope
from agent_fsm.events import Event, ToolStarted
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.testing import ScriptedModel, call, check_invariants, reply
from tests.conftest import echo, limits


def test_a_stop_event_calls_back_once_in_order_even_if_one_callback_raises() -> None:
    woken: list[str] = []
    stop = StopEvent()

    def broken() -> None:
        woken.append("broken")
        raise ValueError("observer bug")

    stop.add_callback(lambda: woken.append("first"))
    stop.add_callback(broken)
    stop.add_callback(lambda: woken.append("last"))
    stop.remove_callback(lambda: None)  # unknown callbacks are ignored
    with pytest.raises(ValueError, match="observer bug"):
        stop.set()
    assert stop.is_set()
    assert woken == ["first", "broken", "last"]
    stop.set()  # setting again calls nobody twice
    assert woken == ["first", "broken", "last"]
    stop.add_callback(lambda: woken.append("late"))  # already set: called at once
    assert woken[-1] == "late"


def test_removed_callbacks_are_not_called_and_the_others_keep_their_order() -> None:
    woken: list[str] = []
    stop = StopEvent()
    callbacks = {name: (lambda name=name: woken.append(name)) for name in "abcde"}
    for name in "abcd":
        stop.add_callback(callbacks[name])
    stop.remove_callback(callbacks["a"])  # the first: the next one keeps its turn
    stop.remove_callback(callbacks["c"])  # one in the middle
    stop.remove_callback(callbacks["a"])  # gone already: ignored
    stop.add_callback(callbacks["e"])
    stop.set()
    assert woken == ["b", "d", "e"]


def test_a_callback_removed_alone_leaves_nothing_to_call() -> None:
    woken: list[str] = []
    stop = StopEvent()
    first = lambda: woken.append("first")  # noqa: E731
    stop.add_callback(first)
    stop.remove_callback(first)
    stop.add_callback(lambda: woken.append("second"))
    stop.set()
    assert woken == ["second"]


async def test_scopes_inside_scopes_of_other_tasks_each_stop() -> None:
    """Scopes of several tasks on one event (a run's parallel sub-agent calls) are all
    reached, whichever left first."""
    stop = StopEvent()
    stopped: list[int] = []

    async def scoped(number: int, leaves_at_once: bool) -> None:
        with StopScope(stop) as scope:
            if not leaves_at_once:
                await asyncio.sleep(3600)
        if scope.stopped:
            stopped.append(number)

    tasks = [asyncio.ensure_future(scoped(n, n == 1)) for n in range(3)]
    await asyncio.sleep(0)
    stop.set()
    await asyncio.gather(*tasks)
    assert sorted(stopped) == [0, 2]


async def test_a_scope_cancels_the_await_inside_it_and_absorbs_that_cancellation() -> None:
    stop = StopEvent()
    unwound: list[str] = []

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            unwound.append("work")
        return "never"

    asyncio.get_running_loop().call_later(0.01, stop.set)
    with StopScope(stop) as scope:
        await work()
    assert scope.stopped
    assert unwound == ["work"]
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0
    await asyncio.sleep(0)  # no cancellation is left pending on the task


async def test_a_scope_whose_work_finishes_first_is_not_stopped() -> None:
    stop = StopEvent()
    with StopScope(stop) as scope:
        await asyncio.sleep(0)
    assert not scope.stopped
    stop.set()  # after the scope: nothing to cancel
    await asyncio.sleep(0.01)
    assert not scope.stopped


async def test_setting_the_stop_from_inside_the_task_stops_it_at_its_next_await() -> None:
    """An event handler or a tool may call abort() in the run's own task: the work is not
    interrupted mid-statement, it is cancelled where it next waits."""
    stop = StopEvent()
    reached: list[str] = []
    with StopScope(stop) as scope:
        stop.set()
        reached.append("after set")  # still running: nothing was raised synchronously
        await asyncio.sleep(30)
        reached.append("never")
    assert scope.stopped
    assert reached == ["after set"]


async def test_a_cancellation_from_elsewhere_still_propagates() -> None:
    stop = StopEvent()
    entered = asyncio.Event()

    async def inner() -> None:
        with StopScope(stop):
            entered.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(inner())
    await entered.wait()
    task.cancel()
    stop.set()  # both: the outside cancellation must win
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_work_that_suppresses_the_cancellation_is_cancelled_again() -> None:
    stop = StopEvent()
    swallowed: list[int] = []

    async def stubborn() -> str:
        for attempt in range(2):  # swallows the first cancellation, then gives in
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                swallowed.append(attempt)
                if attempt == 1:
                    raise
        return "never"

    loop = asyncio.get_running_loop()
    loop.call_later(0.01, stop.set)
    started = loop.time()
    with StopScope(stop) as scope:
        await stubborn()
    elapsed = loop.time() - started
    assert scope.stopped
    assert swallowed == [0, 1]
    assert REGRACE_S <= elapsed < 5
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_work_that_ignores_the_cancellation_and_returns_leaves_no_cancellation() -> None:
    stop = StopEvent()

    async def ignores() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "ignored it"
        return "slept"

    asyncio.get_running_loop().call_later(0.01, stop.set)
    with StopScope(stop) as scope:
        outcome = await ignores()
    assert (scope.stopped, outcome) == (True, "ignored it")
    await asyncio.sleep(REGRACE_S * 2)  # the re-cancel timer is gone with the scope


def test_a_scope_outside_an_event_loop_is_refused() -> None:
    with pytest.raises(RuntimeError, match="no running event loop"), StopScope(StopEvent()):
        pass


# -- through a run ---------------------------------------------------------------------------


async def test_abort_reaches_a_tool_that_suppresses_its_first_cancellation() -> None:
    seen: list[str] = []

    @tool
    async def stubborn() -> str:
        """Ignores the first request to stop."""
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("swallowed")
        await asyncio.sleep(30)
        return "never"

    agent = Agent(
        model=ScriptedModel([reply("", call("stubborn"), call("echo", text="x"))]),
        tools=[stubborn, echo],
        limits=limits(),
        parallel_tool_calls=False,
    )
    run = agent.start("Go")
    loop = asyncio.get_running_loop()
    loop.call_later(0.02, run.abort, "the user pressed stop")
    started = loop.time()
    result = await asyncio.wait_for(run.run(), 5)
    assert loop.time() - started >= REGRACE_S
    assert seen == ["swallowed"]
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.ABORTED)
    cancelled, skipped = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert cancelled.content == "Tool 'stubborn' was cancelled because the run was stopped."
    assert skipped.status is ToolStatus.SKIPPED
    check_invariants(result, limits=agent.limits)


async def test_an_event_handler_may_abort_the_run_from_inside_its_own_task() -> None:
    """abort() called synchronously in the run's task (here by a subscriber seeing the tool
    start) stops the tool at its first await, not in the middle of the handler."""

    @tool
    async def slow() -> str:
        """Takes ages."""
        await asyncio.sleep(30)
        return "never"

    agent = Agent(model=ScriptedModel([reply("", call("slow"))]), tools=[slow], limits=limits())
    run = agent.start("Go")

    def stop_on_start(event: Event) -> None:
        if isinstance(event, ToolStarted):
            run.abort("stopped by an observer")

    run.subscribe(stop_on_start)
    result = await asyncio.wait_for(run.run(), 5)
    assert (result.stop_reason, result.error) == (StopReason.ABORTED, "stopped by an observer")
    (answer,) = [m for m in result.messages if isinstance(m, ToolMessage)]
    assert answer.content == "Tool 'slow' was cancelled because the run was stopped."
    check_invariants(result, limits=agent.limits)
