"""Cost of one checkpoint save, early and late in a long run: it must not grow with the run.

A run of ``turns`` tool-calling turns is built up one turn at a time (a reply with a call, its
result, four transitions) and saved after every turn, as the engine does after a transition.
Printed: the median µs per save over the first and the last ``window`` turns, for each store,
and for contrast what encoding the whole state once costs at the end (a non-incremental save).

    python benchmarks/checkpoint_save.py
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from agent_fsm import CheckpointStore, MemoryStore, SQLiteStore
from agent_fsm.messages import (
    AssistantMessage,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)
from agent_fsm.state import RUN_STATE_ADAPTER, RunState

RESULT = "lorem ipsum dolor sit amet " * 20  # a ~540-character tool result


def add_turn(state: RunState, n: int) -> None:
    state.turns += 1
    call = ToolCall(id=f"call_{n}", name="search", arguments=f'{{"query": "page {n}", "k": 5}}')
    state.messages.append(AssistantMessage(content=f"Looking up page {n}.", tool_calls=(call,)))
    state.messages.append(ToolMessage(tool_call_id=call.id, name="search", content=RESULT))
    state.trace.extend([(2, n), (10, n), (13, n), (24, n)])
    state.usage = state.usage + Usage(input_tokens=400 + n, output_tokens=30, requests=1)
    state.loop.recent_calls = [*state.loop.recent_calls[-7:], f"search:{n}"]


def run(store: CheckpointStore, turns: int) -> tuple[list[float], RunState]:
    state = RunState(
        run_id="bench",
        messages=[SystemMessage(content="You search."), UserMessage(content="Find it.")],
    )
    samples = []
    for n in range(turns):
        add_turn(state, n)
        started = time.perf_counter()
        store.save(state)
        samples.append((time.perf_counter() - started) * 1e6)
    assert store.load("bench") == state
    return samples, state


def main(turns: int = 1_000, window: int = 100) -> None:
    print(f"{turns} turns, one save per turn; median µs per save over {window} turns")
    state = RunState(run_id="unused")
    with tempfile.TemporaryDirectory() as tmp:
        stores: list[tuple[str, CheckpointStore]] = [
            ("MemoryStore", MemoryStore()),
            ("SQLiteStore", SQLiteStore(Path(tmp) / "bench.sqlite3")),
        ]
        for name, store in stores:
            samples, state = run(store, turns)
            first = statistics.median(samples[:window])
            last = statistics.median(samples[-window:])
            p99 = statistics.quantiles(samples, n=100)[98]
            print(
                f"{name:12} first {window}: {first:7.1f} µs   last {window}: {last:7.1f} µs"
                f"   p99 of all: {p99:7.1f} µs   ({len(state.messages)} messages at the end)"
            )
            store.close()
    started = time.perf_counter()
    size = len(RUN_STATE_ADAPTER.dump_json(state))
    elapsed = (time.perf_counter() - started) * 1e6
    print(f"for contrast, encoding the whole final state once: {elapsed:7.1f} µs ({size} bytes)")


if __name__ == "__main__":
    argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0]).parse_args()
    main()
