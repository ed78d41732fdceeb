"""Human in the loop: the agent asks the user a question, then needs approval to book.

python examples/ask_user.py
python examples/ask_user.py --model gpt-4o-mini [--base-url http://127.0.0.1:8000/v1]

ask_user is a built-in control-flow tool: when the model calls it, the run stops in DONE with
stop reason ``ask_user`` and status ``needs_input``; ``agent.resume(run_id, reply)`` continues
it with the user's answer. ``book_table`` is marked ``requires_approval``: its call is not run
but answered "awaiting approval", and the run stops with ``approval_required`` and the
pending call in ``result.pending``; ``agent.resume(run_id, approvals=...)`` runs it (or tells
the model it was denied). Offline, the answers are scripted; with ``--model`` they are read
from the terminal.
"""

from __future__ import annotations

import argparse
import logging

import structlog

from agent_fsm import Agent, Approval, Limits, RunResult, RunStatus, StopReason, tool
from agent_fsm.models import Model
from agent_fsm.testing import ScriptedModel, call, reply

BOOKINGS: list[str] = []


@tool
def list_restaurants(city: str) -> list[str]:
    """Restaurants with free tables tonight (offline sample data)."""
    return ["Da Dong (Peking duck)", "Jing Yaa Tang (Cantonese)", "King's Joy (vegetarian)"]


@tool(requires_approval=True)
def book_table(restaurant: str, people: int) -> str:
    """Book a table for tonight.

    Args:
        restaurant: the restaurant's name.
        people: how many people.
    """
    BOOKINGS.append(f"{restaurant} for {people}")
    return f"Booked {restaurant} for {people} people at 19:30, confirmation K-2291."


def build_model(name: str | None, base_url: str | None) -> Model:
    if name is None:
        return ScriptedModel(
            [
                reply("", call("list_restaurants", city="Beijing")),
                reply(
                    "",
                    call(
                        "ask_user",
                        question="Three places have tables tonight: Da Dong, Jing Yaa Tang "
                        "and King's Joy. Which one, and for how many people?",
                    ),
                ),
                reply("", call("book_table", restaurant="King's Joy", people=4)),
                reply("Your table at King's Joy for 4 is booked for 19:30 (K-2291)."),
            ]
        )
    from agent_fsm.models import OpenAIChatModel

    return OpenAIChatModel(name, base_url=base_url)


def answer(result: RunResult, offline: bool) -> tuple[str | None, bool | None]:
    """The user's reply (ask_user) or decision (approval): scripted offline, else typed."""
    assert result.pending is not None
    if result.stop_reason is StopReason.ASK_USER:
        return ("King's Joy, 4 people" if offline else input("> ")), None
    return None, (True if offline else input("approve? [y/N] ").strip().lower() == "y")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a real model name; omit for the offline script")
    parser.add_argument("--base-url", help="an OpenAI-compatible server")
    args = parser.parse_args()
    offline = args.model is None
    # An application configures logging; show agent_fsm's warnings only.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    agent = Agent(
        model=build_model(args.model, args.base_url),
        tools=[list_restaurants, book_table],
        system_prompt="You book restaurant tables in Beijing. Look up what is free with "
        "list_restaurants, then use ask_user to ask which restaurant and how many people: "
        "never guess. Then book it with book_table.",
        limits=Limits(max_turns=8, token_budget=30_000),
    )
    result = agent.run_sync("Book me a table for dinner tonight.")
    stops = [result.stop_reason]
    while result.status is RunStatus.NEEDS_INPUT:
        pending = result.pending
        assert pending is not None  # a run that needs input says what it waits for
        print(f"the agent waits ({result.stop_reason.value}): {result.output}")
        text, allow = answer(result, offline)
        if allow is None:
            result = agent.resume_sync(result.run_id, text)
        else:
            decisions = {c.id: Approval(allow=allow) for c in pending.pending_calls}
            result = agent.resume_sync(result.run_id, approvals=decisions)
        stops.append(result.stop_reason)
    print(f"status: {result.status.value} ({result.stop_reason.value}, {result.turns} turns)")
    print(f"answer: {result.output}")
    if offline:
        assert stops == [
            StopReason.ASK_USER,
            StopReason.APPROVAL_REQUIRED,
            StopReason.FINAL_ANSWER,
        ], stops
        assert BOOKINGS == ["King's Joy for 4"]


if __name__ == "__main__":
    main()
