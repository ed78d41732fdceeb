"""One timer per event loop behind every deadline (``agent_fsm.watchdog``): each run's
deadline still cuts its run, at its own time, without a timer of its own (issue 39)."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import weakref
from typing import Any

from agent_fsm import Agent, Limits, StopReason, tool
from agent_fsm.run.residence import loop_deadline
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.tools.execution import execute
from agent_fsm.tools.tool import ToolRegistry
from agent_fsm.watchdog import Watchdog

HELD: contextvars.ContextVar[object] = contextvars.ContextVar("held")


@tool
async def slow(n: int) -> int:
    """Take an hour."""
    await asyncio.sleep(3600)
    return n


@tool
async def quick(n: int) -> int:
    """Return at once."""
    return n


def _agent(tools: list[Any], timeout_s: float = 600.0) -> Agent:
    script = ScriptedModel([reply("", call(tools[0].name, n=1)), "done"])
    return Agent(model=script, tools=tools, limits=Limits(max_turns=3, timeout_s=timeout_s))


def test_runs_on_one_loop_each_end_at_their_own_deadline() -> None:
    timeouts = (0.05, 0.3, 0.15)

    async def all_of_them() -> list[tuple[StopReason, float]]:
        loop = asyncio.get_running_loop()

        async def one(timeout_s: float) -> tuple[StopReason, float]:
            started = loop.time()
            result = await _agent([slow], timeout_s).run("go")
            return result.stop_reason, loop.time() - started

        return await asyncio.gather(*(one(timeout_s) for timeout_s in timeouts))

    ended = asyncio.run(all_of_them())
    assert [stop for stop, _ in ended] == [StopReason.TIMEOUT] * 3
    for (_, took), timeout_s in zip(ended, timeouts, strict=True):
        assert took >= timeout_s - 0.01  # none was cut at another run's (earlier) deadline


def test_runs_that_end_before_their_deadline_set_no_timer_each() -> None:
    """A timer per run, cancelled when the run ends, would stay in the loop's heap until its
    deadline (ten minutes by default)."""
    timers: list[float] = []

    async def many() -> list[str | None]:
        loop = asyncio.get_running_loop()
        call_at = loop.call_at

        def counted(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
            timers.append(when)
            return call_at(when, *args, **kwargs)

        loop.call_at = counted  # type: ignore[method-assign,assignment]  # call_later too
        results = await asyncio.gather(*(_agent([quick]).run("go") for _ in range(20)))
        return [result.output for result in results]

    assert asyncio.run(many()) == ["done"] * 20
    assert len(timers) <= 2  # the first run's deadline, and its first tool call's


def test_a_deadline_that_fails_to_expire_does_not_stop_the_others() -> None:
    expired: list[str] = []
    reported: list[BaseException] = []

    class Due:
        def __init__(self, name: str, when: float) -> None:
            self.name, self.when = name, when

        def expire(self) -> None:
            expired.append(self.name)
            if self.name == "later":
                last.set()
            if self.name == "broken":
                raise RuntimeError("broken deadline")

    last = asyncio.Event()

    async def fire() -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(context["exception"]))
        watchdog, now = Watchdog(loop), loop.time()
        for name in ("broken", "fine", "later"):
            watchdog.watch(Due(name, now + (0.05 if name == "later" else 0.0)), loop)
        await asyncio.wait_for(last.wait(), 60)  # however loaded the machine: no race

    asyncio.run(fire())
    assert sorted(expired[:2]) == ["broken", "fine"]
    assert expired[2:] == ["later"]  # the timer was armed again after the failure
    assert [str(error) for error in reported] == ["broken deadline"]


def test_the_timer_keeps_no_context_of_the_task_that_armed_it() -> None:
    """The one timer is armed by whichever run or call comes first; it must not keep that
    task's context variables (a request's, a parent run's) alive until it fires."""

    class Value:
        pass

    kept: list[weakref.ref[Value]] = []

    @tool(timeout_s=3600)
    async def instant() -> str:
        """Return at once, leaving the timer armed for an hour from now."""
        return "done"

    async def arm() -> None:
        value = Value()
        kept.append(weakref.ref(value))
        HELD.set(value)
        await execute(ToolRegistry([instant]).prepare(call("instant")), Limits())
        loop_deadline(7200, lambda: None).cancel()

    async def scenario() -> None:
        await asyncio.get_running_loop().create_task(arm(), context=contextvars.Context())
        for _ in range(3):  # the loop lets the finished task go
            await asyncio.sleep(0)
        gc.collect()
        assert kept[0]() is None

    asyncio.run(scenario())
