"""``agent-fsm ui`` in a real browser (issue 36): Debian's headless Chromium, driven through
its chromium-driver by Selenium, opens the runs list, steps through a finished run, answers
an ask_user, approves a call with edited arguments, follows a live run, and the test then
checks the store. The runs list and a run page are photographed on the way: with
``AGENT_FSM_SCREENSHOTS=1`` (``make screenshots``) into ``docs/ui/``, where the README shows
them, so they are made by the suite and cannot rot."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent_fsm import Agent, tool
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.pricing import Pricing
from agent_fsm.table import AgentState, StopReason
from agent_fsm.testing import ScriptedModel, call, reply
from tests.conftest import limits
from tests.ui_support import Runs, paid, sqlite_runs, ui

pytestmark = pytest.mark.slow  # a browser per test: make check leaves it out

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
from selenium.common.exceptions import (  # noqa: E402
    NoSuchElementException,
    StaleElementReferenceException,
)
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

DOCS = Path(__file__).resolve().parent.parent / "docs" / "ui"
PATIENCE_S = 120
"""How long a wait for the page may last before the test fails: a bound, not a measure."""


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_binary = shutil.which("chromedriver")
    if binary is None or driver_binary is None:
        message = "Debian's chromium and chromium-driver are not installed (apt-get install " \
            "chromium chromium-driver)"  # fmt: skip
        if os.environ.get("CI"):
            pytest.fail(f"CI drives the ui in a real browser. {message}")
        pytest.skip(message)
    options = Options()
    options.binary_location = binary
    for argument in (
        "--headless",
        "--no-sandbox",  # CI runs as root
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'profile'}",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=driver_binary), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _photo(browser: WebDriver, name: str, tmp_path: Path) -> None:
    folder = DOCS if os.environ.get("AGENT_FSM_SCREENSHOTS") else tmp_path
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    assert browser.save_screenshot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _waiting(browser: WebDriver) -> WebDriverWait[WebDriver]:
    """A wait that looks again when the page reloads under it (the live feed reloads the
    page when the run stops)."""
    missing = (StaleElementReferenceException, NoSuchElementException)
    return WebDriverWait(browser, PATIENCE_S, ignored_exceptions=missing)


def _stop_shown(browser: WebDriver, stop: str) -> None:
    _waiting(browser).until(lambda b: b.find_element(By.ID, "run-stop").text == stop)


@pytest.fixture
def runs(tmp_path: Path) -> Runs:
    return sqlite_runs(tmp_path)


def test_the_runs_list_and_a_finished_runs_step_through(
    runs: Runs, browser: WebDriver, tmp_path: Path
) -> None:
    priced = Agent(
        model=ScriptedModel([reply("Sunny.", usage=(1200, 300))]),
        tools=[],
        limits=limits(prices={"scripted": Pricing(input_per_million=2.5, output_per_million=10)}),
        store=runs.store,
    )
    paid_run = priced.run_sync("Weather in Rome?").run_id
    with ui(runs) as base:
        browser.get(base + "/")
        rows = browser.find_elements(By.CSS_SELECTOR, "tr.run")
        assert len(rows) == 4
        assert len(browser.find_elements(By.CSS_SELECTOR, "tr.run.paused")) == 2
        cost = browser.find_element(By.CSS_SELECTOR, f'tr[data-run="{paid_run}"] td.cost')
        assert cost.text == "0.0060"
        unpriced = browser.find_element(By.CSS_SELECTOR, f'tr[data-run="{runs.finished}"] td.cost')
        assert unpriced.text == ""
        _photo(browser, "runs.png", tmp_path)
        browser.find_element(By.LINK_TEXT, runs.finished).click()
        assert browser.find_element(By.ID, "run-stop").text == "final_answer"
        edges = browser.find_elements(By.CSS_SELECTOR, "svg.path path.edge")
        assert 0 < len(edges) < 12
        steps = browser.find_elements(By.CSS_SELECTOR, "section.steps li a")
        to_act = next(s for s in steps if "THINK → ACT" in s.text)
        to_act.click()
        step = browser.find_element(By.ID, "step")
        assert "THINK → ACT" in step.text
        assert "get_weather" in step.find_element(By.CLASS_NAME, "reply").text
        assert browser.find_elements(By.CSS_SELECTOR, "svg.path path.edge.current")
        box = browser.find_element(By.CSS_SELECTOR, "svg.path").rect
        assert box["width"] > 400
        assert box["height"] > 100
        browser.get(browser.current_url.split("#")[0])  # the top of the page, for its photo
        _photo(browser, "run.png", tmp_path)


def test_answer_an_ask_user_in_the_page(runs: Runs, browser: WebDriver) -> None:
    with ui(runs) as base:
        browser.get(f"{base}/runs/{runs.asking}")
        assert "Which city, <b>exactly</b>?" in browser.find_element(By.TAG_NAME, "label").text
        browser.find_element(By.ID, "reply").send_keys("Lyon")
        browser.find_element(By.ID, "send-reply").click()
        _stop_shown(browser, "final_answer")
    stored = runs.store.load(runs.asking)
    assert stored.stop_reason is StopReason.FINAL_ANSWER
    assert stored.output == "Sunny in Lyon."
    assert any(m.role == "user" and m.content == "Lyon" for m in stored.messages)


def test_an_agui_input_from_the_page_resumes_a_run(runs: Runs, browser: WebDriver) -> None:
    """An AG-UI front end in the browser, on the ui's origin: its fetch carries the
    browser's own Origin and the page's CSRF token, and the answer comes back as AG-UI
    events."""
    script = """
        const done = arguments[arguments.length - 1];
        const csrf = document.querySelector('input[name="csrf"]').value;
        fetch('/agui', {method: 'POST', headers: {'content-type': 'application/json',
            'x-csrf-token': csrf}, body: JSON.stringify(arguments[0])})
          .then(r => r.text().then(t => done([r.status, t])), e => done([0, String(e)]));
    """
    body = {
        "threadId": runs.asking,
        "runId": "from-the-browser",
        "messages": [{"id": "m1", "role": "user", "content": "Lyon"}],
        "tools": [],
        "state": {},
    }
    with ui(runs) as base:
        browser.get(f"{base}/runs/{runs.asking}")
        browser.set_script_timeout(PATIENCE_S)
        status, text = browser.execute_async_script(script, body)
    assert status == 200, text
    assert '"type":"RUN_FINISHED","threadId":"' + runs.asking in text
    assert '"runId":"from-the-browser"' in text
    stored = runs.store.load(runs.asking)
    assert stored.output == "Sunny in Lyon."


def test_approve_with_edited_arguments_in_the_page(runs: Runs, browser: WebDriver) -> None:
    control = runs.store.load(runs.approving).control
    assert control is not None
    call_id = control.pending_calls[0].id
    with ui(runs) as base:
        browser.get(f"{base}/runs/{runs.approving}")
        arguments = browser.find_element(By.ID, f"arguments:{call_id}")
        arguments.clear()
        arguments.send_keys('{"amount": 50, "to": "bob"}')
        browser.find_element(By.ID, f"reason:{call_id}").send_keys("half is plenty")
        browser.find_element(By.ID, "send-decisions").click()
        _stop_shown(browser, "final_answer")
    assert paid == [(50, "bob")]
    stored = runs.store.load(runs.approving)
    told = [m.content for m in stored.messages if m.role == "user"][-1]
    assert "changed its arguments" in told
    assert "half is plenty" in told


gate = threading.Event()


@tool
def slow_step() -> str:
    """A step that waits for the test's go."""
    gate.wait()
    return "stepped"


def test_a_live_run_updates_in_the_page(tmp_path: Path, browser: WebDriver) -> None:
    gate.clear()
    model = ScriptedModel(
        [reply("", call("ask_user", question="Go?")), reply("", call("slow_step")), "All done."]
    )
    store = SQLiteStore(tmp_path / "live.sqlite3")
    agent = Agent(model=model, tools=[slow_step], limits=limits(), store=store)
    run_id = agent.run_sync("Start").run_id
    live = Runs(store, agent, run_id, run_id, run_id)
    try:
        with ui(live) as base:
            browser.get(f"{base}/runs/{run_id}")
            browser.find_element(By.ID, "reply").send_keys("go")
            browser.find_element(By.ID, "send-reply").click()
            _waiting(browser).until(
                lambda b: "tool call slow_step" in b.find_element(By.ID, "live-events").text
            )
            assert browser.find_element(By.ID, "run-state").text == "ACT"
            gate.set()
            _stop_shown(browser, "final_answer")
            assert not browser.find_elements(By.ID, "live")
    finally:
        gate.set()
    assert store.load(run_id).state is AgentState.DONE
    assert store.load(run_id).output == "All done."
