"""OpenTelemetry traces (issue 17): the span tree of a run, as the README documents it,
recorded with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from agent_fsm import Agent, StopReason
from agent_fsm.otel import OtelTracer
from agent_fsm.testing import ScriptedModel, call, reply
from tests.conftest import add, boom, echo, limits


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    yield exporter
    exporter.shutdown()


def provider_for(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def tree(spans: Sequence[ReadableSpan]) -> list[str]:
    """Each span as ``name [ERROR]``, children indented under their parent, in start order."""
    by_parent: dict[int | None, list[ReadableSpan]] = {}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = span.parent.span_id if span.parent is not None else None
        by_parent.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for span in by_parent.get(parent, []):
            error = " [ERROR]" if span.status.status_code is StatusCode.ERROR else ""
            lines.append("  " * depth + span.name + error)
            walk(span.context.span_id if span.context else None, depth + 1)

    walk(None, 0)
    return lines


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def test_a_run_with_a_tool_error_a_retry_and_a_loop_is_traced_as_documented(
    exporter: InMemorySpanExporter,
) -> None:
    script = [
        reply("", call("boom", reason="disk full"), usage=(100, 10)),
        ConnectionError("connection reset"),
        reply("", call("echo", text="again"), usage=(120, 12)),
        reply("", call("echo", text="again"), usage=(130, 13)),
    ]
    agent = Agent(
        model=ScriptedModel(script, name="gpt-test"),
        tools=[echo, boom],
        limits=limits(loop_threshold=2),
        handlers=[OtelTracer(tracer_provider=provider_for(exporter), agent_name="helper")],
    )
    result = agent.run_sync("Try things.")
    assert result.stop_reason is StopReason.LOOP_DETECTED
    spans = exporter.get_finished_spans()
    assert tree(spans) == [
        "invoke_agent helper [ERROR]",
        "  chat gpt-test",
        "  execute_tool boom [ERROR]",
        "  chat gpt-test [ERROR]",
        "  chat gpt-test",
        "  execute_tool echo",
        "  chat gpt-test",
        "  execute_tool echo",
    ]
    (run,) = named(spans, "invoke_agent helper")
    attributes = dict(run.attributes or {})
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["gen_ai.conversation.id"] == result.run_id
    assert attributes["error.type"] == "loop_detected"
    assert attributes["agent_fsm.turns"] == 3
    assert attributes["gen_ai.usage.input_tokens"] == 350
    assert run.status.description == result.error
    # The edges taken, each counted once, instead of an event per transition (opt-in below).
    assert not [e for e in run.events if e.name == "agent_fsm.transition"]
    taken = Counter(f"{t.source}->{t.dest} {t.label}" for t in result.trace)
    edges = attributes["agent_fsm.edges"]
    assert isinstance(edges, tuple)
    assert {e.rsplit(": ", 1)[0]: int(e.rsplit(": ", 1)[1]) for e in edges} == taken
    assert len(edges) == len(taken) < len(result.trace)
    assert attributes["agent_fsm.transitions"] == len(result.trace)
    assert edges[-1] == "REFLECT->ERROR loop_detected: 1"
    (tripped,) = [e for e in run.events if e.name == "agent_fsm.guard_tripped"]
    assert dict(tripped.attributes or {}) == {
        "agent_fsm.state": "REFLECT",
        "agent_fsm.guards": ("is_looping",),
        "agent_fsm.stop_reason": "loop_detected",
    }
    chats = named(spans, "chat gpt-test")
    assert [c.attributes["gen_ai.usage.input_tokens"] for c in chats if c.status.is_ok] == [  # type: ignore[index]
        100,
        120,
        130,
    ]
    failed = next(c for c in chats if not c.status.is_ok)
    assert "connection reset" in (failed.status.description or "")
    assert failed.attributes["error.type"] == "transient"  # type: ignore[index]
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)  # type: ignore[index]
    (boom_span,) = named(spans, "execute_tool boom")
    assert boom_span.attributes["gen_ai.tool.name"] == "boom"  # type: ignore[index]
    assert "disk full" in (boom_span.status.description or "")


def test_transition_events_are_recorded_when_asked_for(exporter: InMemorySpanExporter) -> None:
    tracer = OtelTracer(tracer_provider=provider_for(exporter), transition_events=True)
    script = [reply("", call("echo", text="one")), reply("", call("echo", text="two")), "Done."]
    agent = Agent(model=ScriptedModel(script), tools=[echo], handlers=[tracer])
    result = agent.run_sync("Echo twice.")
    (run,) = named(exporter.get_finished_spans(), "invoke_agent agent_fsm")
    transitions = [dict(e.attributes or {}) for e in run.events if e.name == "agent_fsm.transition"]
    assert [
        (t["agent_fsm.source"], t["agent_fsm.dest"], t["agent_fsm.label"]) for t in transitions
    ] == [(str(t.source), str(t.dest), t.label) for t in result.trace]
    assert transitions[-1]["agent_fsm.label"] == "final_answer"
    assert [t["agent_fsm.turn"] for t in transitions] == [t.turn for t in result.trace]


def test_no_content_is_recorded_unless_asked_for(exporter: InMemorySpanExporter) -> None:
    secret = "the launch code is 0000"
    script = [reply("", call("echo", text=secret)), f"Done: {secret}"]

    def spans_of(capture: bool) -> list[ReadableSpan]:
        exporter.clear()
        tracer = OtelTracer(tracer_provider=provider_for(exporter), capture_content=capture)
        agent = Agent(model=ScriptedModel(script), tools=[echo], handlers=[tracer])
        assert agent.run_sync(f"Repeat: {secret}").output == f"Done: {secret}"
        return list(exporter.get_finished_spans())

    def everything(spans: list[ReadableSpan]) -> str:
        texts = []
        for span in spans:
            texts.append(json.dumps(dict(span.attributes or {}), default=str))
            texts.extend(json.dumps(dict(e.attributes or {}), default=str) for e in span.events)
        return "\n".join(texts)

    assert secret not in everything(spans_of(capture=False))
    captured = spans_of(capture=True)
    assert secret in everything(captured)
    (tool,) = named(captured, "execute_tool echo")
    assert tool.attributes["gen_ai.tool.call.result"] == secret  # type: ignore[index]


def test_a_paused_and_resumed_run_has_a_span_per_activation(
    exporter: InMemorySpanExporter,
) -> None:
    script = [reply("", call("ask_user", question="Which city?")), "Sunny in Oslo."]
    tracer = OtelTracer(tracer_provider=provider_for(exporter))
    agent = Agent(model=ScriptedModel(script), handlers=[tracer])
    paused = agent.run_sync("Weather?")
    done = agent.resume_sync(paused.run_id, "Oslo")
    assert done.output == "Sunny in Oslo."
    runs = named(exporter.get_finished_spans(), "invoke_agent agent_fsm")
    assert len(runs) == 2
    first, second = sorted(runs, key=lambda s: s.start_time or 0)
    assert first.status.status_code is StatusCode.UNSET  # a pause is no error
    assert first.attributes["agent_fsm.status"] == "needs_input"  # type: ignore[index]
    assert any(e.name == "agent_fsm.paused" for e in first.events)
    assert second.attributes["agent_fsm.resumed"] == "reply"  # type: ignore[index]
    assert second.attributes["agent_fsm.stop_reason"] == "final_answer"  # type: ignore[index]


async def test_concurrent_runs_keep_their_own_spans(exporter: InMemorySpanExporter) -> None:
    tracer = OtelTracer(tracer_provider=provider_for(exporter))

    def agent() -> Agent:
        script = [reply("", call("add", a=1, b=2)), "3"]
        return Agent(model=ScriptedModel(script), tools=[add], handlers=[tracer])

    results = await asyncio.gather(*(agent().run("Add.") for _ in range(5)))
    spans = exporter.get_finished_spans()
    runs = named(spans, "invoke_agent agent_fsm")
    assert len(runs) == 5
    for run in runs:
        children = [
            s for s in spans if s.parent is not None and s.parent.span_id == run.context.span_id
        ]
        assert sorted(s.name for s in children) == [
            "chat scripted",
            "chat scripted",
            "execute_tool add",
        ]
    assert {r.run_id for r in results} == {
        run.attributes["agent_fsm.run.id"]
        for run in runs  # type: ignore[index]
    }


def test_a_sub_agents_run_nests_under_the_call_that_started_it(
    exporter: InMemorySpanExporter,
) -> None:
    worker = Agent(
        model=ScriptedModel([reply("", call("echo", text="x")), "found"], name="worker"),
        tools=[echo],
    )
    boss = Agent(
        model=ScriptedModel([reply("", call("work", task="find x")), "done"], name="boss"),
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=limits(),
    )
    tracer = OtelTracer(tracer_provider=provider_for(exporter))
    result = boss.subscribe(tracer).run_sync("go")
    assert result.stop_reason is StopReason.FINAL_ANSWER
    assert tree(exporter.get_finished_spans()) == [
        "invoke_agent agent_fsm",
        "  chat boss",
        "  execute_tool work",
        "    invoke_agent agent_fsm",
        "      chat worker",
        "      execute_tool echo",
        "      chat worker",
        "  chat boss",
    ]


def test_a_sub_agent_continued_after_a_pause_nests_under_its_calls_span(
    exporter: InMemorySpanExporter,
) -> None:
    """The child asks the user, the tree pauses; resumed, the parent goes on with the child,
    whose call was answered at the pause: the parent's activation gets an ``execute_tool``
    span for the continued call (``agent_fsm.continued``), and the child's activation nests
    under it, as it did under the call that started it."""
    worker = Agent(
        model=ScriptedModel(
            [reply("", call("ask_user", question="Which city?")), "Sunny in Oslo"],
            name="worker",
        )
    )
    boss = Agent(
        model=ScriptedModel([reply("", call("work", task="weather")), "done"], name="boss"),
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=limits(),
    )
    tracer = OtelTracer(tracer_provider=provider_for(exporter))
    boss = boss.subscribe(tracer)
    paused = boss.run_sync("go")
    assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
    exporter.clear()
    done = boss.resume_sync(paused.run_id, "Oslo")
    assert done.output == "done"
    spans = exporter.get_finished_spans()
    assert tree(spans) == [
        "invoke_agent agent_fsm",
        "  execute_tool work",
        "    invoke_agent agent_fsm",
        "      chat worker",
        "  chat boss",
    ]
    (continued,) = named(spans, "execute_tool work")
    assert continued.attributes["agent_fsm.continued"] is True  # type: ignore[index]
    (answer,) = [m for m in paused.messages if m.role == "tool"]
    assert continued.attributes["gen_ai.tool.call.id"] == answer.tool_call_id  # type: ignore[index]
