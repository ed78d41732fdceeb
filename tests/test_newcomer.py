"""What a newcomer tripped on (issue 21), each point held by a test."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

import agent_fsm
from agent_fsm import Agent, CheckpointError, MemoryStore, ResumeError, SQLiteStore
from agent_fsm.cli import main
from agent_fsm.state import RunState
from agent_fsm.testing import (
    ScriptedModel,
    assert_terminates,
    call,
    check_exhaustively,
    reply,
)

ROOT = Path(__file__).resolve().parent.parent


def test_the_harness_never_writes_into_the_agents_own_store(tmp_path: Path) -> None:
    with SQLiteStore(tmp_path / "prod.sqlite3") as production:
        agent = Agent(model=ScriptedModel([]), store=production)
        assert_terminates(agent, settings=settings(max_examples=10, database=None))
        check_exhaustively(agent, max_length=2)
        assert production.list_runs() == []


def test_an_error_from_a_sync_method_carries_no_unrelated_chained_error() -> None:
    agent = Agent(model=ScriptedModel([]))
    with pytest.raises(CheckpointError) as caught:
        agent.resume_sync("no-such-run")
    assert caught.value.__context__ is None
    assert caught.value.__cause__ is None


def test_the_version_the_license_and_the_metadata() -> None:
    assert agent_fsm.__version__ == importlib.metadata.version("agent-fsm")
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license-files"] == ["LICENSE"]
    assert project["authors"]
    assert "Typing :: Typed" in project["classifiers"]


def test_the_command_line_tells_its_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"agent-fsm {agent_fsm.__version__}"


def test_a_run_that_asks_the_user_is_not_printed_as_a_final_answer(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agent_fsm import cli

    agent = Agent(model=ScriptedModel([reply("", call("ask_user", question="Which city?"))]))
    code = cli._run_agent(agent, "Weather?", sys.stdout, None)
    out = capsys.readouterr().out
    assert code == 0
    assert "question for you: Which city?" in out
    assert "final answer" not in out


def test_a_reader_that_stops_early_ends_the_listing_quietly(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite3"
    with SQLiteStore(path) as store:
        for i in range(2000):
            store.save(RunState(run_id=f"run-{i:04d}", pending_input=["go"]))
    listing = subprocess.Popen(
        [sys.executable, "-m", "agent_fsm.cli", "runs", "--store", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert listing.stdout is not None
    listing.stdout.readline()
    listing.stdout.close()  # like `| head -1`
    _, errors = listing.communicate()
    assert b"Broken pipe" not in errors
    assert b"Traceback" not in errors
    assert listing.returncode == 0


def test_a_repeated_preamble_before_calls_that_progress_is_not_a_loop() -> None:
    from agent_fsm import StopReason, tool

    @tool
    def search(query: str) -> str:
        """Search the web."""
        return f"results for {query}"

    script = [reply("Let me search.", call("search", query=f"q{i}")) for i in range(4)]
    agent = Agent(model=ScriptedModel([*script, "Found it."]), tools=[search])
    result = agent.run_sync("Find it.")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    # the same text with the same call is still a loop
    same = [reply("Let me search.", call("search", query="q")) for _ in range(4)]
    looping = Agent(model=ScriptedModel([*same, "x"]), tools=[search]).run_sync("Find it.")
    assert looping.stop_reason is StopReason.LOOP_DETECTED


def test_a_tool_failure_keeps_its_traceback_and_is_logged() -> None:
    import logging

    import structlog

    from agent_fsm import tool
    from agent_fsm.messages import ToolMessage

    @tool
    def parse(text: str) -> int:
        """Parse a number."""
        return int(text)

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    agent = Agent(model=ScriptedModel([reply("", call("parse", text="x")), "ok"]), tools=[parse])
    with structlog.testing.capture_logs() as logs:
        result = agent.run_sync("go")
    failed = next(m for m in result.messages if isinstance(m, ToolMessage))
    assert failed.is_error
    assert "Traceback" not in failed.content  # the model sees the error, not the stack
    assert isinstance(failed.details, dict)
    where = failed.details["runtime"]["traceback"]  # type: ignore[index,call-overload]
    assert "ValueError" in where
    assert "return int(text)" in where
    (line,) = [entry for entry in logs if entry["event"] == "tool_call_failed"]
    assert (line["log_level"], line["tool"], line["run_id"]) == ("warning", "parse", result.run_id)


def test_misuse_is_refused_when_the_agent_is_built() -> None:
    from agent_fsm import ConfigError, Limits, tool
    from agent_fsm.errors import DiagramError
    from agent_fsm.messages import ModelRequest, ModelResponse

    with pytest.raises(ConfigError, match="max_turns must be a number, not True or False"):
        Limits(max_turns=True)

    with pytest.raises(ConfigError, match="'anything' has no type annotation"):

        @tool
        def untyped(anything) -> str:  # type: ignore[no-untyped-def]
            """Take anything."""
            return str(anything)

    class SyncModel:
        name = "sync"

        def request(self, request: ModelRequest) -> ModelResponse:
            raise AssertionError("never called")

    with pytest.raises(ConfigError, match="whose request is not async"):
        Agent(model=SyncModel())  # type: ignore[arg-type]

    with pytest.raises(DiagramError, match="unknown diagram format 'pdf'"):
        Agent(model=ScriptedModel([])).diagram("pdf")


def test_the_testing_extra_missing_says_how_to_install_it() -> None:
    script = (
        "import sys\n"
        "sys.modules['hypothesis'] = None\n"
        "import agent_fsm.testing as testing\n"
        "testing.ScriptedModel([])\n"  # the fake models need no extra
        "try:\n"
        "    testing.assert_terminates\n"
        "except ModuleNotFoundError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert "pip install -e '.[testing]'" in out.stdout, out.stderr


def test_diagram_of_a_trace_with_several_runs_names_the_option(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_fsm.durable import TraceWriter

    path = tmp_path / "two.jsonl"
    agent = Agent(model=ScriptedModel(["one", "two"])).subscribe(TraceWriter(path))
    agent.run_sync("first")
    agent.run_sync("second")
    assert main(["diagram", "--trace", str(path)]) == 2
    assert "pick one with --run ID" in capsys.readouterr().err


def test_an_example_answers_help_without_running() -> None:
    shown = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "loop_detection.py"), "--help"],
        capture_output=True,
        text=True,
    )
    assert shown.returncode == 0
    assert shown.stdout.startswith("usage:")
    assert "stopped after" not in shown.stdout


def test_the_pytest_plugin_loads_without_the_engine() -> None:
    """Every pytest run where agent_fsm is installed loads the plugin: it must not import the
    engine (half a second) until a fixture or a name is used."""
    script = (
        "import sys\n"
        "import agent_fsm.testing.plugin\n"
        "loaded = [m for m in ('agent_fsm.agent', 'agent_fsm.run.engine', 'transitions',\n"
        "          'pydantic', 'hypothesis') if m in sys.modules]\n"
        "print(loaded)\n"
        "from agent_fsm import Agent\n"
        "from agent_fsm.testing import ScriptedModel\n"
        "print(Agent(model=ScriptedModel(['hi'])).run_sync('x').output)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.stdout.splitlines() == ["[]", "hi"], out.stderr


def test_the_lazy_public_names_are_the_public_face() -> None:
    from agent_fsm import testing

    assert set(agent_fsm._WHERE) == set(agent_fsm.__all__)
    assert set(testing._WHERE) == set(testing.__all__)
    assert set(dir(agent_fsm)) >= set(agent_fsm.__all__)


async def test_closing_a_stream_early_stops_its_run() -> None:
    import asyncio
    import contextlib

    from agent_fsm import StopReason, tool

    calls: list[int] = []

    @tool
    async def step(n: int) -> int:
        """Do one step (a side effect)."""
        calls.append(n)
        await asyncio.sleep(0)
        return n

    script = [reply("", call("step", n=i)) for i in range(200)]
    agent = Agent(model=ScriptedModel([*script, "done"]), tools=[step], store=MemoryStore())
    run_id = ""
    async with contextlib.aclosing(agent.stream("go")) as events:
        async for event in events:
            run_id = getattr(event, "run_id", run_id)
            if event.kind == "tool_finished":
                break
    made = len(calls)
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(calls) == made < 200  # nothing ran after the stream was closed
    stopped = agent.checkpoints.load(run_id)
    assert stopped.stop_reason is StopReason.ABORTED  # ended cleanly, resumable


def test_a_read_only_store_is_refused_when_it_is_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    path = tmp_path / "runs.sqlite3"
    with SQLiteStore(path) as store:
        store.save(RunState(run_id="kept", pending_input=["go"]))
    connect = sqlite3.connect

    def read_only(database: str, **options: Any) -> sqlite3.Connection:
        # What sqlite falls back to when the file or its file system is not writable
        # (file permissions cannot show it: the tests may run as root).
        return connect(f"file:{database}?mode=ro", uri=True, **options)

    monkeypatch.setattr(sqlite3, "connect", read_only)
    with pytest.raises(CheckpointError, match=r"cannot be written.*readonly"):
        SQLiteStore(path)
    monkeypatch.undo()
    with SQLiteStore(path) as store:
        assert store.exists("kept")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through file permissions")
def test_a_store_file_without_write_permission_is_refused_when_it_is_opened(
    tmp_path: Path,
) -> None:
    path = tmp_path / "runs.sqlite3"
    SQLiteStore(path).close()
    path.chmod(0o444)
    with pytest.raises(CheckpointError, match="cannot be written"):
        SQLiteStore(path)


@pytest.mark.parametrize("kind", ["default", "memory", "sqlite"])
def test_every_store_says_a_finished_run_has_finished(tmp_path: Path, kind: str) -> None:
    store = {
        "default": None,
        "memory": MemoryStore(),
        "sqlite": SQLiteStore(tmp_path / "runs.sqlite3"),
    }[kind]
    agent = Agent(model=ScriptedModel([reply("Paris.")]), store=store)
    result = agent.run_sync("Capital of France?")
    for answer in (None, "and Spain?"):
        with pytest.raises(
            ResumeError, match=rf"run {result.run_id} has finished \(final_answer\)"
        ):
            agent.resume_sync(result.run_id, answer)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        agent.resume_sync("never-ran")
