"""The HTML diagram (issue 40, point 7), in a real browser: Debian's headless Chromium opens
the page from disk, with no network, and mermaid.js (carried by the page, from
``agent_fsm/assets``) draws the machine as SVG. CI installs Chromium (``.ci/run``); there a
missing browser fails these tests instead of skipping them."""

from __future__ import annotations

import os
import shutil
import subprocess
from importlib.resources import files
from pathlib import Path

import pytest

from agent_fsm import Agent, tool
from agent_fsm.diagrams import render
from agent_fsm.table import TABLE, AgentState
from agent_fsm.testing import ScriptedModel, call, reply

pytestmark = pytest.mark.slow  # a browser per test: make check leaves it out


def _browser() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = "Debian's chromium is not installed (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(f"CI draws the HTML diagram in a real browser. {message}")
        pytest.skip(message)
    return found


def _drawn(page: str, folder: Path) -> str:
    """The document as the browser holds it once the page's scripts ran."""
    path = folder / "diagram.html"
    path.write_text(page, encoding="utf-8")
    done = subprocess.run(
        [
            _browser(),
            "--headless",
            "--no-sandbox",  # CI runs as root
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={folder / 'profile'}",
            "--virtual-time-budget=20000",  # the page's time, not the machine's
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=300,  # bounds a hang only
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def _svg(dom: str) -> str:
    start = dom.index('<svg id="mermaid')
    return dom[start : dom.index("</svg>", start)]


def test_the_machine_is_drawn_in_a_browser_with_no_network(tmp_path: Path) -> None:
    svg = _svg(_drawn(render(TABLE, "html"), tmp_path))
    for state in AgentState:
        assert f">{state.value}<" in svg, state
    assert "thought #22 [else] final_answer" in svg


@tool
def echo(text: str) -> str:
    """Echo the text."""
    return text


def test_a_runs_path_alone_is_drawn_with_its_counts(tmp_path: Path) -> None:
    agent = Agent(model=ScriptedModel([reply("", call("echo", text="a")), "done"]), tools=[echo])
    result = agent.run_sync("go")
    svg = _svg(_drawn(agent.diagram("html", run=result, path_only=True), tmp_path))
    assert "observed #9 [else] think ×2" in svg
    assert "final_answer ×1" in svg
    assert "content_filter" not in svg  # edges the run did not take are not drawn
    assert "stopped: final_answer, 2 turns" in svg


def test_the_page_carries_its_script_and_it_is_safe_to_inline() -> None:
    script = (files("agent_fsm") / "assets" / "mermaid.min.js").read_text(encoding="utf-8")
    assert "<script" not in script.lower()
    assert "</script" not in script.lower()
    page = render(TABLE, "html")
    assert script in page
    assert "http://" not in page.split("<script>")[0]  # nothing fetched: all in the page
