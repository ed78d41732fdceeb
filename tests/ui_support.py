"""What the ui's tests share: a store with runs in every kind of stop, the agent that made
them (to steer with), and the app served by uvicorn on 127.0.0.1 in a thread."""

from __future__ import annotations

import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

uvicorn = pytest.importorskip("uvicorn", reason="the ui extra is not installed")

from agent_fsm import Agent, tool  # noqa: E402
from agent_fsm.durable.checkpoint import CheckpointStore  # noqa: E402
from agent_fsm.durable.sqlite import SQLiteStore  # noqa: E402
from agent_fsm.testing import ScriptedModel, call, reply  # noqa: E402
from agent_fsm.ui.app import create_app  # noqa: E402
from tests.conftest import limits  # noqa: E402

paid: list[tuple[int, str]] = []


@tool(requires_approval=True)
def transfer(amount: int, to: str) -> str:
    """Send money."""
    paid.append((amount, to))
    return f"sent {amount} to {to}"


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


@dataclass
class Runs:
    """A store holding a finished run, one paused on ask_user, one on an approval."""

    store: CheckpointStore
    agent: Agent
    finished: str
    asking: str
    approving: str


def make_runs(store: CheckpointStore) -> Runs:
    """Three runs of one agent: answered, asking, awaiting approval; the model's script goes
    on past each pause, so the ui can resume them."""
    paid.clear()
    model = ScriptedModel(
        [
            reply("", call("get_weather", city="Paris")),
            "It is sunny in Paris.",
            reply("Let me ask.", call("ask_user", question="Which city, <b>exactly</b>?")),
            reply("", call("transfer", amount=500, to="bob")),
            reply("", call("get_weather", city="Lyon")),
            "Sunny in Lyon.",
            "Paid bob.",
        ]
    )
    agent = Agent(model=model, tools=[transfer, get_weather], limits=limits(), store=store)
    finished = agent.run_sync("Weather in Paris?").run_id
    asking = agent.run_sync("Weather?").run_id
    approving = agent.run_sync("Pay bob 500.").run_id
    return Runs(store, agent, finished, asking, approving)


def sqlite_runs(folder: Path) -> Runs:
    return make_runs(SQLiteStore(folder / "runs.sqlite3"))


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served on a free port of 127.0.0.1 until the block ends; its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws="none"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started and thread.is_alive():
        time.sleep(0.02)
    assert server.started, "the ui server did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()
        sock.close()


@contextmanager
def ui(runs: Runs, **options: Any) -> Iterator[str]:
    app = create_app(runs.store, store_name="runs.sqlite3", agent=runs.agent, **options)
    with serving(app) as base:
        yield base


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
    """The status, body and headers of a GET (no redirect followed)."""
    opener = urllib.request.build_opener(NoRedirect)
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with opener.open(request) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)


def post(
    url: str, fields: dict[str, str], headers: dict[str, str] | None = None
) -> tuple[int, str, dict[str, str]]:
    """The status, body and headers of a form POST (no redirect followed)."""
    opener = urllib.request.build_opener(NoRedirect)
    data = urlencode(fields).encode()
    request = urllib.request.Request(url, data=data, headers=headers or {}, method="POST")
    try:
        with opener.open(request) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(), dict(error.headers)
