"""A thousand runs at once, with the cyclic collector on and off: how much of the CPU the
collector takes (issue 39: 41 % before the runs stopped leaving reference cycles).

Each run makes ``--turns`` tool turns (an instant stateless model, one async tool call per
turn, events unsubscribed); all ``--runs`` runs of one agent are driven together on one event
loop, as a server drives its conversations, and each checks and drops its result. The script
reports the process CPU time of the whole batch with the collector on and off, the time the
collector's passes took (``gc.callbacks``), how many there were of each generation (young,
middle, full: steadier than the times, and what fewer objects held by a run lowers), and how
many objects they freed.

    python benchmarks/concurrent_runs.py [--runs 1000] [--turns 5] [--repeat 3]
        [--freeze] [--threshold N]

``--freeze`` and ``--threshold`` measure the collector settings the README suggests for a
process that drives many runs at once (its "Many runs in one process" section): the objects
made before the runs start (imports, the agent) moved out of the collector's sight with
``gc.freeze()``, and the young generation's threshold raised with ``gc.set_threshold``.

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
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage
from agent_fsm.testing import reply


@tool
async def step(n: int) -> int:
    """Return n + 1."""
    await asyncio.sleep(0)  # a real tool awaits something: the runs interleave
    return n + 1


class _Stepper:
    """An instant model that keeps no record: it calls ``step`` until ``turns`` results are in."""

    name = "stepper"

    def __init__(self, turns: int) -> None:
        self._turns = turns

    async def request(self, request: ModelRequest) -> ModelResponse:
        done = sum(isinstance(m, ToolMessage) for m in request.messages)
        if done < self._turns:
            call = ToolCall(id=f"call_{done}", name="step", arguments=f'{{"n": {done}}}')
            return reply("", call, usage=(10, 2))
        return reply("done", usage=(10, 2))


class _Collector:
    """Times the collector's passes (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.freed = 0
        self.passes = [0, 0, 0]
        """Passes of each generation: young, middle, full."""
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.seconds += time.process_time() - self._started
            self.freed += info.get("collected", 0)
            self.passes[info["generation"]] += 1


async def _run_all(agent: Agent, runs: int) -> int:
    """``runs`` runs of ``agent`` at once; how many ended as scripted."""

    async def one() -> bool:
        return (await agent.run("go")).output == "done"

    return sum(await asyncio.gather(*(one() for _ in range(runs))))


def _batch(runs: int, turns: int, collector_on: bool) -> tuple[float, float, int, list[int]]:
    """CPU seconds of one batch, of the collector's passes in it, objects they freed, and
    the passes of each generation."""
    agent = Agent(model=_Stepper(turns), tools=[step], limits=Limits(max_turns=turns + 1))
    gc.collect()
    timer = _Collector()
    gc.callbacks.append(timer)
    if not collector_on:
        gc.disable()
    loop = asyncio.new_event_loop()
    try:
        started = time.process_time()
        ended = loop.run_until_complete(_run_all(agent, runs))
        spent = time.process_time() - started
    finally:
        loop.close()
        gc.enable()
        gc.callbacks.remove(timer)
    if ended != runs:
        raise SystemExit("the workload did not run as intended")
    return spent, timer.seconds, timer.freed, timer.passes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs driven at once")
    parser.add_argument("--turns", type=int, default=5, help="tool turns per run")
    parser.add_argument("--repeat", type=int, default=3, help="batches per setting (median)")
    parser.add_argument(
        "--freeze",
        action="store_true",
        help="gc.freeze() once imports and caches are made, before the batches",
    )
    parser.add_argument(
        "--threshold",
        type=int,
        default=None,
        help="the young generation's threshold (gc.set_threshold; Python's default is 700)",
    )
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    _batch(10, args.turns, True)  # imports and caches before timing
    if args.threshold is not None:
        gc.set_threshold(args.threshold, *gc.get_threshold()[1:])
    if args.freeze:
        gc.collect()
        gc.freeze()
    figures: dict[bool, list[tuple[float, float, int, list[int]]]] = {True: [], False: []}
    for _ in range(args.repeat):
        for collector_on in (True, False):
            figures[collector_on].append(_batch(args.runs, args.turns, collector_on))
    on = statistics.median(f[0] for f in figures[True])
    off = statistics.median(f[0] for f in figures[False])
    passes = statistics.median(f[1] for f in figures[True])
    freed = statistics.median(f[2] for f in figures[True])
    young, middle, full = (statistics.median(f[3][g] for f in figures[True]) for g in range(3))
    settings = f"threshold {gc.get_threshold()[0]}" + (", frozen" if args.freeze else "")
    print(f"{args.runs} runs of {args.turns} turns at once (median of {args.repeat}; {settings}):")
    print(f"  CPU with the collector:    {on:.3f} s (its passes {passes:.3f} s, {passes / on:.0%})")
    print(f"  CPU without the collector: {off:.3f} s")
    print(f"  collector passes per batch: {young:.0f} young, {middle:.0f} middle, {full:.0f} full")
    print(f"  objects the collector freed per batch: {freed:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
