"""Cut-off text is never taken as whole (issue 35, point 3): through the openai SDK to
``tests.local_server`` on 127.0.0.1, replies that stop at their token limit (finish
``length``). A cut final answer or last answer is flagged ``output_incomplete``; a cut
summary never replaces the transcript."""

from __future__ import annotations

from typing import Any

from agent_fsm import Agent, Limits, RunStatus, StopReason, Summarize, tool
from agent_fsm.models.openai_chat import OpenAIChatModel
from tests.local_server import LocalServer
from tests.openai_payloads import completion, tool_call


@tool
def read_page(page: int) -> str:
    """Read one page of the report."""
    return " ".join(f"word{page}x{n}" for n in range(400))  # ~3,600 characters


def _read(page: int) -> dict[str, Any]:
    call = tool_call(f"c{page}", "read_page", f'{{"page": {page}}}')
    return completion(tool_calls=[call], usage=None)


async def _run(server: LocalServer, base_url: str, limits: Limits, **options: Any) -> Any:
    async with OpenAIChatModel("m", base_url=base_url, api_key="x") as model:
        agent = Agent(model=model, tools=[read_page], limits=limits, **options)
        return await agent.run("Summarise the report.")


async def test_a_cut_last_answer_is_flagged() -> None:
    server = LocalServer()
    async with server as base_url:
        server.reply(_read(0))
        server.reply(completion("The report is about", finish_reason="length", usage=None))
        result = await _run(server, base_url, Limits(max_turns=1, last_answer=True))
    assert result.stop_reason is StopReason.MAX_TURNS
    assert result.output == "The report is about"
    assert result.output_incomplete


async def test_a_whole_last_answer_is_not_flagged() -> None:
    server = LocalServer()
    async with server as base_url:
        server.reply(_read(0))
        server.reply(completion("The report is about words.", usage=None))
        result = await _run(server, base_url, Limits(max_turns=1, last_answer=True))
    assert result.output == "The report is about words."
    assert not result.output_incomplete


async def test_a_cut_final_answer_is_flagged_and_incomplete() -> None:
    server = LocalServer()
    async with server as base_url:
        server.reply(completion("The report is", finish_reason="length", usage=None))
        result = await _run(server, base_url, Limits())
    assert (result.status, result.output_incomplete) == (RunStatus.INCOMPLETE, True)


async def test_a_cut_summary_never_replaces_the_transcript() -> None:
    server = LocalServer()
    async with server as base_url:
        for page in range(3):
            server.reply(_read(page))
        for _ in range(2):  # the summary call, and its one retry
            server.reply(completion("PARTIAL SUMMARY: the rep", finish_reason="length"))
        server.reply(completion("never asked for", usage=None))
        limits = Limits(context_window=2_600, reply_tokens=256, model_retries=1)
        result = await _run(server, base_url, limits, context_policy=Summarize(keep_last_turns=1))
    assert result.stop_reason is StopReason.MODEL_ERROR
    assert "cut off" in (result.error or "")
    summaries = [b for b in server.bodies if "PARTIAL SUMMARY" in str(b)]
    assert summaries == []  # no request was sent with the cut summary in place of turns
