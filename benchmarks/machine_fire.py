"""Cost of the machine alone: the four triggers of one turn, each with all its rows tried.

Every non-terminal state is entered in turn and its trigger fired with no guard passing, so
each trigger walks its whole row group to the "else" row: the worst case per turn.

    python benchmarks/machine_fire.py
"""

from __future__ import annotations

import argparse
import statistics
import time

from agent_fsm.limits import Limits
from agent_fsm.loop.machine import AgentMachine
from agent_fsm.state import RunState
from agent_fsm.table import AgentState

TURN = (AgentState.OBSERVE, AgentState.THINK, AgentState.ACT, AgentState.REFLECT)


def main(rounds: int = 7, turns: int = 5_000) -> None:
    machine = AgentMachine()
    state = RunState(run_id="bench")
    handle = machine.handle(state, Limits())
    samples = []
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(turns):
            for source in TURN:
                handle.state = source.value
                state.last_tool_calls = 1  # THINK goes on to ACT, past every failure row
                machine.fire(handle)
        samples.append((time.perf_counter() - started) / turns * 1e6)
    print(f"4 triggers (one turn): {statistics.median(samples):.1f} µs (median of {rounds})")


if __name__ == "__main__":
    argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0]).parse_args()
    main()
