"""The model-adapter contract (``agent_fsm.testing.adapter_contract``) over every adapter
agent_fsm ships, each through its own SDK against a server on 127.0.0.1 that speaks its wire
format (the kits in ``tests/provider_kits`` write it).

Every scenario checks both directions of one adapter: a provider-neutral reply survives the
provider's format (text, calls, finish reason, usage), what the adapter sends (tool results,
system prompt) is what the transcript holds, and its failures are classified the way the
engine's retry rows need.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from agent_fsm.testing import ModelAdapterContract, WireKit
from tests.provider_kits import all_kits
from tests.provider_kits.anthropic import KIT as ANTHROPIC
from tests.provider_kits.gemini import KIT as GEMINI
from tests.provider_kits.openai_chat import KIT as OPENAI_CHAT
from tests.provider_kits.openai_responses import KIT as OPENAI_RESPONSES


class TestOpenAIChat(ModelAdapterContract):
    kit = OPENAI_CHAT


class TestOpenAIResponses(ModelAdapterContract):
    kit = OPENAI_RESPONSES


class TestAnthropic(ModelAdapterContract):
    kit = ANTHROPIC


class TestGemini(ModelAdapterContract):
    kit = GEMINI


def test_every_kit_is_a_wire_kit_and_runs_the_contract() -> None:
    """A kit added to ``tests/provider_kits`` must have its adapter run the contract here."""
    contracts = {cls.kit.name for cls in ModelAdapterContract.__subclasses__()}
    for kit in all_kits():
        assert isinstance(kit, WireKit)
        assert kit.name in contracts


_NO_PLUGINS = ("-p", "no:cacheprovider", "-p", "no:asyncio")


def test_the_readme_s_contract_snippet_runs_as_a_user_s_test_module(tmp_path: Path) -> None:
    """The README shows a kit and a contract class: saved as a test module of its own and
    run by pytest outside this project's configuration, as a user would, it passes (with
    warnings as errors, and without an asyncio plugin: the contract needs none)."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### The adapter contract", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    (tmp_path / "test_my_adapter.py").write_text(block)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-W", "error", *_NO_PLUGINS],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert " passed" in done.stdout
    assert "failed" not in done.stdout
