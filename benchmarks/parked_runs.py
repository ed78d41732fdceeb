"""Memory per live run: many runs of one agent parked at once, each inside its fifth tool call.

A server holding thousands of conversations holds them mid-tool (a tool waiting on I/O) far
longer than it spends computing. This script starts ``--runs`` runs of one ``Agent`` on one
event loop (a stateless instant model: each reply calls ``step`` until ``--turns`` results
are in), each run's last tool call waiting on an ``asyncio.Event``; once all are parked it
reports the memory they hold per run:

- RSS (``/proc/self/statm``) grown since before the runs, measured in its own pass with
  tracemalloc off (tracemalloc's own records would count in the RSS);
- tracemalloc's count of the same (Python allocations only; the steadier figure), and its top
  allocation sites, so a change can be aimed at what holds the memory.

- what the cyclic collector sees of a parked run, measured in a pass of its own with the
  collector off: the objects of the kinds it manages made and not freed since before the runs
  (``gc.get_count()``: what makes its passes come, one young pass per 700 by default), the
  ones it still tracks after a pass (``gc.get_objects()``: what each later pass looks at; a
  pass lets go of the tuples and dicts that hold atomic values only), and the most frequent
  types of these (issue 39).

It then releases every run and checks that each ended as scripted.

    python benchmarks/parked_runs.py [--runs 1000 10000] [--turns 5] [--top 12]

A bare asyncio task parked on an event is measured the same way, as the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from agent_fsm import Agent, Limits, tool
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage
from agent_fsm.testing import reply

PAGE = os.sysconf("SC_PAGE_SIZE")
Start = Callable[[asyncio.Event, list[int]], Awaitable[list["asyncio.Future[Any]"]]]


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


class _Stepper:
    """An instant model that keeps no record: it calls ``step`` until ``turns`` results are in."""

    name = "stepper"

    def __init__(self, turns: int) -> None:
        self._turns = turns

    async def request(self, request: ModelRequest) -> ModelResponse:
        done = sum(isinstance(m, ToolMessage) for m in request.messages)
        if done < self._turns:
            step = ToolCall(id=f"call_{done}", name="step", arguments=f'{{"n": {done}}}')
            return reply("", step, usage=(10, 2))  # ids of its own, as providers give
        return reply("done", usage=(10, 2))


def _agent(turns: int, gate: asyncio.Event, parked: list[int]) -> Agent:
    @tool
    async def step(n: int) -> int:
        """Return n + 1; the last turn's call waits for the gate."""
        if n == turns - 1:
            parked.append(n)
            await gate.wait()
        return n + 1

    # Parked for as long as the measurement takes: 10,000 runs on a busy machine can take
    # longer to park than the default tool timeout, and a call that times out ends its run.
    limits = Limits(max_turns=turns + 1, tool_timeout_s=3600.0, timeout_s=3600.0)
    return Agent(model=_Stepper(turns), tools=[step], limits=limits)


async def _measure(runs: int, start: Start, traced: bool, top: int) -> tuple[float, list[Any]]:
    """Bytes per run parked (RSS, or tracemalloc's when ``traced``) and the top sites."""
    gate, parked = asyncio.Event(), []
    gc.collect()
    if traced:
        tracemalloc.start(1)
        before: Any = tracemalloc.take_snapshot()
    else:
        before = _rss()
    tasks = await start(gate, parked)
    while len(parked) < runs:
        await asyncio.sleep(0.01)
    gc.collect()
    sites: list[Any] = []
    if traced:
        after = tracemalloc.take_snapshot()
        grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
        sites = after.compare_to(before, "lineno")[:top]
        tracemalloc.stop()
    else:
        grown = _rss() - before
    await _release(gate, tasks)
    return grown / runs, sites


async def _census(runs: int, start: Start, top: int) -> tuple[float, float, list[Any]]:
    """Per run parked, with the collector off until then: the objects of its kinds made and
    not freed, the ones it tracks after a pass, and the most frequent types of these."""
    gate, parked = asyncio.Event(), []
    gc.collect()
    gc.disable()
    try:
        before = Counter(type(o).__qualname__ for o in gc.get_objects())
        made = gc.get_count()[0]
        tasks = await start(gate, parked)
        while len(parked) < runs:
            await asyncio.sleep(0)
        made = gc.get_count()[0] - made
        gc.collect()  # lets go of the tuples and dicts that hold atomic values only
        tracked = Counter(type(o).__qualname__ for o in gc.get_objects())
        tracked.subtract(before)
        del before  # the counters themselves are not tracked (a dict of str and int)
    finally:
        gc.enable()
    await _release(gate, tasks)
    kinds = [(name, count / runs) for name, count in tracked.most_common(top)]
    return made / runs, tracked.total() / runs, kinds


async def _release(gate: asyncio.Event, tasks: list[asyncio.Future[Any]]) -> None:
    gate.set()
    results = await asyncio.gather(*tasks)
    if any(getattr(result, "output", result) != "done" for result in results):
        raise SystemExit("the workload did not run as intended")


def _agent_runs(turns: int) -> Callable[[int], Start]:
    def starter(runs: int) -> Start:
        async def start(gate: asyncio.Event, parked: list[int]) -> list[asyncio.Future[Any]]:
            agent = _agent(turns, gate, parked)
            return [asyncio.ensure_future(agent.run("go")) for _ in range(runs)]

        return start

    return starter


def _bare_tasks(runs: int) -> Start:
    async def start(gate: asyncio.Event, parked: list[int]) -> list[asyncio.Future[Any]]:
        async def wait() -> str:
            parked.append(0)
            await gate.wait()
            return "done"

        return [asyncio.ensure_future(wait()) for _ in range(runs)]

    return start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--turns", type=int, default=5, help="the turn whose tool call parks")
    parser.add_argument("--top", type=int, default=12, help="allocation sites to list")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    agent_runs = _agent_runs(args.turns)
    asyncio.run(_measure(10, agent_runs(10), False, 0))  # imports and caches first
    for runs in args.runs:
        rss, _ = asyncio.run(_measure(runs, agent_runs(runs), False, 0))
        traced, sites = asyncio.run(_measure(runs, agent_runs(runs), True, args.top))
        bare_rss, _ = asyncio.run(_measure(runs, _bare_tasks(runs), False, 0))
        bare_traced, _ = asyncio.run(_measure(runs, _bare_tasks(runs), True, 0))
        print(f"{runs} runs of one agent, parked in tool call {args.turns}:")
        print(f"  RSS per run:    {rss / 1024:6.1f} KiB   (bare task {bare_rss / 1024:.1f} KiB)")
        print(
            f"  traced per run: {traced / 1024:6.1f} KiB   (bare task {bare_traced / 1024:.1f} KiB)"
        )
        for stat in sites:
            frame = stat.traceback[0]
            where = f"{os.path.relpath(frame.filename)}:{frame.lineno}"
            per_run, blocks = stat.size_diff / runs, stat.count_diff / runs
            print(f"    {per_run:7.0f} B/run {blocks:5.1f} blocks  {where}")
        made, tracked, kinds = asyncio.run(_census(runs, agent_runs(runs), args.top))
        bare_made, bare_tracked, _ = asyncio.run(_census(runs, _bare_tasks(runs), 0))
        print(
            f"  collector's objects per run: {made:5.1f} made, {tracked:5.1f} tracked"
            f"   (bare task {bare_made:.1f}, {bare_tracked:.1f})"
        )
        print("    " + ", ".join(f"{name} {count:.1f}" for name, count in kinds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
