"""A thousand runs at once, with the cyclic collector on and off: how much of the CPU the
collector takes (issue 39: 41 % before the runs stopped leaving reference cycles).

Each run makes ``--turns`` tool turns (an instant fake model, one async tool call per turn,
events unsubscribed) and all ``--runs`` are driven together on one event loop. The script
reports the process CPU time of the whole batch with the collector on and off, the time the
collector's passes took (``gc.callbacks``), and how many objects they freed.

    python benchmarks/concurrent_runs.py [--runs 1000] [--turns 5] [--repeat 3]

CPU times on a shared machine move with its load: compare the two figures of one
invocation, and repeat (the median of ``--repeat`` is shown).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import statistics
import time
from typing import Any

import structlog

from agent_fsm import Agent, Limits, tool
from agent_fsm.testing import ScriptedModel, call, reply


@tool
async def step(n: int) -> int:
    """Return n + 1."""
    return n + 1


def _agent(turns: int) -> Agent:
    script = [*(reply("", call("step", n=i)) for i in range(turns)), "done"]
    return Agent(model=ScriptedModel(script), tools=[step], limits=Limits(max_turns=turns + 1))


class _Collector:
    """Times the collector's passes (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.freed = 0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started
            self.freed += info.get("collected", 0)


async def _run_all(agents: list[Agent]) -> list[Any]:
    """Every agent's run, started together inside the running loop."""
    return await asyncio.gather(*(agent.run("go") for agent in agents))


def _batch(runs: int, turns: int, collector_on: bool) -> tuple[float, float, int]:
    """CPU seconds of one batch, of the collector's passes in it, and objects they freed."""
    agents = [_agent(turns) for _ in range(runs)]  # made before timing: scripts aside
    gc.collect()
    timer = _Collector()
    gc.callbacks.append(timer)
    if not collector_on:
        gc.disable()
    loop = asyncio.new_event_loop()
    try:
        started = time.process_time()
        results = loop.run_until_complete(_run_all(agents))
        spent = time.process_time() - started
    finally:
        loop.close()
        gc.enable()
        gc.callbacks.remove(timer)
    if any(result.output != "done" for result in results):
        raise SystemExit("the workload did not run as intended")
    return spent, timer.seconds, timer.freed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=1000, help="runs driven at once")
    parser.add_argument("--turns", type=int, default=5, help="tool turns per run")
    parser.add_argument("--repeat", type=int, default=3, help="batches per setting (median)")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    _batch(10, args.turns, True)  # imports and caches before timing
    figures: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(args.repeat):
        for collector_on in (True, False):
            figures[collector_on].append(_batch(args.runs, args.turns, collector_on))
    on = statistics.median(f[0] for f in figures[True])
    off = statistics.median(f[0] for f in figures[False])
    passes = statistics.median(f[1] for f in figures[True])
    freed = statistics.median(f[2] for f in figures[True])
    print(f"{args.runs} runs of {args.turns} turns at once (median of {args.repeat}):")
    print(f"  CPU with the collector:    {on:.3f} s (its passes {passes:.3f} s, {passes / on:.0%})")
    print(f"  CPU without the collector: {off:.3f} s")
    print(f"  objects the collector freed per batch: {freed:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
