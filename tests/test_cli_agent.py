"""``agent-fsm run --agent module:attr`` runs your own agent, and ``resume`` resumes a run only
with the agent that made it, keeping the run's approval rules; an outage prints the run's id
and the command that resumes it (issue 35, point 5). Each command runs in a subprocess
against ``tests.local_server`` on 127.0.0.1; the printed commands are followed as a person
pastes them."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

from tests.local_server import LocalServer, refused_url
from tests.openai_payloads import api_error, completion, tool_call
from tests.test_cli_model import ROOT, Finished, agent_fsm

pytestmark = pytest.mark.slow  # real processes and servers: make check leaves it out

SUPPORT = "tests.cli_agents:support"


def _env(url: str, tmp_path: Path) -> dict[str, str]:
    return {"CLI_AGENT_URL": url, "CLI_AGENT_REFUNDS": str(tmp_path / "refunds.log")}


def _refunds(tmp_path: Path) -> list[str]:
    log = tmp_path / "refunds.log"
    return log.read_text().splitlines() if log.exists() else []


def _line(done: Finished, start: str) -> str:
    found = [line for line in done.out.splitlines() if line.startswith(start)]
    assert found, f"no line starting {start!r} in:\n{done.out}\n{done.err}"
    return found[-1]


def _refund_call(call_id: str, order: str) -> dict[str, object]:
    return completion(
        tool_calls=[tool_call(call_id, "refund", f'{{"order_id": "{order}"}}')],
        finish_reason="tool_calls",
    )


@pytest.mark.parametrize("reference", [SUPPORT, "tests/cli_agents.py:support"])
async def test_run_drives_your_agent(tmp_path: Path, reference: str) -> None:
    """The agent's tools, prompt and model (built by its factory) reach the server, and its
    tool runs."""
    server = LocalServer()
    async with server as url:
        server.reply(
            completion(
                tool_calls=[tool_call("c1", "lookup_order", '{"order_id": "7"}')],
                finish_reason="tool_calls",
            )
        )
        server.reply(completion("Order 7 has shipped."))
        done = await agent_fsm(
            "run", "Where is order 7?", "--agent", reference, env=_env(url, tmp_path)
        )
    assert done.code == 0, done.err + done.out
    assert "final answer: Order 7 has shipped." in done.out
    first, second = server.bodies
    assert first["model"] == "desk-model"
    assert first["messages"][0] == {"role": "system", "content": "You are the support desk."}
    offered = {spec["function"]["name"] for spec in first["tools"]}
    assert {"lookup_order", "refund"} <= offered
    assert "get_weather" not in offered
    assert second["messages"][-1]["content"] == "order 7: shipped"


async def test_options_given_replace_the_agents_own(tmp_path: Path) -> None:
    """--model and the server options build the model, --system the prompt, --max-turns the
    limit; the agent's own model (a refused address here) is never called."""
    server = LocalServer()
    async with server as url:
        server.reply(_refund_call("c1", "9"))
        done = await agent_fsm(
            "run", "Refund order 9", "--agent", SUPPORT, "--model", "other",
            "--base-url", url, "--system", "Be brief.", "--max-turns", "1",
            "--temperature", "0.3",
            env=_env(refused_url(), tmp_path),
        )  # fmt: skip
    assert done.code == 1, done.err + done.out
    assert "stop reason:  max_turns" in done.out
    [body] = server.bodies
    assert (body["model"], body["temperature"]) == ("other", 0.3)
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--agent", SUPPORT, "--temperature", "0.2"), "--temperature configure the model"),
        (("--agent", SUPPORT, "--set", "top_k=4"), "--set configure the model --model builds"),
        (("--agent", SUPPORT, "--require-approval", "nope"), "no tool 'nope'; its tools: "),
        (("--agent", "tests.cli_agents:nothing"), "has no attribute 'nothing'"),
        (("--agent", "no/such/file.py:agent"), "no/such/file.py"),
        ((), "--model is required (or --agent"),
        (("--agent", SUPPORT, "--continues", "r1"), "--continues reads the run from a store"),
    ],
)
async def test_usage_errors_exit_2(tmp_path: Path, args: tuple[str, ...], says: str) -> None:
    done = await agent_fsm("run", "Hi?", *args, env=_env(refused_url(), tmp_path))
    assert done.code == 2, done.out
    assert says in done.err


async def test_a_resume_needs_the_agent_that_made_the_run_and_keeps_its_approvals(
    tmp_path: Path,
) -> None:
    """Paused on a refund's approval: the demo's agent cannot resume it (nothing is used up);
    the printed command (--agent, no --require-approval) approves it, the refund runs once,
    and the model's next refund waits for approval again."""
    store = str(tmp_path / "runs.sqlite3")
    server = LocalServer()
    async with server as url:
        env = _env(url, tmp_path)
        server.reply(_refund_call("c1", "7"))
        paused = await agent_fsm(
            "run", "Refund order 7", "--agent", SUPPORT, "--require-approval", "refund",
            "--store", store, "--no-interactive", env=env,
        )  # fmt: skip
        assert paused.code == 0, paused.err + paused.out
        words = shlex.split(_line(paused, "answer later: ").removeprefix("answer later: "))
        words = words[: words.index("(or")] if "(or" in words else words
        assert "--require-approval" not in words
        assert words[words.index("--agent") + 1] == SUPPORT
        run_id, pause = words[2], words[words.index("--pause") + 1]

        stranger = await agent_fsm(
            "resume", run_id, "--approve", "all", "--pause", pause, "--store", store,
            "--model", "m", "--base-url", url, env=env,
        )  # fmt: skip
        assert stranger.code == 2
        says = f"run {run_id} was made by a different agent: it has no tool 'lookup_order', "
        assert says + "'refund'; it has tools the run did not: 'calculator'" in stranger.err
        assert _refunds(tmp_path) == []
        assert len(server.bodies) == 1  # the stranger called no model

        server.reply(_refund_call("c2", "8"))
        approved = await agent_fsm(*words[1:], "--no-interactive", env=env)
        assert approved.code == 0, approved.err + approved.out
        assert _refunds(tmp_path) == ["7"]  # the approved call ran; the next one waits
        assert "waiting for:" in approved.out
        again = shlex.split(_line(approved, "answer later: ").removeprefix("answer later: "))
        again = again[: again.index("(or")] if "(or" in again else again
        server.reply(completion("Refunded order 7; order 8 was not refunded."))
        denied = await agent_fsm(
            *again[1:3], "--deny", "all", *again[5:], "--no-interactive", env=env
        )
    assert denied.code == 0, denied.err + denied.out
    assert "final answer: Refunded order 7; order 8 was not refunded." in denied.out
    assert _refunds(tmp_path) == ["7"]


async def test_an_outage_prints_the_run_id_and_the_command_that_resumes_it(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "runs.sqlite3")
    server = LocalServer()
    async with server as url:
        env = _env(url, tmp_path)
        server.reply(api_error("the server is overloaded", type_="server_error"), status=503)
        failed = await agent_fsm(
            "run", "Where is order 7?", "--agent", SUPPORT, "--store", store, env=env
        )
        assert failed.code == 1, failed.err + failed.out
        run_id = _line(failed, "run id:").split()[-1]
        advice = _line(failed, f"run {run_id} can go on: ")
        words = shlex.split(advice.removeprefix(f"run {run_id} can go on: "))
        assert words == ["agent-fsm", "resume", run_id, "--agent", SUPPORT, "--store", store]
        server.reply(completion("Order 7 has shipped."))
        resumed = await agent_fsm(*words[1:], env=env)
    assert resumed.code == 0, resumed.err + resumed.out
    assert "final answer: Order 7 has shipped." in resumed.out
    assert server.bodies[0]["messages"] == server.bodies[1]["messages"]


async def test_no_resume_is_offered_where_none_can_go_on(tmp_path: Path) -> None:
    """A permanent model error (the same request would fail again) gets no command; an
    outage of a run kept in no store says a store would have kept it."""
    store = str(tmp_path / "runs.sqlite3")
    server = LocalServer()
    async with server as url:
        env = _env(url, tmp_path)
        server.reply(api_error("unknown model", type_="invalid_request_error"), status=400)
        permanent = await agent_fsm("run", "Hi?", "--agent", SUPPORT, "--store", store, env=env)
        server.reply(api_error("the server is overloaded", type_="server_error"), status=503)
        unkept = await agent_fsm("run", "Hi?", "--agent", SUPPORT, env=env)
    assert permanent.code == 1, permanent.err + permanent.out
    assert "run id:" in permanent.out
    assert "can go on" not in permanent.out
    assert unkept.code == 1, unkept.err + unkept.out
    assert "can be resumed, but only from a store: run with --store PATH" in unkept.out


async def test_continues_goes_on_from_a_stopped_runs_conversation(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.sqlite3")
    server = LocalServer()
    async with server as url:
        env = _env(url, tmp_path)
        server.reply(completion("Hello, I am the desk."))
        first = await agent_fsm("run", "Hi", "--agent", SUPPORT, "--store", store, env=env)
        run_id = _line(first, "run id:").split()[-1]
        server.reply(completion("You said hi."))
        second = await agent_fsm(
            "run", "What did I say?", "--agent", SUPPORT, "--store", store,
            "--continues", run_id, env=env,
        )  # fmt: skip
    assert second.code == 0, second.err + second.out
    assert _line(second, "run id:").split()[-1] != run_id
    contents = [message.get("content") for message in server.bodies[1]["messages"]]
    assert contents[1:] == ["Hi", "Hello, I am the desk.", "What did I say?"]


async def test_the_readmes_own_agent_runs_from_the_command_line(tmp_path: Path) -> None:
    """The README's desk.py and its ``agent-fsm run --agent`` line, as written, against a
    local server in the place of llama-server."""
    readme = (ROOT / "README.md").read_text()
    [desk] = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "support_desk" in b]
    (tmp_path / "desk.py").write_text(desk)
    [command] = [line for line in readme.splitlines() if "--agent desk.py:" in line]
    words = shlex.split(command)
    assert words[:2] == ["agent-fsm", "run"]
    server = LocalServer()
    async with server as url:
        server.reply(
            completion(
                tool_calls=[tool_call("c1", "order_status", '{"order_id": "7"}')],
                finish_reason="tool_calls",
            )
        )
        server.reply(completion("Order 7 has shipped."))
        done = await agent_fsm(*words[1:], env={"DESK_URL": url}, cwd=tmp_path)
    assert done.code == 0, done.err + done.out
    assert "final answer: Order 7 has shipped." in done.out
    assert server.bodies[0]["model"] == "gemma-3-270m"
    assert server.bodies[1]["messages"][-1]["content"] == "order 7: shipped"
    assert (tmp_path / "runs.sqlite3").exists()


async def test_an_mcp_servers_tools_are_offered_and_called_across_an_approval(
    tmp_path: Path,
) -> None:
    """--mcp starts the server over stdio; its tool waits for approval (--require-approval
    names it), is approved at the terminal and runs on the connection the run opened; the
    resume command repeats --mcp."""
    pytest.importorskip("mcp")
    server_script = ROOT / "tests" / "mcp_servers" / "tools_server.py"
    mcp = shlex.join([sys.executable, str(server_script), "stdio"])
    store = str(tmp_path / "runs.sqlite3")
    add = tool_call("c1", "add", '{"a": 2, "b": 3}')
    server = LocalServer()
    async with server as url:
        server.reply(completion(tool_calls=[add], finish_reason="tool_calls"))
        server.reply(completion("2 + 3 = 5."))
        done = await agent_fsm(
            "run", "Add 2 and 3", "--model", "m", "--base-url", url, "--mcp", mcp,
            "--require-approval", "add", "--store", store, "--interactive", stdin="y\n",
            env=_env(url, tmp_path),
        )  # fmt: skip
        server.reply(completion(tool_calls=[add], finish_reason="tool_calls"))
        paused = await agent_fsm(
            "run", "Add 2 and 3", "--model", "m", "--base-url", url, "--mcp", mcp,
            "--require-approval", "add", "--store", store, "--no-interactive",
            env=_env(url, tmp_path),
        )  # fmt: skip
    assert done.code == 0, done.err + done.out
    assert "approve add" in done.out
    assert "final answer: 2 + 3 = 5." in done.out
    offered = {spec["function"]["name"] for spec in server.bodies[0]["tools"]}
    assert {"add", "echo", "get_weather"} <= offered
    decided = server.bodies[1]["messages"][-1]["content"]
    assert "add (call c1): approved and run" in decided
    assert decided.rstrip().endswith("5"), decided
    words = shlex.split(_line(paused, "answer later: ").removeprefix("answer later: "))
    assert words[words.index("--mcp") + 1] == mcp
