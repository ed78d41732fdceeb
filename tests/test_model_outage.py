"""A model server that goes away and comes back: the run that its outage stopped is resumed.

A stdlib HTTP server on 127.0.0.1 speaks just enough of Chat Completions for the openai SDK,
driven through ``OpenAIChatModel``. A transient failure (nothing listening, 503, 429) ends the
run in ERROR ``model_error`` once the consecutive-error limit is reached; the table's
``recover`` row lets ``Agent.resume`` continue it when the server is back. A permanent failure
(401, 400) cannot be resumed.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agent_fsm import Agent, Limits, StopReason
from agent_fsm.errors import ResumeError
from agent_fsm.models.openai_chat import OpenAIChatModel
from agent_fsm.table import AgentState
from agent_fsm.testing import check_invariants
from tests.openai_payloads import api_error, completion


class Outage:
    """What the server answers: ``"ok"`` (a final answer) or an HTTP status to fail with."""

    def __init__(self) -> None:
        self.answer: int | str = "ok"
        self.requests = 0


def _handler(outage: Outage) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            outage.requests += 1
            status, body, headers = 200, completion("The server is back."), {}
            if outage.answer != "ok":
                status = int(outage.answer)
                body = api_error(f"status {status}", type_="server_error")
                if status == 429:
                    headers["Retry-After"] = "0"
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            return

    return Handler


class Server:
    """A server on 127.0.0.1 that can be stopped and started again on the same port."""

    def __init__(self) -> None:
        self.outage = Outage()
        self._httpd: ThreadingHTTPServer | None = None
        self.port = 0

    def start(self) -> None:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self.outage))
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()  # the port now refuses connections
        self._httpd = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"


@pytest.fixture
def server() -> Iterator[Server]:
    running = Server()
    running.start()
    yield running
    if running._httpd is not None:
        running.stop()


async def _no_sleep(_: float) -> None:
    return None


def _agent(server: Server) -> Agent:
    model = OpenAIChatModel("gpt-4o-mini", base_url=server.base_url, api_key="sk-test", timeout=30)
    return Agent(
        model=model,
        limits=Limits(max_turns=6, model_retries=1),
        sleep=_no_sleep,
    )


def _resumed_ok(agent: Agent, run_id: str, failed_trace: int) -> None:
    result = agent.resume_sync(run_id)
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "The server is back.")
    recovered = result.trace[failed_trace]
    assert (recovered.source, recovered.dest, recovered.label) == (
        AgentState.ERROR,
        AgentState.OBSERVE,
        "recover",
    )
    check_invariants(result, limits=agent.limits, bound=agent.bound)


def test_a_run_stopped_by_an_unreachable_server_resumes_when_it_is_back(server: Server) -> None:
    agent = _agent(server)
    server.stop()
    failed = agent.run_sync("Are you there?")
    assert (failed.stop_reason, failed.turns, failed.retries) == (StopReason.MODEL_ERROR, 1, 1)
    server.start()  # the same port, listening again
    _resumed_ok(agent, failed.run_id, len(failed.trace))


@pytest.mark.parametrize("status", [503, 429, 500])
def test_a_run_stopped_by_server_errors_resumes_once_they_pass(server: Server, status: int) -> None:
    agent = _agent(server)
    server.outage.answer = status
    failed = agent.run_sync("Are you there?")
    assert failed.stop_reason is StopReason.MODEL_ERROR
    assert server.outage.requests == 2  # the SDK's own retries are off: the engine's count
    server.outage.answer = "ok"
    _resumed_ok(agent, failed.run_id, len(failed.trace))


@pytest.mark.parametrize("status", [401, 400])
def test_a_permanent_failure_cannot_be_resumed(server: Server, status: int) -> None:
    agent = _agent(server)
    server.outage.answer = status
    failed = agent.run_sync("Are you there?")
    assert (failed.stop_reason, failed.turns) == (StopReason.MODEL_ERROR, 1)
    server.outage.answer = "ok"
    with pytest.raises(ResumeError, match="no resume row accepts it"):
        agent.resume_sync(failed.run_id)
