"""The first hour (issue 40): what a newcomer trips over."""

from __future__ import annotations

import pytest

from agent_fsm import Agent, ConfigError, KeepLastTurns, Limits, tool
from agent_fsm.testing import ScriptedModel


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return city


def test_an_agents_repr_is_a_summary() -> None:
    agent = Agent(
        model=ScriptedModel([]),
        tools=[lookup],
        system_prompt="You answer questions about cities, briefly and politely, always.",
        limits=Limits(max_turns=3),
    )
    shown = repr(agent)
    assert shown == (
        "Agent(model=ScriptedModel('scripted'), tools=['lookup'], system_prompt='You answer "
        "questions about cities, br...', limits=Limits(max_turns=3))"
    )
    assert len(repr(Agent(model=ScriptedModel([])))) < 200


def test_a_policy_class_instead_of_a_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"got the class KeepLastTurns.*KeepLastTurns\(\.\.\.\)"):
        Agent(
            model=ScriptedModel([]),
            context_policy=KeepLastTurns,  # type: ignore[arg-type]
            limits=Limits(context_window=4_000, reply_tokens=500),
        )


CALLS: list[str] = []


@tool
def send_email(to: str) -> str:
    """Send an email (a side effect the harness must not repeat hundreds of times)."""
    CALLS.append(to)
    return f"sent to {to}"


def _emailing_agent() -> Agent:
    return Agent(model=ScriptedModel([]), tools=[send_email], limits=Limits(max_turns=4))


def test_the_harness_calls_doubles_of_the_tools_unless_asked_for_the_real_ones() -> None:
    from agent_fsm.testing import assert_stateful, assert_terminates, check_exhaustively

    CALLS.clear()
    agent = _emailing_agent()
    assert_terminates(agent, max_examples=40)
    check_exhaustively(agent, max_length=2).assert_ok()
    assert_stateful(agent, max_examples=5)
    assert CALLS == []
    assert_terminates(agent, max_examples=40, real_tools=True)
    check_exhaustively(agent, max_length=2, real_tools=True).assert_ok()
    assert CALLS  # asked for: the real tool ran


def test_a_model_by_name_is_its_providers_adapter_with_its_key_checked_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agent_fsm.models import OpenAIChatModel

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_ADMIN_KEY", raising=False)
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        Agent(model="openai:gpt-4o-mini")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    agent = Agent(model="openai:gpt-4o-mini")
    assert isinstance(agent.model, OpenAIChatModel)
    assert agent.model.name == "gpt-4o-mini"
    with pytest.raises(ConfigError, match=r"'provider:model'.*\['anthropic', 'gemini'"):
        Agent(model="gpt-4o-mini")
    with pytest.raises(ConfigError, match="'provider:model'"):
        Agent(model="nowhere:model-x")


@pytest.mark.parametrize(
    "base_url", ["http://127.0.0.1:8080/v1", "http://localhost:11434/v1", "http://[::1]:9/v1"]
)
def test_a_server_on_this_machine_needs_no_key(
    base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server, vLLM and Ollama on localhost want no key; the SDKs refuse to build a
    client without one. A remote server's missing key stays a ConfigError at construction."""
    from agent_fsm.models import AnthropicModel, OpenAIChatModel, OpenAIResponsesModel

    for variable in ("OPENAI_API_KEY", "OPENAI_ADMIN_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    for adapter in (OpenAIChatModel, OpenAIResponsesModel, AnthropicModel):
        adapter("local", base_url=base_url)  # builds
        with pytest.raises(ConfigError, match="API_KEY"):
            adapter("remote", base_url="https://models.example.com/v1")


def test_a_decorated_function_can_still_be_called_directly() -> None:
    from agent_fsm.tools.tool import ASK_USER

    assert lookup("Oslo") == "Oslo"
    assert lookup(city="Paris") == "Paris"
    with pytest.raises(TypeError, match="run by the engine itself"):
        ASK_USER(question="?")


def test_the_command_lines_run_options_say_what_they_are() -> None:
    import argparse

    from agent_fsm.cli_model import add_model_options

    parser = argparse.ArgumentParser()
    add_model_options(parser, store_required=False)
    options = {a.dest: a for a in parser._actions}
    for name in ("max_turns", "token_budget", "retries", "system"):
        assert options[name].help, name
    # not a number of its own: the demo's agent retries as Limits does, an --agent as its own
    from agent_fsm.cli_agent import build_agent

    args = parser.parse_args(["--model", "m", "--base-url", "http://127.0.0.1:9/v1"])
    assert build_agent(args).limits.model_retries == Limits().model_retries


def test_a_command_line_mistake_shows_that_commands_usage(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agent_fsm.cli import main

    for argv, usage in (
        (["demo", "--bogus"], "usage: agent-fsm demo"),
        (["diagram", "--run-id", "x"], "usage: agent-fsm diagram"),  # one option: --run
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert usage in err, err
        assert f"unrecognized arguments: {argv[1]}" in err
