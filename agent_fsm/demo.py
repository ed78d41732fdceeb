"""The offline demo agent: a weather lookup and a calculator, driven by a scripted model.

Everything is embedded (the weather table and the model's replies), so ``agent-fsm demo``
runs with no network and no API key, and shows a complete run: tool calls, a tool error the
model corrects, and a final answer.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Literal

from agent_fsm.agent import Agent
from agent_fsm.limits import Limits
from agent_fsm.testing.models import ScriptedModel, ScriptItem, call, reply
from agent_fsm.tools.tool import Tool, tool

__all__ = ["DEMO_QUESTION", "calculator", "demo_agent", "demo_script", "get_weather"]

DEMO_QUESTION = "What's the weather in Beijing, and what is that temperature in Fahrenheit?"

_WEATHER: dict[str, dict[str, float | str]] = {
    "beijing": {"condition": "sunny", "temperature_c": 31.0, "humidity": 0.42},
    "shanghai": {"condition": "light rain", "temperature_c": 24.5, "humidity": 0.81},
    "paris": {"condition": "cloudy", "temperature_c": 17.0, "humidity": 0.66},
}


@tool
def get_weather(
    city: str, unit: Literal["celsius", "fahrenheit"] = "celsius"
) -> dict[str, float | str]:
    """Current weather for a city (offline sample data: Beijing, Shanghai, Paris)."""
    data = _WEATHER.get(city.strip().lower())
    if data is None:
        raise LookupError(f"no weather data for {city!r}; known cities: Beijing, Shanghai, Paris")
    temperature = float(data["temperature_c"])
    if unit == "fahrenheit":
        temperature = temperature * 9 / 5 + 32
    return {"city": city, "condition": data["condition"], "temperature": temperature, "unit": unit}


_OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported expression element: {ast.dump(node)[:60]}")


@tool
def calculator(expression: str) -> float:
    """Evaluate an arithmetic expression with + - * / ** and parentheses."""
    return _evaluate(ast.parse(expression, mode="eval"))


def demo_script() -> list[ScriptItem]:
    """The scripted model's replies: look up, miscalculate once, correct, answer."""
    return [
        reply("Let me look up the weather.", call("get_weather", city="Beijing"), usage=(212, 18)),
        reply("", call("calculator", expression="31 * 9 / 5 + "), usage=(268, 15)),
        reply("", call("calculator", expression="31 * 9 / 5 + 32"), usage=(331, 16)),
        reply(
            "It is sunny in Beijing at 31 °C, which is 87.8 °F.",
            usage=(372, 17),
        ),
    ]


def demo_agent(tools: list[Tool] | None = None) -> Agent:
    """The demo agent on its scripted model (a fresh script per call)."""
    return Agent(
        model=ScriptedModel(demo_script(), name="scripted-demo"),
        tools=tools if tools is not None else [get_weather, calculator],
        system_prompt="You answer weather questions. Use the tools; do arithmetic with "
        "the calculator.",
        limits=Limits(max_turns=8, token_budget=20_000),
    )
