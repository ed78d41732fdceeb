"""A run traced with OpenTelemetry: a tool error, a model retry, a loop, and a last answer.

The run's spans are collected in memory and printed as a tree (``--console`` sends them to
the SDK's console exporter instead, as JSON). Offline, on the scripted model.

Needs the ``otel`` extra (``pip install -e '.[otel]'``).

python examples/otel_trace.py [--console]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_fsm import Agent, Limits, tool
from agent_fsm.otel import OtelTracer
from agent_fsm.testing import ScriptedModel, call, reply


@tool
def search(query: str) -> str:
    """Search the archive."""
    if not query.strip():
        raise ValueError("empty query")
    return "no results"


def script() -> ScriptedModel:
    """An empty search (a tool error), a dropped connection (retried), the same search
    twice (a loop), then the last answer asked for as the loop ends the run."""
    return ScriptedModel(
        [
            reply("", call("search", query=" "), usage=(120, 8)),
            ConnectionError("connection reset by peer"),
            reply("", call("search", query="agent_fsm"), usage=(160, 9)),
            reply("", call("search", query="agent_fsm"), usage=(190, 9)),
            reply("Nothing in the archive mentions agent_fsm.", usage=(210, 11)),
        ],
        name="gpt-demo",
    )


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """Each span as ``name  attributes``, children indented under their parent."""
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
            if attributes.get("agent_fsm.last_answer"):
                facts.append("the last answer")
            if span.status.status_code is StatusCode.ERROR:
                facts.append(f"ERROR: {span.status.description}")
            lines.append(f"{'  ' * depth}{span.name}  {', '.join(facts)}".rstrip())
            walk(span.context.span_id if span.context else None, depth + 1)

    walk(None, 0)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--console", action="store_true", help="print spans as JSON instead")
    args = parser.parse_args()
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(
        SimpleSpanProcessor(ConsoleSpanExporter() if args.console else memory)
    )
    agent = Agent(
        model=script(),
        tools=[search],
        limits=Limits(loop_threshold=2, last_answer=True, retry_backoff_s=0.0),
        handlers=[OtelTracer(tracer_provider=provider, agent_name="archivist")],
    )
    result = agent.run_sync("Does the archive mention agent_fsm?")
    print(f"stop reason: {result.stop_reason.value}; last answer: {result.output}")
    if not args.console:
        print("\n".join(tree(memory.get_finished_spans())))


if __name__ == "__main__":
    main()
