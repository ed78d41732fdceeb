"""A triage agent that hands the conversation off to a specialist.

python examples/triage_handoff.py

``refunds.as_handoff(...)`` is a terminal tool of the triage agent: when the model calls it,
the refunds agent takes the conversation over (the user's messages, with its own system
prompt first) within what the triage run has left, and its answer ends the triage run, by
the ``terminal_tool`` row of the table. Offline: both models are scripted.
"""

from __future__ import annotations

import logging

import structlog

from agent_fsm import Agent, Limits, RunStatus, StopReason, tool
from agent_fsm.testing import ScriptedModel, call, reply


@tool
def refund(order: int) -> str:
    """Refund an order."""
    return f"order {order} refunded"


def build() -> tuple[Agent, ScriptedModel]:
    specialist = ScriptedModel(
        [reply("", call("refund", order=42)), "Order 42 is refunded: 3-5 days to your card."],
        name="specialist",
    )
    refunds = Agent(
        model=specialist,
        tools=[refund],
        system_prompt="You handle refunds: check the order, refund it, say when it arrives.",
        limits=Limits(max_turns=5),
    )
    triage = Agent(
        model=ScriptedModel([reply("", call("refunds", note="order 42, arrived broken"))]),
        tools=[refunds.as_handoff(name="refunds", description="Anything about refunds.")],
        system_prompt="You route each question to the right specialist.",
        limits=Limits(max_turns=8),
    )
    return triage, specialist


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    triage, specialist = build()
    result = triage.run_sync("My order 42 arrived broken. Can I get my money back?")
    print(f"{result.stop_reason.value} after {result.turns} turns: {result.output}")
    print(f"the specialist saw {len(specialist.requests[0].messages)} messages first")
    assert result.status is RunStatus.COMPLETED
    assert result.stop_reason is StopReason.TERMINAL_TOOL
    assert result.output == "Order 42 is refunded: 3-5 days to your card."
    assert result.turns == 3  # one of triage's, two of the specialist's


if __name__ == "__main__":
    main()
