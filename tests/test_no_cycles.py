"""Lighter runs (issue 39, point 2): a turn and a finished run leave no reference cycle, so
the cyclic collector has nothing of a run to find (with a thousand runs at once it was 41 %
of the CPU). Every object of a finished run is freed by its reference count alone."""

from __future__ import annotations

import asyncio
import collections
import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent_fsm import Agent, Limits, SQLiteStore, tool
from agent_fsm.testing import ScriptedModel, call, reply


@tool
async def step(n: int) -> int:
    """Step."""
    return n + 1


@tool
async def slow(n: int) -> int:
    """Take a while."""
    await asyncio.sleep(3600)
    return n


@pytest.fixture
def garbage() -> Iterator[Callable[[], collections.Counter[str]]]:
    """What the cyclic collector would have to free, by type, from now on."""
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    gc.garbage.clear()

    def found() -> collections.Counter[str]:
        gc.collect()
        return collections.Counter(
            f"{getattr(type(o), '__module__', '')}.{type(o).__qualname__}" for o in gc.garbage
        )

    try:
        yield found
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _script(turns: int) -> ScriptedModel:
    return ScriptedModel([*(reply("", call("step", n=i)) for i in range(turns)), "done"])


def _on_a_loop_of_its_own(agent: Agent, *, abort_after: float | None = None) -> str | None:
    async def go() -> str | None:
        run = agent.start("go")
        if abort_after is not None:
            asyncio.get_running_loop().call_later(abort_after, run.abort, "enough")
        return (await run.run()).output

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(go())
    finally:
        loop.close()


def _agent_fsm_objects(found: collections.Counter[str]) -> dict[str, int]:
    return {name: count for name, count in found.items() if name.startswith("agent_fsm")}


def test_a_run_in_process_leaves_no_cycle(garbage: Callable[[], collections.Counter[str]]) -> None:
    agent = Agent(model=_script(5), tools=[step], limits=Limits(max_turns=10))
    agent.run_sync("warm up")  # imports, caches and the machine made before counting
    garbage()
    assert _on_a_loop_of_its_own(agent.replace(model=_script(5))) == "done"
    assert _agent_fsm_objects(garbage()) == {}


def test_a_durable_leased_run_leaves_no_cycle(
    tmp_path: Path, garbage: Callable[[], collections.Counter[str]]
) -> None:
    with SQLiteStore(tmp_path / "runs.sqlite3") as store:
        agent = Agent(
            model=_script(3), tools=[step], store=store, lease_s=30, limits=Limits(max_turns=10)
        )
        agent.run_sync("warm up")
        garbage()
        assert _on_a_loop_of_its_own(agent.replace(model=_script(3))) == "done"
        assert _agent_fsm_objects(garbage()) == {}


def test_an_aborted_run_in_the_middle_of_a_call_leaves_no_cycle(
    garbage: Callable[[], collections.Counter[str]],
) -> None:
    script = ScriptedModel([reply("", call("slow", n=1))])
    agent = Agent(model=script, tools=[slow], limits=Limits(max_turns=10))
    garbage()
    assert _on_a_loop_of_its_own(agent, abort_after=0.05) is None
    assert _agent_fsm_objects(garbage()) == {}


def test_a_turn_of_parallel_calls_leaves_no_cycle(
    garbage: Callable[[], collections.Counter[str]],
) -> None:
    """Calls of one turn that run at once (a wave: ``TurnCalls.run_wave``) leave no cycle
    either, nor does a stop scope that was never reached."""
    parallel = reply("", call("step", n=1), call("step", n=2), call("step", n=3))
    agent = Agent(model=ScriptedModel([parallel, "done"]), tools=[step])
    agent.run_sync("warm up")
    garbage()
    assert _on_a_loop_of_its_own(agent.replace(model=ScriptedModel([parallel, "done"]))) == "done"
    assert _agent_fsm_objects(garbage()) == {}
