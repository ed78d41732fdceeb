"""The property harness, unchanged, over each provider adapter's wire format.

``assert_terminates(agent, through=...)`` plays the harness's generated behaviours (tool calls
with any ids and arguments, truncated and refused replies, transient and permanent failures,
huge usage counts, exceptions of every kind) through each adapter: the kit encodes every reply
as the provider's HTTP response, the adapter decodes it through its SDK, and the run
invariants (termination within the bound, a valid transcript, usage that adds up) must hold
whichever protocol carried the calls.
"""

from __future__ import annotations

from typing import Literal

import pytest
from hypothesis import settings

from agent_fsm import Agent, Limits, tool
from agent_fsm.models.base import Model
from agent_fsm.testing import ScriptedModel, assert_terminates
from tests.provider_kits import WireKit, all_kits
from tests.provider_kits.base import OverTheWire

KITS = all_kits()


@tool
def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Current weather for a city."""
    return f"21 {unit} in {city}"


@tool
def book(room: int, nights: int, guests: list[str], notes: str | None = None) -> str:
    """Book a room."""
    return f"booked {room}"


AGENT = Agent(
    model=ScriptedModel([]),
    tools=[get_weather, book],
    system_prompt="Be brief.",
    limits=Limits(max_turns=4, retry_backoff_s=0.0, retry_backoff_max_s=0.0),
)


def _examples() -> int:
    """A share of the active profile's examples: each run here goes through an SDK."""
    return max(30, settings.default.max_examples // 8)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kit", KITS, ids=[kit.name for kit in KITS])
def test_every_run_ends_validly_over_the_wire(kit: WireKit, stream: bool) -> None:
    def through(inner: Model) -> Model:
        return OverTheWire(kit, inner, stream=stream)

    assert_terminates(AGENT, through=through, max_examples=_examples())
