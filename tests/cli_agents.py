"""Agents of a user's own, for ``agent-fsm run --agent`` in tests/test_cli_agent.py.

``support`` is a factory (as an agent whose construction reads the environment is written):
its model is an OpenAI-compatible server at ``$CLI_AGENT_URL``; ``refund`` appends to the file
``$CLI_AGENT_REFUNDS``, a side effect the tests count across processes.
"""

from __future__ import annotations

import os
from pathlib import Path

from agent_fsm import Agent, Limits, tool
from agent_fsm.models.openai_chat import OpenAIChatModel


@tool
def lookup_order(order_id: str) -> str:
    """Look an order up."""
    return f"order {order_id}: shipped"


@tool
def refund(order_id: str) -> str:
    """Refund an order."""
    with Path(os.environ["CLI_AGENT_REFUNDS"]).open("a") as log:
        log.write(order_id + "\n")
    return f"refunded {order_id}"


def support() -> Agent:
    """The support desk: its own tools, prompt, limits and model."""
    model = OpenAIChatModel("desk-model", base_url=os.environ["CLI_AGENT_URL"], api_key="unused")
    return Agent(
        model=model,
        tools=[lookup_order, refund],
        system_prompt="You are the support desk.",
        limits=Limits(max_turns=6, model_retries=0, model_retries_per_run=0),
    )
