"""``load_agent``: a user's agent from ``module:attr`` or ``file.py:attr``, and a clear
``ConfigError`` for every way the reference can be wrong."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agent_fsm import Agent, ConfigError
from agent_fsm.loading import load_agent, load_object

AGENT_FILE = """
from agent_fsm import Agent
from agent_fsm.testing import ScriptedModel

agent = Agent(model=ScriptedModel(["hello from a file"]), system_prompt="file agent")

def make():
    return Agent(model=ScriptedModel(["made"]), system_prompt="made by a factory")

def broken():
    raise RuntimeError("no API key")

def wrong():
    return 42

number = 7

class Holder:
    inner = agent
"""


@pytest.fixture
def agent_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_agents.py"
    path.write_text(AGENT_FILE)
    return path


def test_an_agent_from_a_file_runs(agent_file: Path) -> None:
    agent = load_agent(f"{agent_file}:agent")
    assert agent.run_sync("hi").output == "hello from a file"


def test_a_factory_is_called_and_a_dotted_attribute_is_followed(agent_file: Path) -> None:
    assert load_agent(f"{agent_file}:make").system_prompt == "made by a factory"
    assert load_agent(f"{agent_file}:Holder.inner").system_prompt == "file agent"


def test_a_file_is_loaded_once_per_process(agent_file: Path) -> None:
    assert load_agent(f"{agent_file}:agent") is load_agent(f"{agent_file}:agent")


def test_a_module_from_the_current_directory(
    agent_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(agent_file.parent)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".")])
    monkeypatch.delitem(sys.modules, "my_agents", raising=False)
    agent = load_object("my_agents:agent", Agent)
    assert agent.system_prompt == "file agent"


@pytest.mark.parametrize(
    ("reference", "says"),
    [
        ("no_colon_here", "module:attribute"),
        (":agent", "module:attribute"),
        ("{file}:", "module:attribute"),
        ("{file}:missing", "has no attribute 'missing'"),
        ("{file}:number", "is of type int, not Agent"),
        ("{file}:broken", "raised RuntimeError: no API key"),
        ("{file}:wrong", "returned type int, not Agent"),
        ("{file}:agent.1x", "not an attribute path"),
        ("{dir}/absent.py:agent", "there is no file"),
        ("surely_no_such_module_here:agent", "no module named 'surely_no_such_module_here'"),
        ("not a module:agent", "neither a module name nor a .py file"),
    ],
)
def test_every_wrong_reference_is_a_config_error_naming_it(
    agent_file: Path, reference: str, says: str
) -> None:
    reference = reference.format(file=agent_file, dir=agent_file.parent)
    with pytest.raises(ConfigError) as caught:
        load_agent(reference)
    assert says in str(caught.value)
    assert repr(reference) in str(caught.value)


def test_a_file_that_fails_to_import_says_why_and_can_be_fixed(tmp_path: Path) -> None:
    path = tmp_path / "bad_agent.py"
    path.write_text("import surely_not_installed_anywhere\n")
    with pytest.raises(ConfigError, match=r"running .* failed: ModuleNotFoundError"):
        load_agent(f"{path}:agent")
    path.write_text(AGENT_FILE)  # fixed: the failed load left nothing behind
    assert load_agent(f"{path}:agent").system_prompt == "file agent"


def test_a_module_whose_own_import_fails_is_not_called_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "needs_more.py").write_text("import surely_not_installed_anywhere\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="importing needs_more failed: ModuleNotFoundError"):
        load_agent("needs_more:agent")
