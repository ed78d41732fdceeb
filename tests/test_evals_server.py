"""Evals against an OpenAI-compatible server (issue 38): the README's Evals snippet runs the
example dataset through the official SDK over real HTTP to ``tests.local_server`` on
127.0.0.1, whose replies play both the agent and the LLM judge; the judge's calls are
counted and bounded."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import Agent, Limits
from agent_fsm.evals import Dataset, evaluate_sync
from agent_fsm.evals.judge import JUDGE_INSTRUCTIONS
from agent_fsm.models.openai_chat import OpenAIChatModel
from tests.local_server import Behaviour, LocalServer
from tests.openai_payloads import completion, tool_call

ROOT = Path(__file__).resolve().parent.parent
CAPITALS = {"france": "Paris", "australia": "Canberra", "italy": "Rome", "spain": "Madrid"}


class _Answers(deque[Behaviour]):
    """A queue that never runs dry: every request gets ``answer``."""

    def __init__(self, answer: Behaviour) -> None:
        super().__init__()
        self.answer = answer

    def popleft(self) -> Behaviour:
        return self.answer

    def __bool__(self) -> bool:
        return True


class CapitalsServer(LocalServer):
    """Answers as a careful agent would, and as a fair judge: from each request's body."""

    def __init__(self) -> None:
        super().__init__()
        self.behaviours = _Answers(self._answer)
        self.judged = 0

    def _reply_for(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        if messages[0]["content"] == JUDGE_INSTRUCTIONS:
            self.judged += 1
            prompt = messages[-1]["content"]
            verdict = '"Canberra"' in prompt and "Canberra" in prompt.rsplit("answer:", 1)[-1]
            return completion(json.dumps({"pass": verdict, "reason": "checked"}))
        last = messages[-1]
        if last["role"] == "tool":
            return completion(f"The capital is {last['content']}.")
        asked = re.search(r"capital of (\w+)", last["content"])
        if asked:
            arguments = json.dumps({"country": asked.group(1)})
            call = tool_call(f"call_{len(self.seen)}", "lookup_capital", arguments)
            return completion(tool_calls=[call], finish_reason="tool_calls")
        return completion("42")

    async def _answer(self, writer: asyncio.StreamWriter) -> None:
        data = json.dumps(self._reply_for(self.seen[-1][1])).encode()
        head = f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(data)}"
        writer.write(f"{head}\r\n\r\n".encode() + data)


@contextmanager
def serving(server: LocalServer) -> Iterator[str]:
    """Serve on a loop of its own, in a thread: the eval blocks the caller's thread."""
    ready: list[str] = []
    started = threading.Event()
    stop: list[asyncio.Event] = []

    async def main() -> None:
        stop.append(asyncio.Event())
        async with server as base_url:
            ready.append(base_url)
            started.set()
            await stop[0].wait()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert started.wait(60)
    try:
        yield ready[0]
    finally:
        loop.call_soon_threadsafe(stop[0].set)
        thread.join(60)
        loop.close()


def _readme_evals_block() -> str:
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, flags=re.DOTALL)
    return next(block for block in blocks if "def evaluate_capitals" in block)


def test_the_readmes_eval_runs_the_example_dataset_against_a_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(ROOT)
    namespace: dict[str, Any] = {"__name__": "readme"}
    exec(compile(_readme_evals_block(), "README.md", "exec"), namespace)
    monkeypatch.chdir(tmp_path)  # the snippet's store lands here
    server = CapitalsServer()
    with serving(server) as base_url:
        report = namespace["evaluate_capitals"](base_url)
    assert (report.overall.runs, report.overall.passed, report.broken) == (20, 20, 0)
    assert report.judge_calls == server.judged == 5  # the australia case, five times
    assert report.overall.tokens.total > 0  # the server's usage, through the SDK
    assert "overall" in capsys.readouterr().out
    assert (tmp_path / "evals.sqlite3").exists()
    models = {body["model"] for _, body in server.seen}
    assert models == {"qwen2.5-7b-instruct"}


def test_the_judges_calls_through_the_sdk_stop_at_their_budget() -> None:
    dataset = Dataset.load(ROOT / "examples" / "evals" / "capitals.yaml")
    australia = Dataset(name="one", cases=(dataset.cases[1],))
    server = CapitalsServer()
    with serving(server) as base_url:
        model = OpenAIChatModel("local", base_url=base_url, api_key="sk-local")
        agent = Agent(model=model, tools=_tools(), limits=Limits(max_turns=6))
        report = evaluate_sync(agent, australia, repeats=5, judge=model, max_judge_calls=2)
    assert server.judged == report.judge_calls == 2
    assert report.overall.passed == 2
    spent = [v for t in report.trials for v in t.verdicts if "budget spent" in v.reason]
    assert len(spent) == 3
    assert report.judge_tokens > 0


def _tools() -> list[Any]:
    from agent_fsm import tool

    @tool
    def lookup_capital(country: str) -> str:
        """The capital city of a country."""
        return CAPITALS.get(country.strip().lower(), "unknown")

    return [lookup_capital]
