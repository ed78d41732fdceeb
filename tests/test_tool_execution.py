"""Running one call: timeouts (async cancelled, sync abandoned), output limits, return values,
ToolResult, and retries with backoff on a fake clock."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import gc
import math
import threading
import time
import weakref
from typing import Any

import pytest
from pydantic import BaseModel

from agent_fsm import Agent, Limits, StopReason, Tool, ToolResult, tool
from agent_fsm.messages import ToolCall, ToolStatus
from agent_fsm.testing import ScriptedModel, call, reply
from agent_fsm.tools.execution import Executed, execute, retry_delay
from agent_fsm.tools.tool import ToolRegistry
from tests.conftest import limits


class FakeSleep:
    """Records backoff delays instead of sleeping."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)


def run(
    made: Tool,
    lim: Limits | None = None,
    sleep: FakeSleep | None = None,
    retried: list[tuple[int, str, float]] | None = None,
    **arguments: Any,
) -> Executed:
    registry = ToolRegistry([made])
    prepared = registry.prepare(call(made.name, **arguments))

    def on_retry(retried_call: ToolCall, attempt: int, error: str, delay: float) -> None:
        assert retried_call is prepared.call
        if retried is not None:
            retried.append((attempt, error, delay))

    return asyncio.run(
        execute(prepared, lim or Limits(), sleep=sleep or FakeSleep(), on_retry=on_retry)
    )


# -- timeouts and cancellation ------------------------------------------------------------


def test_an_async_tool_is_really_cancelled_at_its_timeout() -> None:
    events: list[str] = []

    @tool(timeout_s=0.02)
    async def slow() -> str:
        """Sleeps."""
        try:
            await asyncio.sleep(10)
            events.append("completed")
        except asyncio.CancelledError:
            events.append("cancelled")
            raise
        return "late"

    executed = run(slow)
    assert executed.result.content == "Tool 'slow' timed out after 0.02 s."
    assert executed.result.details == {"runtime": {"timed_out_after_s": 0.02}}
    assert events == ["cancelled"]


def test_a_sync_tool_past_its_timeout_is_abandoned_and_reported() -> None:
    release = threading.Event()
    finished = threading.Event()

    @tool(timeout_s=0.02)
    def stuck() -> str:
        """Ignores cancellation."""
        release.wait(10)
        finished.set()
        return "late"

    try:
        executed = run(stuck)
    finally:
        release.set()
    assert executed.result.is_error
    assert executed.result.content.startswith("Tool 'stuck' timed out after 0.02 s.")
    assert "abandoned" in executed.result.content
    assert executed.result.details == {"runtime": {"abandoned": True, "timed_out_after_s": 0.02}}
    assert finished.wait(5)  # the thread went on in the background; its result was discarded


def test_run_sync_returns_promptly_with_a_sync_tool_that_sleeps_far_past_its_timeout() -> None:
    release = threading.Event()

    @tool(timeout_s=0.05)
    def hangs() -> str:
        """Sleeps for a very long time."""
        release.wait(60)
        return "never seen"

    agent = Agent(
        model=ScriptedModel([reply("", call("hangs")), "gave up"]),
        tools=[hangs],
        limits=limits(),
    )
    started = time.monotonic()
    try:
        result = agent.run_sync("go")
        elapsed = time.monotonic() - started
    finally:
        release.set()
    assert result.stop_reason is StopReason.FINAL_ANSWER
    # bounds only a hang (the thread holds on for 60 s): no claim on the machine's speed
    assert elapsed < 45, f"run_sync waited {elapsed:.1f} s for an abandoned thread"
    assert "abandoned" in result.messages[-2].content


def test_parallel_calls_each_time_out_at_their_own_deadline() -> None:
    """One timer serves every deadline on a loop: a later call with an earlier deadline
    re-arms it, after each expiry it re-arms for the next deadline still watched, and a call
    with a distant deadline is left alone."""
    stopped: dict[str, float] = {}

    def sleeper(name: str, timeout_s: float, sleeps_s: float = 30) -> Tool:
        async def fn() -> str:
            try:
                await asyncio.sleep(sleeps_s)
            finally:
                stopped[name] = time.monotonic()
            return "slept"

        return Tool(name, "Sleeps.", {"type": "object"}, fn, timeout_s=timeout_s)

    tools = [sleeper("patient", 30, sleeps_s=0.4), sleeper("fast", 0.05), sleeper("middle", 0.2)]
    agent = Agent(
        model=ScriptedModel([reply("", call("patient"), call("fast"), call("middle")), "ok"]),
        tools=tools,
        limits=limits(),
    )
    started = time.monotonic()
    result = agent.run_sync("go")
    answers = {m.name: m.content for m in result.messages if m.role == "tool"}
    assert answers["patient"] == "slept"
    assert "timed out after 0.05 s" in answers["fast"]
    assert "timed out after 0.2 s" in answers["middle"]
    assert 0.05 <= stopped["fast"] - started < 0.2 <= stopped["middle"] - started
    assert stopped["middle"] < stopped["patient"]


def test_a_call_that_finishes_in_time_is_not_cancelled_by_the_shared_timer() -> None:
    @tool(timeout_s=0.05)
    async def quick() -> str:
        """Finishes well within its deadline, then the loop idles past it."""
        return "done"

    async def scenario() -> tuple[Executed, Executed]:
        registry = ToolRegistry([quick])
        first = await execute(registry.prepare(call("quick")), Limits())
        await asyncio.sleep(0.1)  # the timer armed for the first call fires with nothing due
        second = await execute(registry.prepare(call("quick")), Limits())
        return first, second

    first, second = asyncio.run(scenario())
    assert first.result.content == second.result.content == "done"


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def test_the_shared_timer_does_not_keep_finished_event_loops_alive() -> None:
    """Each run_sync makes a loop; the deadline machinery must let every one of them go."""

    @tool(timeout_s=30)
    async def quick() -> str:
        """Finishes at once, leaving the shared timer armed for its distant deadline."""
        return "done"

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def scenario() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        await execute(ToolRegistry([quick]).prepare(call("quick")), Limits())

    for _ in range(3):
        asyncio.run(scenario())
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]


def test_sync_tools_run_off_the_event_loop_thread_with_the_callers_context() -> None:
    seen: list[str] = []

    @tool
    def where() -> str:
        """Which thread?"""
        seen.extend([threading.current_thread().name, REQUEST_ID.get()])
        return "ok"

    token = REQUEST_ID.set("req-7")
    try:
        assert run(where).result.content == "ok"
    finally:
        REQUEST_ID.reset(token)
    assert seen == ["agent_fsm-tool", "req-7"]


# -- return values --------------------------------------------------------------------------


class Point(BaseModel):
    x: int
    y: int


@dataclasses.dataclass
class Pair:
    a: int
    b: str


@pytest.mark.parametrize(
    ("value", "output"),
    [
        ("plain text", "plain text"),
        ({"a": [1, 2], "é": None}, '{"a": [1, 2], "é": null}'),
        (Point(x=1, y=2), '{"x":1,"y":2}'),
        ([Point(x=1, y=2)], '[{"x": 1, "y": 2}]'),
        (Pair(1, "b"), '{"a": 1, "b": "b"}'),
        (None, "null"),
        (3.5, "3.5"),
    ],
)
def test_return_values_are_serialised_sensibly(value: object, output: str) -> None:
    made = Tool("give", "d", {"type": "object"}, lambda: value)
    result = run(made).result
    assert (result.status, result.content) == (ToolStatus.OK, output)


@pytest.mark.parametrize("value", [{1, 2}, object(), math.nan, b"bytes"])
def test_a_return_value_with_no_json_form_is_an_error_result(value: object) -> None:
    made = Tool("give", "d", {"type": "object"}, lambda: value)
    result = run(made).result
    assert result.is_error
    assert result.content.startswith(
        "Tool 'give' returned a value that cannot be sent to the model"
    )


def test_tool_result_splits_output_for_the_model_from_details_for_people() -> None:
    @tool
    def delete(path: str) -> ToolResult:
        """Delete."""
        return ToolResult(f"deleted {path}", details={"bytes": 120})

    @tool
    def refuse(path: str) -> ToolResult:
        """Refuse."""
        return ToolResult("not allowed here", is_error=True)

    ok = run(delete, path="a").result
    assert (ok.content, ok.details, ok.status) == ("deleted a", {"bytes": 120}, ToolStatus.OK)
    bad = run(refuse, path="a").result
    assert (bad.content, bad.status) == ("not allowed here", ToolStatus.ERROR)


def test_huge_output_is_cut_with_a_marker_and_the_original_size_in_details() -> None:
    @tool(max_output_chars=100)
    def dump() -> ToolResult:
        """Too much."""
        return ToolResult("x" * 1000, details=["kept"])

    result = run(dump).result
    assert result.content.startswith("x" * 100 + "\n[output truncated: 900 of 1,000 characters")
    assert "Call 'dump' again asking for less" in result.content
    assert result.details == {
        "value": ["kept"],
        "runtime": {"original_chars": 1000, "shown_chars": 100},
    }
    default = Tool("big", "d", {"type": "object"}, lambda: "y" * 50)
    assert len(run(default, Limits(tool_max_output_chars=20)).result.content.split("\n")[0]) == 20


# -- retries --------------------------------------------------------------------------------


class Flaky:
    """Fails with ``error`` the first ``failures`` times."""

    def __init__(self, failures: int, error: BaseException) -> None:
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return f"ok after {self.calls}"


def test_an_idempotent_tool_is_retried_with_exponential_backoff_and_jitter() -> None:
    flaky = Flaky(2, TimeoutError("upstream slow"))
    made = Tool("fetch", "d", {"type": "object"}, flaky, idempotent=True, max_retries=3)
    sleep = FakeSleep()
    retried: list[tuple[int, str, float]] = []
    lim = Limits(retry_backoff_s=1.0, retry_backoff_max_s=8.0)
    executed = run(made, lim, sleep, retried)
    assert (executed.result.content, executed.attempts, flaky.calls) == ("ok after 3", 3, 3)
    assert [a for a, _, _ in retried] == [1, 2]
    assert retried[0][1] == "Tool 'fetch' failed: TimeoutError: upstream slow"
    assert sleep.delays == [d for _, _, d in retried]
    assert 0.5 <= sleep.delays[0] <= 1.0
    assert 1.0 <= sleep.delays[1] <= 2.0
    runtime = executed.result.details["runtime"]  # type: ignore[index,call-overload]
    assert runtime["attempts"] == 3
    assert [r["attempt"] for r in runtime["retries"]] == [1, 2]


def test_retries_stop_at_the_limit_and_say_so() -> None:
    flaky = Flaky(10, ConnectionError("refused"))
    made = Tool(
        "fetch", "d", {"type": "object"}, flaky, idempotent=True, retry_on=(ConnectionError,)
    )
    sleep = FakeSleep()
    executed = run(made, Limits(tool_max_retries=2), sleep)
    assert flaky.calls == 3
    assert executed.attempts == 3
    assert executed.result.content == (
        "Tool 'fetch' failed: ConnectionError: refused (gave up after 3 attempts)"
    )
    assert len(sleep.delays) == 2


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5, 10])
def test_backoff_bounds(attempt: int) -> None:
    lim = Limits(retry_backoff_s=0.5, retry_backoff_max_s=3.0)
    full = min(3.0, 0.5 * 2 ** (attempt - 1))
    for _ in range(50):
        assert full / 2 <= retry_delay(attempt, lim) <= full


def test_a_tool_that_is_not_idempotent_is_never_retried() -> None:
    flaky = Flaky(1, TimeoutError("slow"))
    made = Tool("pay", "d", {"type": "object"}, flaky)
    sleep = FakeSleep()
    executed = run(made, Limits(tool_max_retries=5), sleep)
    assert (flaky.calls, executed.attempts, sleep.delays) == (1, 1, [])
    assert executed.result.is_error


def test_only_the_named_errors_are_retried() -> None:
    flaky = Flaky(1, ValueError("bad input"))
    made = Tool("fetch", "d", {"type": "object"}, flaky, idempotent=True)
    executed = run(made)
    assert (flaky.calls, executed.attempts) == (1, 1)
    assert executed.result.content == "Tool 'fetch' failed: ValueError: bad input"


def test_a_timed_out_idempotent_async_tool_is_retried() -> None:
    calls: list[int] = []

    @tool(timeout_s=0.02, idempotent=True, max_retries=1)
    async def sometimes_slow() -> str:
        """Slow the first time."""
        calls.append(1)
        if len(calls) == 1:
            await asyncio.sleep(10)
        return "fast now"

    retried: list[tuple[int, str, float]] = []
    executed = run(sometimes_slow, retried=retried)
    assert executed.result.content == "fast now"
    assert retried[0][:2] == (1, "Tool 'sometimes_slow' timed out after 0.02 s.")
