"""A research agent: it gathers notes with a tool over a few turns, then ends with finish_task.

python examples/research_finish_task.py
python examples/research_finish_task.py --model gpt-4o-mini [--base-url http://127.0.0.1:8000/v1]

finish_task is a built-in control-flow tool: when the model calls it, the REFLECT guard
``finish_task_called`` ends the run in DONE with stop reason ``finish_task`` and the summary as
the output. The run's path through the machine is printed as a mermaid overlay.
"""

from __future__ import annotations

import argparse
import logging

import structlog

from agent_fsm import Agent, Limits, RunStatus, StopReason, tool
from agent_fsm.models import Model
from agent_fsm.testing import ScriptedModel, call, reply

_NOTES = {
    "finite-state machines": "An FSM is a set of states and guarded transitions between them.",
    "termination": "A loop terminates if every cycle passes a transition with a finite budget.",
    "tool calling": "The model asks for tool calls; every call must get exactly one result.",
}


@tool
def search_notes(topic: str) -> str:
    """Look a topic up in the offline notes (finite-state machines, termination, tool calling)."""
    for key, note in _NOTES.items():
        if key in topic.lower() or topic.lower() in key:
            return note
    return f"No notes on {topic!r}. Known topics: {', '.join(_NOTES)}."


def build_model(name: str | None, base_url: str | None) -> Model:
    if name is None:
        return ScriptedModel(
            [
                reply("First, the basics.", call("search_notes", topic="finite-state machines")),
                reply("", call("search_notes", topic="termination")),
                reply("", call("search_notes", topic="tool calling")),
                reply(
                    "I have enough.",
                    call(
                        "finish_task",
                        summary="An agent loop as an FSM ends because every cycle passes a "
                        "budgeted transition, and each tool call gets exactly one result.",
                    ),
                ),
            ]
        )
    from agent_fsm.models import OpenAIChatModel

    return OpenAIChatModel(name, base_url=base_url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a real model name; omit for the offline script")
    parser.add_argument("--base-url", help="an OpenAI-compatible server")
    args = parser.parse_args()
    # An application configures logging; show agent_fsm's warnings only.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    agent = Agent(
        model=build_model(args.model, args.base_url),
        tools=[search_notes],
        system_prompt="You research a question with search_notes, one topic per call, then "
        "call finish_task with a two-sentence summary. Do not answer in plain text.",
        limits=Limits(max_turns=8, token_budget=30_000),
    )
    result = agent.run_sync("Why does an agent loop built as a state machine always stop?")
    calls = sum(1 for entry in result.trace if entry.label == "act")
    print(f"{calls} tool turns, then {result.stop_reason.value} after {result.turns} turns")
    print(f"summary: {result.output}\n")
    print(agent.diagram(run=result))
    if args.model is None:
        assert result.status is RunStatus.COMPLETED, result.error
        assert result.stop_reason is StopReason.FINISH_TASK
        assert calls == 4  # three searches and the finish_task call


if __name__ == "__main__":
    main()
