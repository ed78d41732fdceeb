"""Human in the loop: the agent asks the user a question and the run pauses for the answer.

python examples/ask_user.py
python examples/ask_user.py --model gpt-4o-mini [--base-url http://127.0.0.1:8000/v1]

ask_user is a built-in control-flow tool: when the model calls it, the REFLECT guard
``ask_user_called`` ends the run in DONE with stop reason ``ask_user`` and status
``needs_input``; the question is ``result.output`` (and ``result.pending``).
"""

from __future__ import annotations

import argparse
import logging

import structlog

from agent_fsm import Agent, Limits, RunStatus, StopReason, tool
from agent_fsm.models import Model
from agent_fsm.testing import ScriptedModel, call, reply


@tool
def list_restaurants(city: str) -> list[str]:
    """Restaurants with free tables tonight (offline sample data)."""
    return ["Da Dong (Peking duck)", "Jing Yaa Tang (Cantonese)", "King's Joy (vegetarian)"]


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
        tools=[list_restaurants],
        system_prompt="You book restaurant tables in Beijing. Look up what is free with "
        "list_restaurants, then use ask_user to ask which restaurant and how many people: "
        "never guess, and never book without asking.",
        limits=Limits(max_turns=6, token_budget=20_000),
    )
    result = agent.run_sync("Book me a table for dinner tonight.")
    print(f"status: {result.status.value} ({result.stop_reason.value}, {result.turns} turns)")
    print(f"the agent asks: {result.output}")
    if args.model is None:
        assert result.status is RunStatus.NEEDS_INPUT, result.error
        assert result.stop_reason is StopReason.ASK_USER
        assert result.pending is not None
        assert result.pending.text == result.output


if __name__ == "__main__":
    main()
