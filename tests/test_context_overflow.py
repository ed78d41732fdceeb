"""Real servers' context windows (issue 35, points 1 and 2): through the SDKs to servers on
127.0.0.1 that count tokens with a fixed template cost, as llama-server does, and refuse a
prompt longer than their context with each provider's own 400.

A fixed per-request cost is learnt as such, not as a ratio applied to all content; a
server's context-overflow answer is its own failure: with context policies the run shrinks
the prompt and calls again, without it stops ``context_window``, and a resume goes on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent_fsm import Agent, ClearToolResults, Limits, SQLiteStore, StopReason, tool
from agent_fsm.messages import AssistantMessage, FinishReason, ModelResponse
from agent_fsm.models.base import ModelCallError
from agent_fsm.models.common import context_overflow
from agent_fsm.models.openai_chat import OpenAIChatModel
from tests.local_server import CONTEXT_ERROR, LocalServer
from tests.openai_payloads import completion, tool_call
from tests.provider_kits import all_kits

TEMPLATE = 190


@tool
def read_page(page: int) -> str:
    """Read one page of the report."""
    return " ".join(f"word{page}x{n}" for n in range(400))  # ~3,600 characters


@tool
def read_chapter(chapter: int) -> str:
    """Read one chapter of the report."""
    return " ".join(f"word{chapter}x{n}" for n in range(700))  # ~6,300 characters


async def no_sleep(seconds: float) -> None:
    """Backoff that does not wait."""


def _reads(server: LocalServer, pages: int) -> None:
    for page in range(pages):
        arguments = f'{{"page": {page}}}'
        server.reply_counted(completion(tool_calls=[tool_call(f"c{page}", "read_page", arguments)]))
    server.reply_counted(completion("The report is about words."))


async def test_a_fixed_template_cost_is_not_charged_to_every_message() -> None:
    """llama-server with --ctx-size 2048: one ratio took the template's 190 tokens for a
    content rate and stopped the run after turn 1 (``context_window``) for a prompt that
    fitted; learnt as a fixed cost, the run finishes and every prompt fits the server."""
    server = LocalServer(context_size=2_048, template_tokens=TEMPLATE, chars_per_token=4)
    async with server as base_url:
        _reads(server, 1)
        async with OpenAIChatModel(
            "gemma", base_url=base_url, api_key="x", context_window=2_048
        ) as model:
            agent = Agent(model=model, tools=[read_page], limits=Limits(reply_tokens=256))
            result = await agent.run("Summarise the report.")
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert len(server.counted) == 2
    assert all(tokens + 256 <= 2_048 for tokens in server.counted)


async def test_an_overflow_with_a_policy_shrinks_the_prompt_and_calls_again() -> None:
    """The server counts far more than the estimate (one token per two characters): its
    exceed-context 400 teaches the estimate, the run compacts and the next call fits."""
    server = LocalServer(context_size=3_000, chars_per_token=2)
    async with server as base_url:
        call = tool_call("c1", "read_chapter", '{"chapter": 1}')
        server.reply_counted(completion(tool_calls=[call]))
        server.reply_counted(completion("The report is about words."))
        async with OpenAIChatModel("m", base_url=base_url, api_key="x") as model:
            agent = Agent(
                model=model,
                tools=[read_chapter],
                limits=Limits(context_window=3_000, reply_tokens=256, model_retries=0),
                context_policy=ClearToolResults(keep_last_turns=0),
                sleep=no_sleep,
            )
            result = await agent.run("Summarise the report.")
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert [tokens > 3_000 for tokens in server.counted] == [False, True, False]
    assert any(t.dest == "COMPACT" and t.source == "THINK" for t in result.trace)


async def test_without_a_policy_an_overflow_stops_context_window_and_resumes(
    tmp_path: Path,
) -> None:
    server = LocalServer(context_size=1_500)
    async with server as base_url:
        _reads(server, 1)
        store = SQLiteStore(tmp_path / "runs.sqlite3")
        async with OpenAIChatModel("m", base_url=base_url, api_key="x") as model:
            agent = Agent(model=model, tools=[read_page], store=store, sleep=no_sleep)
            stopped = await agent.run("Summarise the report.")
            assert stopped.stop_reason is StopReason.CONTEXT_WINDOW
            assert CONTEXT_ERROR in (stopped.error or "")
            assert len(server.seen) == 2  # refused once, not retried
            server.context_size = 100_000  # the server restarted with a larger context
            server.reply(completion("The report is about words."))
            resumed = await agent.resume(stopped.run_id)
    assert resumed.stop_reason is StopReason.FINAL_ANSWER, resumed.error
    assert resumed.output == "The report is about words."


_TOO_LONG = {
    "openai": "This model's maximum context length is 8192 tokens. However, your messages "
    "resulted in 9120 tokens. Please reduce the length of the messages.",
    "openai-responses": "Your input exceeds the context window of this model. Please adjust "
    "your input and try again.",
    "anthropic": "prompt is too long: 210345 tokens > 200000 maximum",
    "gemini": "The input token count (1048999) exceeds the maximum number of tokens allowed "
    "(1048576).",
}


@pytest.mark.parametrize("kit", all_kits(), ids=lambda kit: kit.name)
async def test_each_providers_overflow_stops_context_window_not_model_error(kit: Any) -> None:
    server = LocalServer()
    async with server as url:
        error = kit.error(400, _TOO_LONG[kit.name])
        server.raw(error.status, dict(error.headers), error.body)
        answer = kit.reply(ModelResponse(message=AssistantMessage(content="Short now.")))
        server.raw(answer.status, dict(answer.headers), answer.body)
        model = kit.build(url.removesuffix("/v1"))
        agent = Agent(model=model, sleep=no_sleep, limits=Limits(model_retries=3))
        async with model:
            result = await agent.run("A very long question.")
    assert result.stop_reason is StopReason.CONTEXT_WINDOW, (kit.name, result.error)
    assert len(server.seen) == 1  # the same prompt is not sent again


@pytest.mark.parametrize(
    ("text", "size"),
    [
        (_TOO_LONG["openai"], 9_120),
        (_TOO_LONG["anthropic"], 210_345),
        (_TOO_LONG["gemini"], 1_048_999),
        (CONTEXT_ERROR + ' {"n_prompt_tokens": 2100, "n_ctx": 2048}', 2_100),
        ("Error code 400: context_length_exceeded", None),
    ],
)
def test_the_wordings_are_read_with_the_size_they_name(text: str, size: int | None) -> None:
    assert context_overflow(text) == (True, size)
    failure = ModelCallError(text, transient=True, context_overflow=True)
    assert not failure.transient  # the same prompt fails again


def test_other_refusals_are_no_overflow() -> None:
    assert context_overflow("Invalid value for temperature") == (False, None)
    assert FinishReason.LENGTH  # a cut reply is a finish reason, not a failure
