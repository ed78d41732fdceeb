"""Per-turn engine cost in CPU instructions, counted by valgrind's callgrind.

Wall-clock timings on a shared machine move with whatever else the machine does; instruction
counts do not (the same binary, inputs and environment give the same count). This script
runs the workload of ``overhead.py`` (one instant model call and one tool call per turn, with
schema validation, every guard and an event subscriber) under ``valgrind --tool=callgrind``
at two run lengths, and reports instructions per turn as the difference between the two
divided by the difference in turns, so interpreter start-up and imports cancel out. It
measures the same workload without the subscriber too (an agent nobody listens to, the
default): what the engine itself costs, events aside; traced, with ``OtelTracer`` as the only
subscriber, recording spans with the OpenTelemetry SDK (a ``TracerProvider`` and no processor:
what tracing costs the run, traced minus unsubscribed); and exported, the same with a simple
processor handing each ended span to an in-memory exporter (what the SDK's export path adds
on top, which depends on the application's processor, not on agent_fsm); and durable, the
unsubscribed agent checkpointed in a ``SQLiteStore`` (a file in a temporary directory): what
a durable turn costs, saves and the tool journal included; and durable-postgres, the same in a
``PostgresStore`` (a schema of its own, dropped after, in the database named by
``AGENT_FSM_POSTGRES_URL``; only when asked for, with ``--only``): the client's instructions
alone, the server being another process.

    python benchmarks/instructions.py [--turns 10 110] [--only VARIANT] [--no-gc]

A full collection of the cyclic collector costs tens of millions of instructions, and whether
one falls inside the long run but not the short one moves a per-turn figure by up to 200k:
compare commits with longer runs (``--turns 10 310``), or with ``--no-gc`` (the collector off
in the measured process), which counts the engine's own work alone.

It installs nothing: without valgrind it says how to get it (``apt-get install valgrind``)
and exits 2. A measurement takes a minute or two (Python runs ~50x slower under valgrind).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD_FLAG = "--child"
VARIANTS = ("subscribed", "unsubscribed", "traced", "exported", "durable")
"""The variants measured by default; ``durable-postgres`` needs a server, so it is asked for."""
ASKED_ONLY = ("durable-postgres",)


def _tracer(exported: bool) -> object:
    """``OtelTracer`` over the SDK; with ``exported``, each ended span goes to an in-memory
    exporter (no exporter thread, no I/O)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agent_fsm.otel import OtelTracer

    provider = TracerProvider()
    if exported:
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    return OtelTracer(tracer_provider=provider)


def _workload(turns: int, variant: str = "subscribed") -> None:
    """One run of ``turns`` tool turns and a final answer: what the child process executes."""
    import structlog

    from agent_fsm import Agent, Limits, StopReason, tool
    from agent_fsm.events import Event
    from agent_fsm.messages import ModelResponse, ToolCall
    from agent_fsm.testing import ScriptedModel, reply

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))

    @tool
    async def step(n: int) -> int:
        """Return n + 1."""
        return n + 1

    calls = [ToolCall(id=f"c{i}", name="step", arguments=f'{{"n": {i}}}') for i in range(turns)]
    script: list[ModelResponse | str] = [reply("", c, usage=(10, 2)) for c in calls]
    script.append("done")
    events = 0

    def count(event: Event) -> None:
        nonlocal events
        events += 1

    handlers: list[object] = []
    if variant == "subscribed":
        handlers.append(count)
    elif variant in ("traced", "exported"):
        handlers.append(_tracer(exported=variant == "exported"))
    store = None
    if variant == "durable":
        from agent_fsm.durable import SQLiteStore

        store = SQLiteStore(os.path.join(tempfile.mkdtemp(), "runs.sqlite3"))
    elif variant == "durable-postgres":
        from agent_fsm.durable.postgres import PostgresStore

        schema = f"bench_{os.getpid()}"
        store = PostgresStore(os.environ["AGENT_FSM_POSTGRES_URL"], schema=schema)
    agent = Agent(
        model=ScriptedModel(script),
        tools=[step],
        store=store,
        limits=Limits(max_turns=turns + 1, token_budget=10**9),
        handlers=handlers,
    )
    # A loop of its own rather than asyncio.run, whose SIGINT handling formats the finished
    # task, result included: that once-per-run cost is not the engine's.
    loop = asyncio.new_event_loop()
    try:
        result = loop.run_until_complete(agent.run("go"))
    finally:
        loop.close()
        if variant == "durable-postgres":
            _drop_schema(schema)
    if result.stop_reason is not StopReason.FINAL_ANSWER or result.turns != turns + 1:
        raise SystemExit(f"the workload did not run as intended: {result.stop_reason}")


def _drop_schema(schema: str) -> None:
    """Drop the benchmark's schema (its tables, with the runs it saved)."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(os.environ["AGENT_FSM_POSTGRES_URL"], autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))


def _instructions(turns: int, folder: Path, variant: str, collector: bool = True) -> int:
    """Instructions executed by one child process running ``turns`` turns (with the cyclic
    collector off unless ``collector``)."""
    out = folder / f"callgrind.{variant}.{turns}.out"
    command = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        CHILD_FLAG,
        str(turns),
        variant,
        "gc" if collector else "no-gc",
    ]
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    subprocess.run(command, check=True, env=env, capture_output=True)
    match = re.search(r"^(?:summary|totals):\s*(\d+)", out.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"no instruction total in {out}")
    return int(match.group(1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--turns",
        nargs=2,
        type=int,
        default=(10, 110),
        metavar=("SHORT", "LONG"),
        help="the two run lengths whose difference is measured (default: 10 110)",
    )
    parser.add_argument(
        "--only",
        choices=VARIANTS + ASKED_ONLY,
        help="measure one variant: with an event subscriber, without, traced by OtelTracer, "
        "traced and exported, durable, or durable in PostgreSQL (default: the first five)",
    )
    parser.add_argument(
        "--no-gc",
        action="store_true",
        help="turn the cyclic collector off in the measured process: the engine's own work, "
        "without the full collections whose place in a run moves the per-turn figure",
    )
    args = parser.parse_args(argv)
    short, long = args.turns
    if long <= short:
        parser.error("LONG must be greater than SHORT")
    if shutil.which("valgrind") is None:
        print(
            "valgrind is not installed (Debian/Ubuntu: apt-get install valgrind)",
            file=sys.stderr,
        )
        return 2
    variants = [args.only] if args.only else list(VARIANTS)
    print(f"{'variant':>13} {'turns':>6} {'instructions':>16}")
    per_turn: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder:
        for variant in variants:
            counts = {
                t: _instructions(t, Path(folder), variant, not args.no_gc) for t in (short, long)
            }
            for turns, count in counts.items():
                print(f"{variant:>13} {turns:>6} {count:>16,}")
            per_turn[variant] = (counts[long] - counts[short]) / (long - short)
    print()
    for variant, cost in per_turn.items():
        print(f"per turn ({short} -> {long}), {variant}: {cost:,.0f} instructions")
    if "unsubscribed" in per_turn:
        for variant in ("traced", "exported", "durable", "durable-postgres"):
            if variant in per_turn:
                added = per_turn[variant] - per_turn["unsubscribed"]
                print(f"{variant} adds {added:,.0f} instructions per turn")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == CHILD_FLAG:
        if sys.argv[4] == "no-gc":
            gc.disable()
        _workload(int(sys.argv[2]), variant=sys.argv[3])
    else:
        raise SystemExit(main())
