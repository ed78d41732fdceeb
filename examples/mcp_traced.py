"""An agent that uses the tools of an MCP server, traced with OpenTelemetry.

examples/mcp_server.py is started as a subprocess and spoken to over stdio; its tools are
offered to the model as ordinary tools. One of them fails on the server (an isError result),
which the trace shows as a tool span with status ERROR. The run's spans are printed as a tree
(``--console`` sends them to the SDK's console exporter instead, as JSON). Offline, on the
scripted model.

Needs the ``mcp`` and ``otel`` extras (``pip install -e '.[mcp,otel]'``).

python examples/mcp_traced.py [--console]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_fsm import Agent
from agent_fsm.mcp import MCPConnection
from agent_fsm.otel import OtelTracer
from agent_fsm.testing import ScriptedModel, call, reply

SERVER = Path(__file__).resolve().with_name("mcp_server.py")


def script() -> ScriptedModel:
    """A forecast and an alert check at once (the alert service fails), a conversion, and
    the answer."""
    return ScriptedModel(
        [
            reply(
                "",
                call("weather_forecast", city="Oslo"),
                call("weather_alerts", region="Oslo"),
                usage=(150, 12),
            ),
            reply("", call("weather_fahrenheit", celsius=21.5), usage=(230, 9)),
            reply("Oslo tomorrow: sunny, 21.5 °C (70.7 °F). No alerts to report.", usage=(260, 14)),
        ],
        name="gpt-demo",
    )


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """Each span as ``name  facts``, children indented under their parent."""
    children: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = span.parent.span_id if span.parent is not None else None
        children.setdefault(parent, []).append(span)
    shown = ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "agent_fsm.stop_reason")
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in children.get(parent, []):
            attributes = span.attributes or {}
            facts = [
                f"{key.rsplit('.', 1)[-1]}={attributes[key]!s}"
                for key in shown
                if key in attributes
            ]
            if span.status.status_code is StatusCode.ERROR:
                facts.append(f"ERROR: {span.status.description}")
            lines.append(f"{'  ' * depth}{span.name}  {', '.join(facts)}".rstrip())
            walk(span.context.span_id if span.context else None, depth + 1)

    walk(None, 0)
    return lines


async def main(console: bool) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter() if console else memory))
    station = MCPConnection.stdio(sys.executable, [str(SERVER), "--serve"], prefix="weather_")
    async with station:  # the server runs while the block does
        print(f"{station.name}: {', '.join(tool.name for tool in station.tools)}")
        agent = Agent(
            model=script(),
            tools=station.tools,
            handlers=[OtelTracer(tracer_provider=provider, agent_name="forecaster")],
        )
        result = await agent.run("What is the weather in Oslo tomorrow?")
    print(f"stop reason: {result.stop_reason.value}; answer: {result.output}")
    if not console:
        print("\n".join(tree(memory.get_finished_spans())))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--console", action="store_true", help="print spans as JSON instead")
    asyncio.run(main(parser.parse_args().console))
