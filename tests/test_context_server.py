"""The context window against a server that enforces one (issue 14): through the openai SDK
to ``tests.local_server`` on 127.0.0.1 with a 4,096-token context that, like llama-server,
answers a longer prompt with HTTP 400 and counts tokens higher than the engine's estimate."""

from __future__ import annotations

import pytest

from agent_fsm import (
    Agent,
    ClearToolResults,
    ConfigError,
    KeepLastTurns,
    Limits,
    RunResult,
    StopReason,
    tool,
)
from agent_fsm.models.openai_chat import OpenAIChatModel
from tests.local_server import CONTEXT_ERROR, LocalServer
from tests.openai_payloads import completion, tool_call

CONTEXT = 4_096
READS = 4


@tool
def read_file(part: int) -> str:
    """Read one part of a large data file: 50,000 digits."""
    return "".join(str((part * 7 + n) % 10) for n in range(50_000))


def queue_reads(server: LocalServer) -> None:
    for part in range(READS):
        arguments = f'{{"part": {part}}}'
        server.reply_counted(completion(tool_calls=[tool_call(f"c{part}", "read_file", arguments)]))
    server.reply_counted(completion("The digits repeat with period 10."))


async def run(base_url: str, window: int | None, **options: object) -> RunResult:
    """One run through the SDK; its client is closed before the test's event loop ends."""
    async with OpenAIChatModel(
        "local", base_url=base_url, api_key="sk-local", context_window=window
    ) as model:
        limits = Limits(tool_max_output_chars=4_000, reply_tokens=256, model_retries=0)
        agent = Agent(model=model, tools=[read_file], limits=limits, **options)  # type: ignore[arg-type]
        return await agent.run("Find the pattern.")


async def test_without_a_window_the_server_refuses_the_prompt_with_a_400() -> None:
    """The refusal is a context overflow, not a model error (issue 35, point 2): without
    context policies the run stops ``context_window``, which a resume can leave."""
    server = LocalServer(context_size=CONTEXT)
    async with server as base_url:
        queue_reads(server)
        result = await run(base_url, None)
    assert result.stop_reason is StopReason.CONTEXT_WINDOW
    assert CONTEXT_ERROR in (result.error or "")
    assert max(server.counted) > CONTEXT


async def test_with_the_window_and_no_policy_the_run_stops_before_the_call() -> None:
    server = LocalServer(context_size=CONTEXT)
    async with server as base_url:
        queue_reads(server)
        result = await run(base_url, CONTEXT)
    assert result.stop_reason is StopReason.CONTEXT_WINDOW
    assert max(server.counted) <= CONTEXT  # no request was refused


@pytest.mark.parametrize(
    "policies",
    [[ClearToolResults(keep_last_turns=1)], [KeepLastTurns(1)]],
    ids=["clear-tool-results", "keep-last-turns"],
)
async def test_with_a_policy_every_request_fits_the_servers_own_count(
    policies: list[object],
) -> None:
    server = LocalServer(context_size=CONTEXT)
    async with server as base_url:
        queue_reads(server)
        result = await run(base_url, CONTEXT, context_policy=policies)
    assert result.stop_reason is StopReason.FINAL_ANSWER, result.error
    assert len(server.counted) == READS + 1
    # The server counts a third more than the engine estimates; calibrated from the usage it
    # reports, every prompt left room for the reply by the server's count too.
    assert all(tokens + 256 <= CONTEXT for tokens in server.counted)


@pytest.mark.parametrize("window", [0, -5, True, 4096.0])
def test_the_adapter_refuses_a_window_that_is_no_positive_int(window: object) -> None:
    with pytest.raises(ConfigError, match="context_window"):
        OpenAIChatModel("local", base_url="http://127.0.0.1:9/v1", context_window=window)  # type: ignore[arg-type]


def test_the_agent_takes_the_adapters_window() -> None:
    model = OpenAIChatModel(
        "local", base_url="http://127.0.0.1:9/v1", api_key="unused", context_window=CONTEXT
    )
    assert Agent(model=model).limits.context_window == CONTEXT
