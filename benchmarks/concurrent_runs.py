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
        [--model instant|openai] [--freeze] [--threshold N]

``--model openai`` puts a provider SDK in the loop, as a server has it: each model call goes
through ``OpenAIChatModel`` and the ``openai`` SDK's own client to a mock transport that
answers at once, with the same replies in the Chat Completions wire format (the tests' kit
writes them). The SDK makes most of the objects then, and most of the CPU: what the
collector takes of a real process is this figure, not the instant model's.

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
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from agent_fsm import Agent, Limits, tool
from agent_fsm.messages import ModelRequest, ModelResponse, ToolCall, ToolMessage
from agent_fsm.models.base import Model
from agent_fsm.testing import reply


@tool
async def step(n: int) -> int:
    """Return n + 1."""
    await asyncio.sleep(0)  # a real tool awaits something: the runs interleave
    return n + 1


def _reply(done: int, turns: int) -> ModelResponse:
    """The reply once ``done`` tool results are in: the next call of ``step``, or the end."""
    if done < turns:
        call = ToolCall(id=f"call_{done}", name="step", arguments=f'{{"n": {done}}}')
        return reply("", call, usage=(10, 2))
    return reply("done", usage=(10, 2))


class _Stepper:
    """An instant model that keeps no record: it calls ``step`` until ``turns`` results are in."""

    name = "stepper"

    def __init__(self, turns: int) -> None:
        self._turns = turns

    async def request(self, request: ModelRequest) -> ModelResponse:
        done = sum(isinstance(m, ToolMessage) for m in request.messages)
        return _reply(done, self._turns)


def _over_openai(turns: int) -> Model:
    """The same replies through ``OpenAIChatModel`` and the ``openai`` SDK's client, from a
    mock transport that answers each request at once (``--model openai``)."""
    import openai

    from agent_fsm.models.openai_chat import OpenAIChatModel

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' kits
    from tests.provider_kits.base import as_http, http
    from tests.provider_kits.openai_chat import OpenAIChatKit

    kit = OpenAIChatKit()

    async def serve(request: Any) -> Any:
        body = json.loads(request.content)
        done = sum(message["role"] == "tool" for message in body["messages"])
        await asyncio.sleep(0)  # a server answers later: the runs' calls interleave
        return as_http(kit.reply(_reply(done, turns)))

    client = http.AsyncClient(transport=http.MockTransport(serve))
    sdk = openai.AsyncOpenAI(api_key="sk-bench", base_url="https://api.test/v1", http_client=client)
    return OpenAIChatModel("gpt-4o-mini", client=sdk)


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


def _batch(
    runs: int, turns: int, collector_on: bool, model: str = "instant"
) -> tuple[float, float, int, list[int]]:
    """CPU seconds of one batch, of the collector's passes in it, objects they freed, and
    the passes of each generation."""
    answers = _Stepper(turns) if model == "instant" else _over_openai(turns)
    agent = Agent(model=answers, tools=[step], limits=Limits(max_turns=turns + 1))
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
        "--model",
        choices=("instant", "openai"),
        default="instant",
        help="an instant model, or the openai SDK's client on a mock transport",
    )
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
    _batch(10, args.turns, True, args.model)  # imports and caches before timing
    if args.threshold is not None:
        gc.set_threshold(args.threshold, *gc.get_threshold()[1:])
    if args.freeze:
        gc.collect()
        gc.freeze()
    figures: dict[bool, list[tuple[float, float, int, list[int]]]] = {True: [], False: []}
    for _ in range(args.repeat):
        for collector_on in (True, False):
            figures[collector_on].append(_batch(args.runs, args.turns, collector_on, args.model))
    on = statistics.median(f[0] for f in figures[True])
    off = statistics.median(f[0] for f in figures[False])
    passes = statistics.median(f[1] for f in figures[True])
    freed = statistics.median(f[2] for f in figures[True])
    young, middle, full = (statistics.median(f[3][g] for f in figures[True]) for g in range(3))
    settings = f"threshold {gc.get_threshold()[0]}" + (", frozen" if args.freeze else "")
    print(
        f"{args.runs} runs of {args.turns} turns at once, {args.model} model "
        f"(median of {args.repeat}; {settings}):"
    )
    print(f"  CPU with the collector:    {on:.3f} s (its passes {passes:.3f} s, {passes / on:.0%})")
    print(f"  CPU without the collector: {off:.3f} s")
    print(f"  collector passes per batch: {young:.0f} young, {middle:.0f} middle, {full:.0f} full")
    print(f"  objects the collector freed per batch: {freed:,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
