"""The pytest plugin loads on install (entry point), gives its fixture and profile, and
imports cheaply, without hypothesis."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest_plugins = ["pytester"]

USER_TEST = """
from hypothesis import settings

from agent_fsm.testing import call, reply


def test_my_agent(scripted_agent):
    agent = scripted_agent([reply("", call("finish_task", summary="done"))])
    result = agent.run_sync("go")
    assert result.stop_reason.value == "finish_task"
    assert len(agent.model.requests) == 1


def test_the_profile_is_loaded():
    assert settings.default.max_examples == 200
    assert settings.default.deadline is None
"""


def test_the_plugin_loads_in_a_fresh_project(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_user=USER_TEST)
    pytester.makeini("[pytest]\nagent_fsm_profile = agent_fsm\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:asyncio")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*agent_fsm: hypothesis profile 'agent_fsm'*"])


def test_the_command_line_option_is_offered(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_inprocess("-p", "no:asyncio", "--help")
    result.stdout.fnmatch_lines(["*--agent-fsm-profile*", "*agent_fsm_profile*"])


def test_the_plugin_imports_cheaply_and_without_hypothesis() -> None:
    code = (
        "import sys\n"
        "import agent_fsm.testing.plugin\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'hypothesis']\n"
        "for name in [m for m in sys.modules if m.startswith('agent_fsm.testing')]:\n"
        "    del sys.modules[name]\n"
        "sys.modules['hypothesis'] = None  # as if it were not installed\n"
        "import agent_fsm.testing.plugin as plugin\n"
        "import agent_fsm.testing\n"
        "assert plugin.register_profile() is False\n"
        "assert agent_fsm.testing.ScriptedModel\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
