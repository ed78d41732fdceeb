"""``agent-fsm run`` and ``resume`` driving a local OpenAI-compatible server (issue 15, point
7): the command runs in a subprocess, the server is ``tests.local_server`` on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.local_server import LocalServer, refused_url
from tests.openai_payloads import chunks_for, completion, tool_call

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out

KEY = "sk-from-my-variable-0123456789"
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Finished:
    code: int
    out: str
    err: str


# what the SDKs read from the environment: a developer's own keys must not change a test
_PROVIDER_VARIABLES = frozenset(
    {"OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "GEMINI_API_KEY", "GOOGLE_API_KEY"}
)


async def agent_fsm(
    *args: str, stdin: str = "", env: dict[str, str] | None = None, cwd: Path | None = None
) -> Finished:
    environment = {k: v for k, v in os.environ.items() if k not in _PROVIDER_VARIABLES}
    environment.update(env or {})
    if cwd is not None:  # this checkout's agent_fsm, wherever the command runs
        paths = [str(ROOT), *filter(None, [environment.get("PYTHONPATH")])]
        environment["PYTHONPATH"] = os.pathsep.join(paths)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent_fsm.cli",
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment,
        cwd=cwd,
    )
    out, err = await process.communicate(stdin.encode())
    assert process.returncode is not None
    return Finished(process.returncode, out.decode(), err.decode())


def _ask_user(question: str) -> dict[str, object]:
    return completion(
        tool_calls=[tool_call("call_q", "ask_user", f'{{"question": "{question}"}}')],
        finish_reason="tool_calls",
    )


async def test_request_options_reach_the_server() -> None:
    server = LocalServer()
    async with server as url:
        server.reply(completion("Hello."))
        done = await agent_fsm(
            "run", "Hi?", "--model", "local", "--base-url", url,
            "--api-key-env", "MY_KEY", "--temperature", "0.2", "--max-tokens", "64",
            "--timeout", "5", "--set", "top_k=40", "--set", "seed=7",
            "--set", 'stop=["END"]',
            env={"MY_KEY": KEY},
        )  # fmt: skip
    assert done.code == 0, done.err
    assert "final answer: Hello." in done.out
    headers, body = server.seen[0]
    assert headers["authorization"] == f"Bearer {KEY}"
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.2, 64, 7)
    assert body["stop"] == ["END"]
    assert body["top_k"] == 40  # a field only the server knows, sent in extra_body


async def test_streamed_text_is_printed_as_it_arrives_and_only_once() -> None:
    server = LocalServer()
    async with server as url:
        server.stream(chunks_for(completion("It is sunny in Paris today.")))
        done = await agent_fsm("run", "Weather?", "--model", "m", "--base-url", url, "--stream")
    assert done.code == 0, done.err
    assert done.out.count("It is sunny in Paris today.") == 2  # streamed, then the summary
    streamed = done.out.index("model says: It is sunny in Paris today.")
    assert streamed < done.out.index("final answer: It is sunny in Paris today.")
    assert server.bodies[0]["stream"] is True


async def test_a_question_is_answered_at_the_terminal() -> None:
    server = LocalServer()
    async with server as url:
        server.reply(_ask_user("Which city?"))
        server.reply(completion("Sunny in Oslo."))
        done = await agent_fsm(
            "run", "Weather?", "--model", "m", "--base-url", url, "--interactive",
            stdin="Oslo\n",
        )  # fmt: skip
    assert done.code == 0, done.err
    assert "question for you: Which city?" in done.out
    assert "final answer: Sunny in Oslo." in done.out
    assert server.bodies[1]["messages"][-1] == {"role": "user", "content": "Oslo"}


async def test_a_question_is_answered_later_with_resume(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.sqlite3")
    server = LocalServer()
    async with server as url:
        server.reply(_ask_user("Which city?"))
        server.reply(completion("Sunny in Oslo."))
        options = ("--model", "m", "--base-url", url, "--store", store)
        paused = await agent_fsm("run", "Weather?", *options, "--no-interactive")
        assert paused.code == 0, paused.err
        line = next(ln for ln in paused.out.splitlines() if ln.startswith("answer later:"))
        words = shlex.split(line.removeprefix("answer later: "))
        run_id = words[2]
        assert f"run id:       {run_id}" in paused.out
        assert words == [
            "agent-fsm", "resume", run_id, "your answer", "--pause", "pause-4", *options
        ]  # fmt: skip
        # the printed command, as a person pastes it, with their answer
        done = await agent_fsm(*words[1:3], "Oslo", *words[4:], "--no-interactive")
    assert done.code == 0, done.err
    assert "final answer: Sunny in Oslo." in done.out


async def test_an_approval_is_given_at_the_terminal_or_later(tmp_path: Path) -> None:
    store = str(tmp_path / "runs.sqlite3")
    weather = tool_call("call_w", "get_weather", '{"city": "Paris"}')
    server = LocalServer()
    async with server as url:
        options = ("--model", "m", "--base-url", url, "--require-approval", "get_weather")
        server.reply(completion(tool_calls=[weather], finish_reason="tool_calls"))
        server.reply(completion("Paris is mild."))
        now = await agent_fsm("run", "Paris?", *options, "--interactive", stdin="y\n")
        assert now.code == 0, now.err
        assert "approve get_weather" in now.out
        assert "final answer: Paris is mild." in now.out
        decided = server.bodies[1]["messages"][-1]
        assert decided["role"] == "user"
        assert "get_weather (call call_w): approved and run" in decided["content"]

        server.reply(completion(tool_calls=[weather], finish_reason="tool_calls"))
        server.reply(completion("I was not allowed to look."))
        stored = (*options, "--store", store, "--no-interactive")
        paused = await agent_fsm("run", "Paris?", *stored)
        later = next(ln for ln in paused.out.splitlines() if ln.startswith("answer later:"))
        run_id, pause = later.split()[4], later.split()[later.split().index("--pause") + 1]
        # --deny all names no call: without the pause it is refused, with it it decides
        refused = await agent_fsm("resume", run_id, "--deny", "all", *stored)
        assert refused.code == 2
        assert f"pass pause='{pause}'" in refused.err
        denied = await agent_fsm("resume", run_id, "--deny", "all", "--pause", pause, *stored)
    assert denied.code == 0, denied.err
    assert "final answer: I was not allowed to look." in denied.out
    decided = server.bodies[-1]["messages"][-1]
    assert "get_weather (call call_w): denied, so it was not run" in decided["content"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--model", "m"), "no API key: set OPENAI_API_KEY, or name the variable"),
        (("--model", "m", "--api-key-env", "NOPE"), "no API key: set NOPE"),
        (("--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--set", "temprature=1"),
         "did you mean 'temperature'"),
        (("--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--set", "oops"),
         "--set takes KEY=VALUE"),
        (("--model", "m", "--temprature", "1"), "unrecognized arguments: --temprature"),
        (("--provider", "anthropic", "--model", "m"), "no API key: set ANTHROPIC_API_KEY"),
        (("--provider", "gemini", "--model", "m"), "no API key: set GEMINI_API_KEY"),
        (("--provider", "mistral", "--model", "m"), "invalid choice: 'mistral'"),
    ],
)  # fmt: skip
async def test_usage_errors_exit_2(args: tuple[str, ...], says: str) -> None:
    done = await agent_fsm("run", "Hi?", *args)
    assert done.code == 2
    assert says in done.err


async def test_a_failed_run_exits_1_and_says_why() -> None:
    done = await agent_fsm(
        "run", "Hi?", "--model", "m", "--base-url", refused_url(), "--retries", "0"
    )
    assert done.code == 1
    assert "connection refused" in done.out


def test_a_provider_whose_sdk_is_missing_names_its_extra() -> None:
    from agent_fsm.errors import ConfigError
    from agent_fsm.models.registry import Provider

    missing = Provider(
        name="nope",
        cls="Nope",
        module="agent_fsm.models.not_installed",
        key_variable="NOPE_KEY",
        extra="nope",
    )
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[nope\]' in a clone"):
        missing.adapter()


_PROVIDER_MODELS = {
    "openai": "gpt-4o-mini",
    "openai-responses": "gpt-4.1-mini",
    "anthropic": "claude-sonnet-4-6",
    "gemini": "gemini-2.5-flash",
}


@pytest.mark.parametrize("provider", sorted(_PROVIDER_MODELS))
async def test_every_provider_runs_a_tool_turn_from_the_command_line(provider: str) -> None:
    """``--provider`` drives each adapter through its SDK against a server on 127.0.0.1 that
    speaks that provider's wire format (the provider kits write it)."""
    from agent_fsm.messages import AssistantMessage, FinishReason, ModelResponse, ToolCall
    from tests.provider_kits import all_kits

    [kit] = [k for k in all_kits() if k.name == provider]
    weather = ToolCall(id="call_w1", name="get_weather", arguments='{"city": "Paris"}')
    replies = [
        ModelResponse(
            message=AssistantMessage(tool_calls=(weather,)), finish_reason=FinishReason.TOOL_CALLS
        ),
        ModelResponse(message=AssistantMessage(content="Sunny in Paris.")),
    ]
    server = LocalServer()
    async with server as url:
        for response in replies:
            encoded = kit.reply(response)
            server.raw(encoded.status, dict(encoded.headers), encoded.body)
        done = await agent_fsm(
            "run", "Weather in Paris?", "--provider", provider,
            "--model", _PROVIDER_MODELS[provider], "--base-url", url.removesuffix("/v1"),
            "--api-key-env", "MY_KEY", env={"MY_KEY": KEY},
        )  # fmt: skip
    assert done.code == 0, done.err + done.out
    assert "final answer: Sunny in Paris." in done.out
    assert len(server.seen) == 2
    assert "Paris" in json.dumps(server.seen[1][1]), "the tool's result went back"


def test_one_registry_serves_the_package_and_the_command_line() -> None:
    """``agent_fsm.models`` exports, and ``--provider`` offers, exactly the registry's adapters,
    each from the module the registry names: adding a provider is one entry."""
    import argparse

    import agent_fsm.models
    from agent_fsm.cli_model import add_model_options
    from agent_fsm.models.registry import PROVIDERS

    classes = {provider.cls for provider in PROVIDERS.values()}
    assert classes == set(agent_fsm.models.__all__) - {"Model", "ModelCallError"}
    for provider in PROVIDERS.values():
        adapter = provider.adapter()
        assert getattr(agent_fsm.models, provider.cls) is adapter
        assert adapter.__module__ == provider.module
    parser = argparse.ArgumentParser()
    add_model_options(parser, store_required=False)
    [choice] = [a for a in parser._actions if a.dest == "provider"]
    assert set(choice.choices or ()) == set(PROVIDERS)


async def test_anthropic_takes_temperature_and_server_fields_from_the_command_line() -> None:
    """The Anthropic SDK 2.x has no sampling parameters; a compatible server still gets
    ``--temperature`` (and ``--set`` fields the SDK does not know) in the request's body."""
    from agent_fsm.messages import AssistantMessage, ModelResponse
    from tests.provider_kits import all_kits

    [kit] = [k for k in all_kits() if k.name == "anthropic"]
    server = LocalServer()
    async with server as url:
        encoded = kit.reply(ModelResponse(message=AssistantMessage(content="Hello.")))
        server.raw(encoded.status, dict(encoded.headers), encoded.body)
        done = await agent_fsm(
            "run", "Hi?", "--provider", "anthropic", "--model", "local",
            "--base-url", url.removesuffix("/v1"), "--temperature", "0.2",
            "--set", "top_k=40", "--max-tokens", "64",
        )  # fmt: skip
    assert done.code == 0, done.err + done.out
    assert "final answer: Hello." in done.out
    _, body = server.seen[0]
    assert (body["temperature"], body["top_k"], body["max_tokens"]) == (0.2, 40, 64)


async def test_anthropic_refuses_a_near_miss_of_its_own_fields() -> None:
    done = await agent_fsm(
        "run", "Hi?", "--provider", "anthropic", "--model", "m",
        "--base-url", "http://127.0.0.1:9", "--set", "max_token=5",
    )  # fmt: skip
    assert done.code == 2
    assert "max_token" in done.err
