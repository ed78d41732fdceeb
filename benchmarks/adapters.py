"""Per-call time of each provider adapter on an instant transport.

Each adapter answers the same request (a system prompt, a user message, two earlier tool
turns and two tools) with the same reply, written in its provider's wire format by the test
kits (``tests/provider_kits``) once, up front; the SDK's HTTP client gets a mock transport
that returns those bytes at once. So the time per call is what the adapter and its SDK cost
on top of the network: converting the transcript, building and sending the request through
the SDK's stack, parsing the reply and converting it back.

    python benchmarks/adapters.py [--calls N] [--stream]

It reports the median of five rounds of N calls, in microseconds per call, for a text reply
and for a reply with two tool calls, and the adapter's own share of that time: the self time
of agent_fsm's code under cProfile, over all the time profiled (the rest is the SDK and its
HTTP client). Timings on shared machines are noisy: compare adapters within one invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the tests' provider kits

from agent_fsm.messages import (
    AssistantMessage,
    FinishReason,
    ModelRequest,
    ModelResponse,
    SystemMessage,
    ToolCall,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from tests.provider_kits import WireKit, all_kits
from tests.provider_kits.base import http

_TOOL = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    },
)
_CALLS = (
    ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
    ToolCall(id="call_2", name="get_weather", arguments='{"city": "Oslo"}'),
)
_USAGE = Usage(input_tokens=420, output_tokens=38, cached_tokens=256, requests=1)
REPLIES = {
    "text": ModelResponse(
        message=AssistantMessage(content="Paris is sunny at 21 degrees; Oslo is rainy at 9."),
        usage=_USAGE,
    ),
    "two tool calls": ModelResponse(
        message=AssistantMessage(content="", tool_calls=_CALLS),
        finish_reason=FinishReason.TOOL_CALLS,
        usage=_USAGE,
    ),
}


def _request() -> ModelRequest:
    history = [
        SystemMessage(content="You answer weather questions. Use the tools."),
        UserMessage(content="Weather in Paris and Oslo?"),
        AssistantMessage(content="", tool_calls=_CALLS),
        ToolMessage(tool_call_id="call_1", name="get_weather", content="sunny, 21 C"),
        ToolMessage(tool_call_id="call_2", name="get_weather", content="rain, 9 C"),
    ]
    return ModelRequest(messages=history, tools=(_TOOL, _TOOL.model_copy(update={"name": "x"})),
                        run_id="bench", turn=3)  # fmt: skip


def _instant(reply: Any) -> Any:
    status, headers, body = reply.status, dict(reply.headers), reply.body

    async def handle(request: Any) -> Any:
        return http.Response(status, headers=headers, content=body)

    return http.AsyncClient(transport=http.MockTransport(handle))


async def _measure(
    kit: WireKit, reply: ModelResponse, *, calls: int, stream: bool
) -> tuple[float, float]:
    """Microseconds per call (median of five rounds), and the adapter's own share of it."""
    model = kit.build(_instant(kit.reply(reply, stream=stream)), stream=stream)
    request = _request()
    for _ in range(20):  # warm up: imports, caches, the client's pool
        await model.request(request)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            await model.request(request)
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        await model.request(request)
    profile.disable()
    table: dict[Any, Any] = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    own = sum(row[2] for (path, _, _), row in table.items() if "/agent_fsm/" in path)
    every = sum(row[2] for row in table.values())
    return statistics.median(rounds), own / every


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--stream", action="store_true", help="streamed replies")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    mode = "streamed" if args.stream else "whole"
    print(f"per call, {mode} replies, instant transport ({args.calls} calls x 5 rounds, median)")
    print(f"{'adapter':<18}" + "".join(f"{name:>26}" for name in REPLIES))
    for kit in all_kits():
        cells = []
        for reply in REPLIES.values():
            per_call, own = await _measure(kit, reply, calls=args.calls, stream=args.stream)
            cells.append(f"{per_call:>8.0f} us ({own:>4.0%} own)")
        print(f"{kit.name:<18}" + "".join(f"{cell:>26}" for cell in cells))


if __name__ == "__main__":
    asyncio.run(main())
