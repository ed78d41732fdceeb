"""A model stuck calling the same tool is stopped by loop detection, with a valid transcript.

python examples/loop_detection.py
"""

from __future__ import annotations

import argparse

from agent_fsm import Agent, Limits, StopReason, tool
from agent_fsm.messages import ToolMessage
from agent_fsm.testing import ScriptedModel, call, reply


@tool
def search(query: str) -> str:
    """Search the (empty) archive."""
    return "no results"


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    stuck = ScriptedModel([reply("Searching again…", call("search", query="agent_fsm"))] * 50)
    agent = Agent(
        model=stuck,
        tools=[search],
        limits=Limits(max_turns=50, loop_threshold=3),
    )
    result = agent.run_sync("Find the agent_fsm paper.")
    answered = sum(isinstance(m, ToolMessage) for m in result.messages)
    print(f"stopped after {result.turns} turns: {result.stop_reason.value} ({result.error})")
    print(f"{answered} tool calls, each answered once; bound was {agent.bound.transitions}")
    assert result.stop_reason is StopReason.LOOP_DETECTED


if __name__ == "__main__":
    main()
