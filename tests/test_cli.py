"""The agent-fsm command: demo, diagram, and run against a local OpenAI-compatible server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from agent_fsm.cli import main


def test_demo_prints_the_whole_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "OBSERVE → THINK" in out
    assert "guard: reply_has_tool_calls" in out
    assert 'tool call:  get_weather({"city": "Beijing"})' in out
    assert "result error Tool 'calculator' failed: SyntaxError" in out
    assert "result ok    87.8" in out
    assert "final answer: It is sunny in Beijing at 31 °C, which is 87.8 °F." in out
    assert "stop reason:  final_answer" in out
    assert "turns:        4" in out
    assert "tokens:       1249 (1183 in, 66 out)" in out


def test_diagram_to_stdout_and_file(capsys: pytest.CaptureFixture[str], tmp_path: Any) -> None:
    assert main(["diagram"]) == 0
    assert capsys.readouterr().out.startswith("stateDiagram-v2")
    target = tmp_path / "m.dot"
    assert main(["diagram", "--format", "dot", "-o", str(target)]) == 0
    assert target.read_text().startswith("digraph agent_fsm {")


def test_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["diagram", "--format", "gif"])
    assert exit_info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "local",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 50, "completion_tokens": 5, "total_tokens": 55},
    }


@pytest.fixture
def local_server() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A minimal Chat Completions server on 127.0.0.1 that asks for one tool call, then
    answers; it records the request bodies it received."""
    bodies: list[dict[str, Any]] = []
    replies = [
        _completion(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
                    }
                ],
            },
            "tool_calls",
        ),
        _completion({"role": "assistant", "content": "It is 42."}, "stop"),
    ]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            bodies.append(json.loads(self.rfile.read(length)))
            payload = json.dumps(replies[min(len(bodies), len(replies)) - 1]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", bodies
    finally:
        server.shutdown()
        server.server_close()


def test_run_against_a_local_server(
    local_server: tuple[str, list[dict[str, Any]]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    base_url, bodies = local_server
    code = main(["run", "What is 6*7?", "--model", "local", "--base-url", base_url])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "result ok    42.0" in out
    assert "final answer: It is 42." in out
    assert "tokens:       110 (100 in, 10 out)" in out
    assert len(bodies) == 2
    assert bodies[1]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "call_a",
        "content": "42.0",
    }
    assert {t["function"]["name"] for t in bodies[0]["tools"]} == {
        "get_weather",
        "calculator",
        "ask_user",
        "finish_task",
    }
