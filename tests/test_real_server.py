"""Life with a real OpenAI-compatible server (issue 15): the official SDK over real HTTP to
``tests.local_server`` on 127.0.0.1, which misbehaves the way llama.cpp's server and busy
hosted APIs do."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from agent_fsm import Agent, AgentState, Limits, RunStatus, StopReason, tool
from agent_fsm.errors import ConfigError
from agent_fsm.events import ModelFailed
from agent_fsm.messages import (
    AssistantMessage,
    ModelRequest,
    ToolMessage,
    ToolStatus,
    TranscriptView,
    UserMessage,
)
from agent_fsm.models.base import ModelCallError
from agent_fsm.models.openai_chat import OpenAIChatModel
from agent_fsm.testing import ScriptedModel, call, reply
from tests.local_server import ARGUMENTS_ERROR, LocalServer, refused_url
from tests.openai_payloads import api_error, chunks_for, completion, tool_call

MODEL = "local-model"


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


async def no_sleep(seconds: float) -> None:
    """Backoff that does not wait: these tests are about what is sent, not when."""


def agent_for(base_url: str, **options: Any) -> Agent:
    model = OpenAIChatModel(MODEL, base_url=base_url, api_key="sk-local")
    return Agent(model=model, tools=[get_weather], sleep=no_sleep, **options)


async def test_a_call_cut_off_by_the_token_limit_never_poisons_later_requests() -> None:
    server = LocalServer(check_arguments=True)
    async with server as base_url:
        cut_off = '{"city": "Par'
        server.reply(
            completion(
                tool_calls=[tool_call("call_1", "get_weather", cut_off)], finish_reason="length"
            )
        )
        server.reply(
            completion(tool_calls=[tool_call("call_2", "get_weather", '{"city": "Paris"}')])
        )
        server.reply(completion("Sunny in Paris."))
        agent = agent_for(base_url)
        async with agent.model:  # type: ignore[attr-defined]
            result = await agent.run("Weather in Paris?")

    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "Sunny in Paris.")
    assert len(server.seen) == 3  # no request was refused, so none was retried
    # The history keeps the model's text for people, and sends valid JSON to the server.
    first_call = next(m for m in result.messages if isinstance(m, AssistantMessage))
    assert first_call.tool_calls[0].arguments == cut_off
    replayed = server.bodies[1]["messages"]
    sent_call = next(m for m in replayed if m["role"] == "assistant")["tool_calls"][0]
    assert sent_call["function"]["arguments"] == "{}"
    # ...and the model is told what it sent and what was wrong.
    error = next(m for m in result.messages if isinstance(m, ToolMessage))
    assert error.status is ToolStatus.ERROR
    assert "not valid JSON" in error.content
    assert repr(cut_off) in error.content
    assert ARGUMENTS_ERROR not in str(result.error)


_A_RUN = (
    "from agent_fsm import Agent\n"
    "from agent_fsm.testing import ScriptedModel, call, reply\n"
    "script = [reply('', call('ask_user', question='City?'))]\n"
    "agent = Agent(model=ScriptedModel(script + [reply('Sunny.')]))\n"
    "paused = agent.run_sync('Weather?')\n"
    "print(agent.resume_sync(paused.run_id, 'Oslo').output)\n"
)


def _python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )


def test_the_library_is_silent_until_the_application_configures_logging() -> None:
    quiet = _python(_A_RUN)
    assert (quiet.stdout, quiet.stderr) == ("Sunny.\n", "")


def test_its_logs_reach_the_standard_logging_of_an_application_that_asks() -> None:
    shown = _python("import logging\nlogging.basicConfig(level=logging.DEBUG)\n" + _A_RUN)
    assert shown.stdout == "Sunny.\n"
    transitions = [line for line in shown.stderr.splitlines() if "transition" in line]
    assert transitions[0].startswith("DEBUG:agent_fsm:transition run_id=")
    assert "source=OBSERVE dest=THINK" in transitions[0]
    assert any(line.startswith("INFO:agent_fsm:run_finished") for line in shown.stderr.splitlines())


def test_an_application_that_configures_structlog_gets_the_lines_there() -> None:
    configured = _python(
        "import structlog\n"
        "lines = []\n"
        "structlog.configure(processors=[lambda l, m, e: lines.append((m, e)) or ''],\n"
        "                    logger_factory=structlog.ReturnLoggerFactory())\n"
        + _A_RUN
        + "print(sorted({e['event'] for _, e in lines}))\n"
    )
    assert configured.stdout.splitlines() == ["Sunny.", "['run_finished', 'transition']"]
    assert configured.stderr == ""


async def test_an_answer_cut_off_by_the_token_limit_is_not_completed() -> None:
    server = LocalServer()
    async with server as base_url:
        server.reply(completion("The weather in Paris is", finish_reason="length"))
        agent = agent_for(base_url)
        async with agent.model:  # type: ignore[attr-defined]
            result = await agent.run("Weather in Paris?")
    assert result.status is RunStatus.INCOMPLETE
    assert result.status != "completed"
    assert (result.stop_reason, result.output) == (StopReason.MAX_TOKENS, "The weather in Paris is")


# --------------------------------------------------------------------------- failures that say
# which, where and after how long (point 3)


def _request() -> ModelRequest:
    return ModelRequest(
        messages=TranscriptView([UserMessage(content="hi")]), tools=(), run_id="r", turn=1
    )


async def _failure(base_url: str, **options: Any) -> ModelCallError:
    async with OpenAIChatModel(MODEL, base_url=base_url, api_key="sk-local", **options) as model:
        with pytest.raises(ModelCallError) as failed:
            await model.request(_request())
    return failed.value


async def test_a_refused_connection_says_so_and_where() -> None:
    url = refused_url()
    failure = await _failure(url)
    assert failure.transient
    assert str(failure) == (
        f"cannot connect to {url}/chat/completions: connection refused (is the server running?)"
    )


async def test_a_server_that_drops_the_connection_is_told_from_one_that_is_not_there() -> None:
    server = LocalServer()
    async with server as url:
        server.reset()
        failure = await _failure(url)
    assert failure.transient
    assert str(failure).startswith(f"{url}/chat/completions closed the connection after ")
    assert "without a complete reply" in str(failure)


async def test_a_stream_that_breaks_off_says_where_and_after_how_long() -> None:
    server = LocalServer()
    async with server as url:
        server.stream_then_reset(chunks_for(completion("Hello there, a long answer"))[:3])
        failure = await _failure(url, stream=True)
    assert failure.transient
    assert f"{url}/chat/completions closed the connection after " in str(failure)
    assert "incomplete" in str(failure)


async def test_a_stalled_server_times_out_with_the_timeout_named() -> None:
    server = LocalServer()
    async with server as url:
        server.stall()
        failure = await _failure(url, timeout=0.3)
    assert failure.transient
    assert str(failure).startswith(
        f"the request to {url}/chat/completions timed out: no reply within the 0.3 s timeout"
    )


async def test_a_rate_limit_says_where_and_keeps_its_retry_after() -> None:
    server = LocalServer()
    async with server as url:
        server.reply(api_error("Slow down", type_="requests"), 429, {"retry-after": "3"})
        failure = await _failure(url)
    assert (failure.transient, failure.retry_after_s) == (True, 3.0)
    assert (
        str(failure)
        == f"RateLimitError (HTTP 429, requests) from {url}/chat/completions: Slow down"
    )


# --------------------------------------------------------------------------- settings (point 8)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"temprature": 0.2}, r"no argument 'temprature': did you mean 'temperature'\?"),
        ({"max_token": 64}, r"did you mean 'max_tokens'\?"),
        ({"top_k": 40}, r"no argument 'top_k'; a field only your server knows goes in extra_body"),
        (
            {"default_headers": {"x-team": "a"}},
            r"default_headers is an option of the SDK client, not of a request: pass "
            r"client=openai.AsyncOpenAI\(\.\.\., default_headers=\.\.\.\)",
        ),
        ({"max_retries": 5}, r"max_retries: retries are the engine's.*Limits"),
    ],
)
def test_a_setting_that_is_not_one_says_what_was_meant(setting: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        OpenAIChatModel(MODEL, base_url="http://127.0.0.1:9/v1", api_key="sk-local", **setting)


def test_every_wrong_setting_is_named_at_once() -> None:
    with pytest.raises(ConfigError) as refused:
        OpenAIChatModel(MODEL, api_key="sk-local", temprature=0.2, top_k=40)
    assert "'temprature'" in str(refused.value)
    assert "'top_k'" in str(refused.value)


# --------------------------------------------------------------------------- outages (point 2)


class Sleeps:
    """The agent's backoff sleep: records each pause instead of taking it."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def _retrying_agent(base_url: str, sleeps: Sleeps, **limits: Any) -> Agent:
    model = OpenAIChatModel(MODEL, base_url=base_url, api_key="sk-local")
    return Agent(model=model, tools=[get_weather], sleep=sleeps, limits=Limits(**limits))


async def test_an_outage_is_retried_within_its_own_bound_and_uses_no_turns() -> None:
    sleeps = Sleeps()
    agent = _retrying_agent(refused_url(), sleeps, max_turns=3, model_retries=4)
    failures: list[ModelFailed] = []
    agent = agent.subscribe(lambda event: isinstance(event, ModelFailed) and failures.append(event))
    async with agent.model:  # type: ignore[attr-defined]
        result = await agent.run("Weather?")
    assert (result.final_state, result.stop_reason) == (AgentState.ERROR, StopReason.MODEL_ERROR)
    assert len(failures) == 5  # the call and its 4 retries
    assert len(sleeps.delays) == 4
    assert result.turns == 1  # retries are not turns
    assert result.error is not None
    assert result.error.startswith("the model call failed 5 times in a row (4 retries, ")
    assert "connection refused" in result.error
    assert [entry.label for entry in result.trace] == ["think", *["retry"] * 4, "model_error"]


async def test_a_brief_outage_is_ridden_out() -> None:
    sleeps = Sleeps()
    server = LocalServer()
    async with server as url:
        server.reply(api_error("overloaded", type_="server_error"), 503)
        server.reset()
        server.reply(completion("Sunny."))
        agent = _retrying_agent(url, sleeps, max_turns=1)
        async with agent.model:  # type: ignore[attr-defined]
            result = await agent.run("Weather?")
    assert (result.status, result.output, result.turns) == (RunStatus.COMPLETED, "Sunny.", 1)
    assert [entry.label for entry in result.trace] == ["think", "retry", "retry", "final_answer"]


async def test_retry_after_is_honoured_up_to_its_cap() -> None:
    sleeps = Sleeps()
    server = LocalServer()
    async with server as url:
        server.reply(api_error("slow down", type_="requests"), 429, {"retry-after": "2"})
        server.reply(api_error("slow down", type_="requests"), 429, {"retry-after": "600"})
        server.reply(completion("Sunny."))
        agent = _retrying_agent(url, sleeps, retry_after_max_s=10, retry_wait_s=60)
        async with agent.model:  # type: ignore[attr-defined]
            result = await agent.run("Weather?")
    assert result.output == "Sunny."
    assert sleeps.delays[0] >= 2.0  # never sooner than the server asked
    assert sleeps.delays[1] == 10.0  # a longer Retry-After is capped


async def test_the_wait_of_one_turn_is_bounded_whatever_the_jitter() -> None:
    sleeps = Sleeps()
    agent = _retrying_agent(
        refused_url(),
        sleeps,
        model_retries=10,
        retry_backoff_s=1.0,
        retry_backoff_max_s=8.0,
        retry_wait_s=3.0,
    )
    async with agent.model:  # type: ignore[attr-defined]
        result = await agent.run("Weather?")
    # Backoff ceilings 1 s, 2 s, then 4 s, which no longer fits in 3 s: two retries.
    assert len(sleeps.delays) == 2
    assert sum(sleeps.delays) <= 3.0
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.error is not None
    assert "3 times in a row" in result.error


def test_retries_are_bounded_per_run_and_counted_in_the_termination_bound() -> None:
    outage = ModelCallError("503 overloaded", transient=True)
    script = [outage, reply("", call("get_weather", city="Oslo")), outage, outage, "Sunny."]
    limits = Limits(max_turns=5, model_retries=5, model_retries_per_run=2)
    agent = Agent(model=ScriptedModel(script), tools=[get_weather], limits=limits, sleep=Sleeps())
    result = agent.run_sync("Weather?")
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert result.error is not None
    assert "2 retries in the run, the most allowed" in result.error
    assert agent.bound.model_calls == 5 + 2
    assert "max_turns + model_retries_per_run" in agent.bound.formula
