"""docs/testing.md's python blocks run, in order, in one namespace, so the guide never rots."""

from __future__ import annotations

import re
import unittest
from pathlib import Path

import pytest

from agent_fsm.testing.plugin import scripted_agent

DOC = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def test_the_testing_guide_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the guide writes a trace file
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 10
    namespace: dict[str, object] = {"__name__": "testing_guide"}
    for block in blocks:
        exec(compile(block, str(DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "Reproducer (paste into a test where `agent` is your agent)" in out
    assert "+++ replayed" in out
    assert "the checkpoint holds 6 messages" in out  # the stateful machine caught the store
    # the example tests the guide defines pass too
    factory = scripted_agent.__wrapped__()  # type: ignore[attr-defined]
    namespace["test_weather_agent_finishes"](factory)  # type: ignore[operator]
    assert callable(namespace["test_weather_agent_terminates"])  # the profile decides its size
    stateful = namespace["TestWeatherAgentStateful"]
    assert isinstance(stateful, type)
    assert issubclass(stateful, unittest.TestCase)
