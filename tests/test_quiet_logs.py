"""Silent unless configured (issue 35, point 6): a program that configured no logging sees no
line from agent_fsm, an ordinary tool error included; the command line shows warnings with
``-v``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow  # real processes

_FAILING_TOOL = textwrap.dedent(
    """
    from agent_fsm import Agent, tool
    from agent_fsm.testing import ScriptedModel, call, reply

    @tool
    def parse(text: str) -> int:
        \"\"\"Parse a number.\"\"\"
        return int(text)

    model = ScriptedModel([reply("", call("parse", text="x")), "done"])
    result = Agent(model=model, tools=[parse]).run_sync("go")
    print(result.stop_reason)
    """
)


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=dict(os.environ), check=False
    )


def test_an_unconfigured_program_sees_no_log_line_for_a_tool_error() -> None:
    done = _python("-c", _FAILING_TOOL)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "final_answer"
    assert done.stderr == ""


def test_a_program_that_configures_logging_gets_the_line() -> None:
    done = _python("-c", "import logging; logging.basicConfig()\n" + _FAILING_TOOL)
    assert done.returncode == 0, done.stderr
    assert "tool_call_failed" in done.stderr


def test_the_command_line_shows_warnings_only_with_verbose() -> None:
    quiet = _python("-m", "agent_fsm.cli", "demo")
    assert quiet.returncode == 0, quiet.stderr
    assert "tool_call_failed" not in quiet.stderr
    verbose = _python("-m", "agent_fsm.cli", "-v", "demo")
    assert verbose.returncode == 0, verbose.stderr
    assert "tool_call_failed" in verbose.stderr
