"""Shared test set-up: quiet structlog, hypothesis profiles, small agent builders."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
import structlog
from hypothesis import HealthCheck, settings

from agent_fsm import Agent, Limits, Tool, tool
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.events import Event
from agent_fsm.state import RUN_STATE_ADAPTER, RunState
from agent_fsm.testing import ScriptedModel, ScriptItem


def _configure_structlog() -> None:
    """The test suite is an application: it configures structlog (warnings and above)."""
    structlog.reset_defaults()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=False,
    )


_configure_structlog()


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    """The CLI configures structlog for itself (to the stream pytest captured for that
    test); put the suite's configuration back so later tests never log to a closed file."""
    yield
    _configure_structlog()


settings.register_profile(
    "ci",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=False,
    print_blob=True,
)
settings.register_profile(
    "thorough",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=200, deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@tool
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@tool
def boom(reason: str = "broken") -> str:
    """Always fails."""
    raise RuntimeError(reason)


FAST = {"retry_backoff_s": 0.0, "retry_backoff_max_s": 0.0}


def limits(**overrides: Any) -> Limits:
    """Limits with zero retry backoff (tests never sleep) plus the given overrides."""
    return Limits(**{**FAST, **overrides})


def make_agent(
    script: Iterable[ScriptItem],
    *,
    tools: Sequence[Tool] = (echo, add, boom),
    **limit_overrides: Any,
) -> tuple[Agent, ScriptedModel]:
    model = ScriptedModel(script)
    agent = Agent(model=model, tools=tools, system_prompt="test", limits=limits(**limit_overrides))
    return agent, model


class Recorder(list[Event]):
    """An event handler that keeps every event."""

    def __call__(self, event: Event) -> None:
        self.append(event)

    def kinds(self) -> list[str]:
        return [event.kind for event in self]


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


class SpyStore(MemoryStore):
    """A MemoryStore that keeps every checkpoint it was given, as JSON."""

    def __init__(self) -> None:
        super().__init__()
        self.saved: list[bytes] = []

    def save(self, state: RunState) -> None:
        super().save(state)
        self.saved.append(RUN_STATE_ADAPTER.dump_json(state))
