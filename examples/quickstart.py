"""Quick start: a weather agent on the offline scripted model (or a real one with --model).

python examples/quickstart.py
python examples/quickstart.py --model gpt-4o-mini [--base-url http://127.0.0.1:8000/v1]
"""

from __future__ import annotations

import argparse
from typing import Literal

from agent_fsm import Agent, Limits, RunStatus, tool
from agent_fsm.models import Model
from agent_fsm.testing import ScriptedModel, call, reply


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> dict[str, object]:
    """Current weather for a city (sample data)."""
    return {"city": city, "temperature": 31 if unit == "celsius" else 87.8, "unit": unit}


def build_model(name: str | None, base_url: str | None) -> Model:
    if name is None:
        return ScriptedModel(
            [reply("", call("get_weather", city="Beijing")), reply("It is 31 °C in Beijing.")]
        )
    from agent_fsm.models import OpenAIChatModel

    return OpenAIChatModel(name, base_url=base_url)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a real model name; omit for the offline script")
    parser.add_argument("--base-url", help="an OpenAI-compatible server")
    args = parser.parse_args()
    agent = Agent(
        model=build_model(args.model, args.base_url),
        tools=[get_weather],
        system_prompt="You answer weather questions with the get_weather tool.",
        limits=Limits(max_turns=6, token_budget=20_000),
    )
    result = agent.run_sync("What's the weather in Beijing?")
    for entry in result.trace:
        guards = " and ".join(entry.guards) or "else"
        print(f"{entry.source:>7} -> {entry.dest:<7} [{guards}]")
    print(f"{result.stop_reason.value}: {result.output}")
    assert result.status is RunStatus.COMPLETED, result.error


if __name__ == "__main__":
    main()
