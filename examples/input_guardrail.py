"""Guardrails: an input check that runs before anything else, and an output check that asks
for a rewrite.

python examples/input_guardrail.py

The input guardrail reads each user message as the run takes it in (OBSERVE): when it trips,
the ``input_guardrail_tripped`` row stops the run in ERROR ``guardrail_tripped`` before any
model call or tool has seen the message. The output guardrail reads an answer that would end
the run: it may ask for a rewrite (at most ``Limits.guardrail_rewrites`` times) or trip.
Offline: the model is scripted.
"""

from __future__ import annotations

import logging
import re

import structlog

from agent_fsm import Agent, Limits, RunStatus, StopReason
from agent_fsm.guardrails import Rewrite, Trip
from agent_fsm.testing import ScriptedModel

_CARD = re.compile(r"\b(?:\d[ -]?){13,16}\b")


def no_card_numbers(text: str) -> bool | Trip:
    """Trips on anything that looks like a payment card number."""
    return Trip("the message holds a card number") if _CARD.search(text) else True


def one_paragraph(text: str) -> bool | Rewrite:
    """Asks for a rewrite of an answer longer than one paragraph."""
    return True if "\n\n" not in text.strip() else Rewrite("answer in one paragraph")


def build(script: list[str]) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    agent = Agent(
        model=model,
        system_prompt="You are a support assistant.",
        input_guardrails=[no_card_numbers],
        output_guardrails=[one_paragraph],
        limits=Limits(max_turns=5, guardrail_rewrites=1),
    )
    return agent, model


def main() -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    agent, model = build(["never sent"])
    stopped = agent.run_sync("My card is 4111 1111 1111 1111, why was it declined?")
    print(f"{stopped.stop_reason.value}: {stopped.error} ({len(model.requests)} model calls)")
    assert stopped.stop_reason is StopReason.GUARDRAIL_TRIPPED
    assert model.requests == []

    agent, model = build(
        ["Declines happen.\n\nCall your bank.", "Declines happen: call your bank."]
    )
    answered = agent.run_sync("Why was my card declined?")
    print(f"{answered.stop_reason.value} after {answered.turns} turns: {answered.output}")
    assert answered.status is RunStatus.COMPLETED
    assert answered.output == "Declines happen: call your bank."


if __name__ == "__main__":
    main()
