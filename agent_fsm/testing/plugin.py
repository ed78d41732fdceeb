"""The agent_fsm pytest plugin, loaded on install through the ``pytest11`` entry point.

It gives every test suite of an agent_fsm user:

- ``scripted_agent``: a factory fixture, ``scripted_agent(script, tools=..., **options)``,
  returning an ``Agent`` whose model is a ``ScriptedModel`` over ``script`` (its requests are
  in ``agent.model.requests``) and whose limits never sleep between retries;
- the hypothesis settings profile ``agent_fsm`` (no deadline, no too-slow health check,
  200 examples), chosen with ``--agent-fsm-profile=agent_fsm`` or the ini option
  ``agent_fsm_profile``; either one may name any registered profile.

It imports nothing but pytest at load time: every pytest run of anyone who installs
agent_fsm loads it, and hypothesis (the ``testing`` extra) may not be installed. Without
hypothesis the profile options are ignored, and the fixtures still work.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from agent_fsm.agent import Agent
    from agent_fsm.testing.models import ScriptItem

PROFILE = "agent_fsm"
"""The name of the hypothesis profile this plugin registers."""


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("agent_fsm")
    group.addoption(
        "--agent-fsm-profile",
        dest="agent_fsm_profile",
        default=None,
        help=f"load this hypothesis settings profile (e.g. {PROFILE!r}) for the run",
    )
    parser.addini(
        "agent_fsm_profile",
        default="",
        help="the hypothesis settings profile to load (the command line option wins)",
    )


def register_profile() -> bool:
    """Register the ``agent_fsm`` hypothesis profile; False when hypothesis is missing."""
    try:
        from hypothesis import HealthCheck, settings
    except ImportError:
        return False
    settings.register_profile(
        PROFILE,
        max_examples=200,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    return True


def pytest_configure(config: pytest.Config) -> None:
    chosen = config.getoption("agent_fsm_profile") or config.getini("agent_fsm_profile")
    if not register_profile() or not chosen:
        return
    from hypothesis import settings

    settings.load_profile(chosen)


def pytest_report_header(config: pytest.Config) -> str | None:
    chosen = config.getoption("agent_fsm_profile") or config.getini("agent_fsm_profile")
    return f"agent_fsm: hypothesis profile {chosen!r}" if chosen else None


@pytest.fixture
def scripted_agent() -> Callable[..., Agent]:
    """A factory: ``scripted_agent(script, *, tools=(), **agent_options) -> Agent``.

    The agent's model is a ``ScriptedModel(script)``; limits default to ``Limits`` with no
    retry backoff (pass ``limits=`` to choose your own).
    """
    from agent_fsm.agent import Agent
    from agent_fsm.limits import Limits
    from agent_fsm.testing.models import ScriptedModel

    def make(script: Iterable[ScriptItem], *, tools: Iterable[Any] = (), **options: Any) -> Agent:
        options.setdefault("limits", Limits(retry_backoff_s=0.0, retry_backoff_max_s=0.0))
        return Agent(model=ScriptedModel(script), tools=tuple(tools), **options)

    return make
