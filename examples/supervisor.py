"""A research supervisor with two sub-agents, under one money budget.

python examples/supervisor.py

The supervisor delegates to a ``researcher`` and a ``calculator`` (``Agent.as_tool``). Each
child runs within what the supervisor has left when it is called: turns, tokens, time and
money are carved from the parent's remainder, and what the child spends is counted in the
parent's, so the supervisor's ``Limits(max_turns=..., cost_budget=...)`` bound the whole
tree, and ``supervisor.bound`` nests the children's bounds. Offline: the three models are
scripted, and priced as if they were real.
"""

from __future__ import annotations

import logging

import structlog

from agent_fsm import Agent, Limits, Pricing, RunStatus, StopReason, tool
from agent_fsm.events import Event, RunFinished, SubAgentStarted
from agent_fsm.testing import ScriptedModel, call, reply

PRICES = {
    "small": Pricing(input_per_million=0.15, output_per_million=0.60),
    "large": Pricing(
        input_per_million=2.50, output_per_million=10.0, cached_input_per_million=1.25
    ),
}
"""Dollars per million tokens, by model name."""

_NOTES = {"mars": "Mars is 227.9 million km from the Sun on average."}


@tool
def search_notes(topic: str) -> str:
    """Look a topic up in the offline notes."""
    return _NOTES.get(topic.lower(), f"No notes on {topic!r}.")


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def build() -> Agent:
    researcher = Agent(
        model=ScriptedModel(
            [
                reply("", call("search_notes", topic="Mars"), usage=(900, 40)),
                reply("Mars: 227.9 million km from the Sun.", usage=(1_000, 30)),
            ],
            name="small",
        ),
        tools=[search_notes],
        system_prompt="You look facts up in the notes and report them in one sentence.",
        limits=Limits(max_turns=4),
    )
    calculator = Agent(
        model=ScriptedModel(
            [
                reply("", call("multiply", a=227.9, b=1000), usage=(700, 30)),
                reply("227,900 thousand km.", usage=(800, 20)),
            ],
            name="small",
        ),
        tools=[multiply],
        system_prompt="You compute with multiply and give the number.",
        limits=Limits(max_turns=4),
    )
    return Agent(
        model=ScriptedModel(
            [
                reply(
                    "", call("research", task="How far is Mars from the Sun?"), usage=(1_500, 60)
                ),
                reply(
                    "",
                    call("calculate", task="227.9 million km in thousands of km"),
                    usage=(2_000, 50),
                ),
                reply("Mars is on average 227,900 thousand km from the Sun.", usage=(2_400, 40)),
            ],
            name="large",
        ),
        tools=[
            researcher.as_tool(name="research", description="Looks a fact up in the notes."),
            calculator.as_tool(name="calculate", description="Does arithmetic."),
        ],
        system_prompt="You answer by delegating: research facts, calculate numbers.",
        limits=Limits(max_turns=10, cost_budget=0.05, prices=PRICES),
    )


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    supervisor = build()
    started: list[str] = []

    def show(event: Event) -> None:
        if isinstance(event, SubAgentStarted):
            started.append(event.tool)
        elif isinstance(event, RunFinished):
            print(f"  {event.run_id[:8]} finished: {event.stop_reason.value}, cost {event.cost}")

    result = supervisor.subscribe(show).run_sync(
        "How far is Mars from the Sun, in thousands of km?"
    )
    print(f"answer: {result.output}")
    print(f"sub-agents called: {started}")
    print(f"turns of the whole tree: {result.turns}, cost ${result.cost:.6f} of $0.05")
    bound = supervisor.bound
    print(f"bound: {bound.model_calls} model calls, {bound.tree_transitions} transitions (tree)")
    assert result.status is RunStatus.COMPLETED, result.error
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert started == ["research", "calculate"]
    assert result.turns == 3 + 2 + 2  # its own three, two for each child
    assert result.cost is not None
    assert 0 < result.cost < 0.05
    assert [name for name, _ in bound.nested] == ["research", "calculate"]
    print(supervisor.composition("supervisor"))


if __name__ == "__main__":
    main()
