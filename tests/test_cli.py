"""The agent-fsm command: demo, diagram, and run against a local OpenAI-compatible server."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import CheckpointError
from agent_fsm.cli import main
from agent_fsm.diagrams import render
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.durable.tracefile import TraceWriter, read_run
from agent_fsm.state import RunState
from agent_fsm.table import TABLE, AgentState
from agent_fsm.testing import call, reply
from tests.conftest import make_agent

ROOT = Path(__file__).resolve().parent.parent


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


def test_diagram_of_a_table_of_your_own(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """--table draws a Table (or an Agent) of a file or module, verified first."""
    assert main(["diagram", "--table", "examples/plan_execute.py:TABLE"]) == 0
    drawn = capsys.readouterr().out
    assert drawn == (ROOT / "diagrams" / "plan_execute.mmd").read_text()
    assert "REFLECT --> PLAN : reflected #26 [replan_wanted] replan" in drawn
    assert main(["diagram", "--table", "agent_fsm.table:TABLE"]) == 0
    assert capsys.readouterr().out == render(TABLE, "mermaid")
    looping = tmp_path / "looping.py"
    looping.write_text(
        "from agent_fsm import Row, Table\n"
        "TABLE = Table.default().replace(\n"
        "    ('ACT', 'reflect'), Row('acted', 'ACT', 'THINK', (), 'again')\n"
        ")\n"
    )
    for where, error in [
        (f"{looping}:TABLE", "cycle THINK -> ACT -> THINK skips the turn gate"),
        (f"{looping}:MISSING", "is not a Table, a tuple of Rows or an Agent"),
        ("no_such_module:TABLE", "cannot load no_such_module"),
        ("TABLE", "wants FILE.py:NAME or MODULE:NAME"),
    ]:
        assert main(["diagram", "--table", where]) == 2
        assert error in capsys.readouterr().err


def _transitions(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[turn ")]


@pytest.fixture
def demo_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[Path, str]:
    """The demo run, recorded with --trace; returns the file and what the demo printed."""
    path = tmp_path / "demo.jsonl"
    assert main(["demo", "--trace", str(path)]) == 0
    captured = capsys.readouterr()
    assert f"trace written to {path}" in captured.err
    return path, captured.out


def test_demo_trace_records_the_run(demo_trace: tuple[Path, str]) -> None:
    path, out = demo_trace
    recorded = read_run(path)
    assert recorded.stop_reason is not None
    assert recorded.stop_reason.value == "final_answer"
    assert recorded.turns == 4
    assert len(recorded.trace) == len(_transitions(out)) == 14


@pytest.mark.parametrize("command", ["replay", "trace"])
def test_replay_prints_the_recorded_run_step_by_step(
    command: str, demo_trace: tuple[Path, str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, demo_out = demo_trace
    assert main([command, str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"run:      {read_run(path).run_id}\nquestion: What's the weather")
    # the same transitions, guards, labels and turns the live run printed, in order
    assert _transitions(out) == _transitions(demo_out)
    assert "[turn 1]   THINK → ACT     guard: reply_has_tool_calls   (act)" in out
    assert 'tool call:  calculator({"expression": "31 * 9 / 5 + 32"})' in out
    # and the same outcome
    summary = demo_out[demo_out.index("final answer:") :]
    assert out.endswith(summary)
    assert "tokens:       1249 (1183 in, 66 out)" in out


def test_diagram_with_a_trace_overlays_the_run(
    demo_trace: tuple[Path, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, _ = demo_trace
    assert main(["diagram", "--trace", str(path)]) == 0
    out = capsys.readouterr().out
    assert out == render(TABLE, "mermaid", run=read_run(path))
    assert "OBSERVE --> THINK : observed #9 [else] think ×4" in out
    assert "THINK --> ACT : thought #17 [reply_has_tool_calls] act ×3" in out
    assert "class DONE stopped_ok" in out
    assert "note right of DONE : stopped﹕ final_answer, 4 turns" in out
    # the format follows the output file's suffix
    target = tmp_path / "run.dot"
    assert main(["diagram", "--trace", str(path), "-o", str(target)]) == 0
    assert "think ×4" in target.read_text(encoding="utf-8")
    assert target.read_text(encoding="utf-8").startswith("digraph agent_fsm {")


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` is not on PATH")
def test_diagram_svg_and_png_files(demo_trace: tuple[Path, str], tmp_path: Path) -> None:
    path, _ = demo_trace
    assert main(["diagram", "--trace", str(path), "-o", str(tmp_path / "run.svg")]) == 0
    assert "think ×4" in (tmp_path / "run.svg").read_text(encoding="utf-8")
    assert main(["diagram", "--format", "png", "-o", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").read_bytes().startswith(b"\x89PNG")


def test_diagram_svg_without_graphviz_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["diagram", "--format", "svg"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "apt-get install graphviz" in captured.err
    assert "brew install graphviz" in captured.err


def test_replay_of_a_failed_run_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "failed.jsonl"
    agent, _ = make_agent([reply("", call("echo", text=str(i))) for i in range(5)], max_turns=2)
    agent = agent.subscribe(TraceWriter(path))
    live = agent.run_sync("go")
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert "[turn 2] REFLECT → ERROR   guard: no_turns_left" in out
    assert live.error == "all 2 turns used"
    assert f"error: {live.error}\n" in out  # replay shows the live run's own error text
    assert "status:       failed" in out


def test_replay_of_an_unfinished_run_exits_1(
    demo_trace: tuple[Path, str], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path, _ = demo_trace
    cut = tmp_path / "cut.jsonl"
    cut.write_text("".join(path.read_text(encoding="utf-8").splitlines(keepends=True)[:9]))
    assert main(["replay", str(cut)]) == 1
    assert "the run did not finish: the trace ends after" in capsys.readouterr().out


def test_unreadable_traces_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind":"run_started","run_id":"r","input":"hi"}\n{oops\n')
    for argv in (["replay", str(bad)], ["diagram", "--trace", str(bad)]):
        assert main(argv) == 2
        captured = capsys.readouterr()
        assert captured.out == ""
        assert re.search(r"agent-fsm: .*bad\.jsonl:2: not an agent_fsm event", captured.err)
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "No such file or directory" in capsys.readouterr().err
    assert main(["demo", "--trace", str(tmp_path / "no" / "dir.jsonl")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "No such file or directory" in captured.err


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_progress_line_that_rewrites_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    terminal = _Terminal()
    monkeypatch.setattr("sys.stdout", terminal)
    assert main(["demo"]) == 0
    out = terminal.getvalue()
    assert "\r\x1b[2K… turn 1/8 · 0 tokens · THINK: waiting for the model" in out
    assert "· 230 tokens · ACT: running get_weather" in out
    # the plain lines are all there once the progress line is erased
    plain = re.sub(r"\r\x1b\[2K[^\r\n]*?(?=\r|$)", "", out)
    plain = plain.replace("\r\x1b[2K", "")
    assert "… turn" not in plain
    assert "final answer: It is sunny in Beijing at 31 °C, which is 87.8 °F." in plain
    assert len(_transitions(plain)) == 14


def test_piped_output_has_no_progress_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "\r" not in out
    assert "… turn" not in out


def test_help_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for word in ("demo", "run", "diagram", "replay", "exit codes: 0 ok, 1 the run failed"):
        assert word in out


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


def test_runs_lists_a_store_shows_a_run_and_draws_its_path(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = str(tmp_path / "runs.sqlite3")
    assert main(["demo", "--store", db]) == 0
    capsys.readouterr()

    assert main(["runs", "--store", db]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split() == ["RUN", "STATE", "STOP", "TURNS", "TOKENS", "UPDATED", "LEASE"]
    assert len(listing) == 2
    run_id, state, stop, turns, tokens = listing[1].split()[:5]
    assert (state, stop, turns, tokens) == ("DONE", "final_answer", "4", "1249")
    assert listing[1].endswith("  -")  # never leased

    assert main(["runs", run_id, "--store", db]) == 0
    shown = capsys.readouterr().out
    assert "state:    DONE (final_answer)" in shown
    assert "lease:    none live" in shown
    assert '  assistant: Let me look up the weather. · get_weather({"city": "Beijing"})' in shown

    assert main(["diagram", "--run", run_id, "--store", db]) == 0
    drawn = capsys.readouterr().out
    assert "THINK --> ACT : thought #17 [reply_has_tool_calls] act ×3" in drawn
    assert f"stopped﹕ final_answer, 4 turns (run {run_id[:12]})" in drawn


def test_runs_errors_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.sqlite3")
    assert main(["runs", "--store", missing]) == 2
    assert "no checkpoint store at" in capsys.readouterr().err
    assert not Path(missing).exists()
    db = str(tmp_path / "runs.sqlite3")
    assert main(["demo", "--store", db]) == 0
    capsys.readouterr()
    assert main(["runs", "nope", "--store", db]) == 2
    assert "nope" in capsys.readouterr().err


# -- the fleet: runs on PostgreSQL (issue 34) --------------------------------------------------


def _fleet(store: CheckpointStore) -> None:
    """Four runs as a fleet leaves them: one done, one driven now, one whose worker died
    mid-run (its lease expired), and one in a custom state nobody leased."""
    store.save(RunState(run_id="done", state=AgentState.DONE, trace=[(0, 0)]))
    assert isinstance(store, LeaseStore)
    dead = store.claim("dead", "worker-b", 0.2)
    store.save(RunState(run_id="dead", state=AgentState.THINK), lease=dead)
    time.sleep(0.2)  # the lease's ttl: then it has expired (on the server's clock)
    for _ in range(200):
        if store.lease("dead") is None:
            break
        time.sleep(0.05)
    alive = store.claim("alive", "worker-a", 600)
    store.save(RunState(run_id="alive", state=AgentState.ACT), lease=alive)
    store.save(RunState(run_id="triage", state="TRIAGE"))


def test_runs_lists_a_postgres_fleet_with_leases_and_stuck_runs(
    postgres_url: str, postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_fsm.durable.postgres import PostgresStore

    with PostgresStore(postgres_url, schema=postgres_schema) as store:
        _fleet(store)
    store_args = ["--store", postgres_url, "--schema", postgres_schema]
    assert main(["runs", *store_args]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert list(lines) == ["triage", "alive", "dead", "done", "1"]
    assert " worker-a until " in lines["alive"]
    assert not lines["alive"].endswith("STUCK")
    assert " worker-b expired " in lines["dead"]
    assert lines["dead"].endswith("  STUCK")
    assert lines["done"].endswith("  -")
    assert lines["1"].startswith("1 stuck: not stopped, and no worker holds a live lease")
    assert main(["runs", *store_args, "--state", "think", "--state", "TRIAGE"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:] if line]
    assert listed[:2] == ["triage", "dead"]
    assert main(["runs", "alive", *store_args]) == 0
    assert "lease:    worker-a until " in capsys.readouterr().out
    assert main(["diagram", "--run", "done", *store_args]) == 0
    assert capsys.readouterr().out.startswith("stateDiagram-v2")


def test_runs_never_prints_a_password(
    postgres_url: str, postgres_schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 34: the error of a PostgreSQL store printed its URL, password and all."""
    from psycopg.conninfo import conninfo_to_dict

    from agent_fsm.durable.postgres import PostgresStore

    password = conninfo_to_dict(postgres_url)["password"]
    assert password
    wrong = postgres_url.replace(f":{password}@", ":not-the-password@")
    refused = re.sub(r"@[^/]+/", "@127.0.0.1:9/", postgres_url)
    for url, said in [
        (postgres_url, "no agent_fsm checkpoint store at"),  # no such schema: none is made
        (wrong, "password authentication failed"),
        (refused, "nothing accepts connections there"),
        ("postgresql://agents:hunter2@db%zz/agents", "not a PostgreSQL connection"),
    ]:
        assert main(["runs", "--store", url, "--schema", postgres_schema]) == 2
        captured = capsys.readouterr()
        assert said in captured.err
        for secret in (password, "not-the-password", "hunter"):
            assert secret not in captured.err + captured.out
        assert captured.err.count("\n") == 1  # one line
    with pytest.raises(CheckpointError):  # looking did not lay the schema out
        PostgresStore(postgres_url, schema=postgres_schema, create=False)


def test_a_postgres_url_given_where_a_sqlite_file_is_expected(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agent-fsm run --store URL`` opens SQLite: it refuses the URL, without its password."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    url = "postgresql://agents:hunter2@db.internal:5432/agents"
    code = main(
        ["run", "hi", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--store", url]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "is a PostgreSQL URL, not a SQLite file" in err
    assert "hunter2" not in err
    assert "postgresql://agents:***@db.internal:5432/agents" in err


# -- what a user types or points at never prints a traceback (issue 33, point 8) ---------------


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert captured.err.startswith("agent-fsm: ")
    assert captured.err.count("\n") == 1, captured.err
    return captured.err


def test_a_set_value_nested_too_deep_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model = ["--model", "m", "--base-url", "http://127.0.0.1:9/v1"]
    for value in ["[" * 100_000, "[" * 65 + "]" * 65, json.dumps({"a": [[[[{"b": [[[[1]]]]}]]]]})]:
        argv = ["run", "hi", *model, "--set", f"x={value}"]
        if value.startswith("{"):  # 10 levels: fine, it is sent (and the server is down)
            assert main([*argv, "--retries", "0"]) == 1
            capsys.readouterr()
            continue
        assert "--set x: the value nests deeper than 64 levels" in _one_line_error(capsys, argv)


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"TABLE = 1\x00\n", "cannot load"),  # a NUL byte
        (b"x = '\xff\xfe'\n", "cannot load"),  # not UTF-8
        (b"def (:\n", "SyntaxError"),
        (b"raise RuntimeError('boom')\n", "RuntimeError: boom"),
        (b"import sys\nsys.exit(3)\n", "exited: 3"),
        (b"TABLE = [" * 1 + b"1]\n", "is not a Table"),
    ],
)
def test_a_table_file_that_is_not_a_table_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: bytes, said: str
) -> None:
    path = tmp_path / "table.py"
    path.write_bytes(content)
    assert said in _one_line_error(capsys, ["diagram", "--table", f"{path}:TABLE"])


def test_a_table_module_that_cannot_be_imported_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "raises_on_import.py").write_text("raise ValueError('no import for you')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for where, said in [
        ("raises_on_import:TABLE", "ValueError: no import for you"),
        (".relative:TABLE", "cannot load .relative"),
        ("pkg.:TABLE", "cannot load pkg."),
    ]:
        assert said in _one_line_error(capsys, ["diagram", "--table", where])


def test_text_that_is_not_utf8_is_printed_escaped_not_a_traceback(tmp_path: Path) -> None:
    """A question (or run id) from argv holding bytes that are not UTF-8 reaches the program
    as lone surrogates; with a strict stdout (PYTHONIOENCODING=utf-8) printing one raised
    ``UnicodeEncodeError``."""
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    env.pop("OPENAI_API_KEY", None)
    command = [sys.executable, "-m", "agent_fsm.cli"]
    asked = subprocess.run(
        [*command, "run", b"caf\xe9".decode("utf-8", "surrogateescape"), "--model", "m",
         "--base-url", "http://127.0.0.1:9/v1", "--retries", "0"],
        capture_output=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert b"Traceback" not in asked.stderr
    assert asked.returncode == 1  # the server is down: the run failed, and says so
    assert b"question: caf\\udce9" in asked.stdout
    db = tmp_path / "runs.sqlite3"
    assert main(["demo", "--store", str(db)]) == 0
    shown = subprocess.run(
        [*command, "runs", b"\xff".decode("utf-8", "surrogateescape"), "--store", str(db)],
        capture_output=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 2
    assert b"Traceback" not in shown.stderr
    assert shown.stderr.startswith(b"agent-fsm: run id '\\udcff' is not valid text")
