"""OpenTelemetry traces of runs: an event handler that turns a run's events into spans (and,
from ``otel_metrics``, ``FleetMetrics``: the runs of a store as gauges).

``OtelTracer`` is an ordinary event handler (``Agent(handlers=[OtelTracer()])`` or
``agent.subscribe(OtelTracer())``), so tracing costs nothing to an agent that does not use it
and needs no hook in the engine. It follows the OpenTelemetry semantic conventions for
generative AI:

* one span per activation of a run, ``invoke_agent {agent_name}`` (a paused run that is
  resumed gets a new one, marked ``agent_fsm.resumed``), whose span events are the state
  transitions (``agent_fsm.transition``, with the row's guards and label), the guard that
  ended or paused it (``agent_fsm.guard_tripped``), compactions, steering and aborts;
* under it, one span per model call, ``chat {model}``, with token usage and finish reasons
  (a failed call is a span with status ERROR, and its retry a span of its own);
* and one span per tool call, ``execute_tool {tool}``, whose status is ERROR when the call
  was answered as failed, with each retry as a span event.

A failed run ends its span with status ERROR, ``error.type`` set to the stop reason and the
run's error as the description. Message content (the input, replies, tool arguments and
results) is recorded only with ``capture_content=True``: traces often leave the team that
owns the data.

Only ``opentelemetry-api`` is imported (``pip install 'agent-fsm[otel]'``); which SDK,
processor and exporter receive the spans is the application's choice, through the global
tracer provider or the one passed in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer, TracerProvider

from agent_fsm.events import (
    AbortRequested,
    ContextCompacted,
    Event,
    FollowUpQueued,
    GuardTripped,
    HistoryRepaired,
    ModelFailed,
    ModelRequested,
    ModelResponded,
    RunFinished,
    RunPaused,
    RunResumed,
    RunStarted,
    StateChanged,
    SteeringQueued,
    ToolFinished,
    ToolRetried,
    ToolStarted,
)
from agent_fsm.otel_metrics import FleetMetrics
from agent_fsm.state import RunStatus
from agent_fsm.version import __version__

__all__ = ["FleetMetrics", "OtelTracer"]


@dataclass(slots=True)
class _RunSpans:
    """The open spans of one run's activation."""

    run: Span
    model: Span | None = None
    tools: dict[str, Span] = field(default_factory=dict)

    def end_open_children(self, why: str) -> None:
        """End spans whose closing event never came (the run ended around them)."""
        for span in [*([self.model] if self.model is not None else []), *self.tools.values()]:
            span.set_status(Status(StatusCode.ERROR, why))
            span.end()
        self.model, self.tools = None, {}


class OtelTracer:
    """Records runs as OpenTelemetry spans (see the module docstring for their shape).

    Args:
        tracer_provider: where spans go; the global provider
            (``opentelemetry.trace.set_tracer_provider``) when None.
        agent_name: ``gen_ai.agent.name``, and the run span's name ``invoke_agent {name}``.
        capture_content: also record the input, the replies, tool arguments and results.

    One tracer may serve many agents and many concurrent runs: spans are kept per run id.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        agent_name: str = "agent_fsm",
        capture_content: bool = False,
    ) -> None:
        self._tracer: Tracer = trace.get_tracer(
            "agent_fsm", __version__, tracer_provider=tracer_provider
        )
        self._agent_name = agent_name
        self._content = capture_content
        self._runs: dict[str, _RunSpans] = {}
        self._on: dict[str, Callable[[Any], None]] = {
            "run_started": self._run_started,
            "run_resumed": self._run_resumed,
            "state_changed": self._state_changed,
            "model_requested": self._model_requested,
            "model_responded": self._model_responded,
            "model_failed": self._model_failed,
            "tool_started": self._tool_started,
            "tool_retried": self._tool_retried,
            "tool_finished": self._tool_finished,
            "guard_tripped": self._guard_tripped,
            "run_paused": self._run_paused,
            "run_finished": self._run_finished,
            "context_compacted": self._context_compacted,
            "history_repaired": self._history_repaired,
            "steering_queued": self._queued,
            "follow_up_queued": self._queued,
            "abort_requested": self._abort_requested,
        }

    def __call__(self, event: Event) -> None:
        """Take one event (the handler protocol); unknown kinds are ignored."""
        on = self._on.get(event.kind)
        if on is not None:
            on(event)

    # -- the run span ---------------------------------------------------------------------

    def _open_run(self, run_id: str, attributes: dict[str, Any]) -> None:
        previous = self._runs.pop(run_id, None)
        if previous is not None:  # an activation that never finished (its process moved on)
            previous.end_open_children("the run was reopened")
            previous.run.end()
        span = self._tracer.start_span(
            f"invoke_agent {self._agent_name}",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self._agent_name,
                "gen_ai.conversation.id": run_id,
                "agent_fsm.run.id": run_id,
                **attributes,
            },
        )
        self._runs[run_id] = _RunSpans(run=span)

    def _run_started(self, event: RunStarted) -> None:
        self._open_run(event.run_id, {"agent_fsm.input": event.input} if self._content else {})

    def _run_resumed(self, event: RunResumed) -> None:
        self._open_run(
            event.run_id,
            {
                "agent_fsm.resumed": event.answered,
                "agent_fsm.resumed_in": str(event.state),
                "agent_fsm.turn": event.turn,
            },
        )

    def _run_event(self, run_id: str, name: str, attributes: dict[str, Any]) -> None:
        spans = self._runs.get(run_id)
        if spans is not None:
            spans.run.add_event(name, attributes)

    def _state_changed(self, event: StateChanged) -> None:
        self._run_event(
            event.run_id,
            "agent_fsm.transition",
            {
                "agent_fsm.source": str(event.source),
                "agent_fsm.dest": str(event.dest),
                "agent_fsm.trigger": event.trigger,
                "agent_fsm.guards": list(event.guards),
                "agent_fsm.label": event.label,
                "agent_fsm.turn": event.turn,
            },
        )

    def _guard_tripped(self, event: GuardTripped) -> None:
        self._run_event(
            event.run_id,
            "agent_fsm.guard_tripped",
            {
                "agent_fsm.state": str(event.state),
                "agent_fsm.guards": list(event.guards),
                "agent_fsm.stop_reason": event.stop_reason.value,
            },
        )

    def _run_paused(self, event: RunPaused) -> None:
        attributes: dict[str, Any] = {
            "agent_fsm.stop_reason": event.stop_reason.value,
            "agent_fsm.pending_calls": [call.name for call in event.pending_calls],
        }
        if self._content:
            attributes["agent_fsm.question"] = event.question
        self._run_event(event.run_id, "agent_fsm.paused", attributes)

    def _context_compacted(self, event: ContextCompacted) -> None:
        self._run_event(
            event.run_id,
            "agent_fsm.context_compacted",
            {
                "agent_fsm.policies": list(event.policies),
                "agent_fsm.tokens_before": event.tokens_before,
                "agent_fsm.tokens_after": event.tokens_after,
                "agent_fsm.problems": list(event.problems),
            },
        )

    def _history_repaired(self, event: HistoryRepaired) -> None:
        self._run_event(
            event.run_id,
            "agent_fsm.history_repaired",
            {
                "agent_fsm.answered": list(event.answered),
                "agent_fsm.dropped": list(event.dropped),
                "agent_fsm.system_messages": event.system_messages,
            },
        )

    def _queued(self, event: SteeringQueued | FollowUpQueued) -> None:
        attributes: dict[str, Any] = {"agent_fsm.turn": event.turn}
        if self._content:
            attributes["agent_fsm.message"] = event.message
        self._run_event(event.run_id, f"agent_fsm.{event.kind}", attributes)

    def _abort_requested(self, event: AbortRequested) -> None:
        self._run_event(
            event.run_id,
            "agent_fsm.abort_requested",
            {"agent_fsm.reason": event.reason, "agent_fsm.turn": event.turn},
        )

    def _run_finished(self, event: RunFinished) -> None:
        spans = self._runs.pop(event.run_id, None)
        if spans is None:
            return
        spans.end_open_children(f"the run ended ({event.stop_reason.value})")
        span = spans.run
        span.set_attributes(
            {
                "agent_fsm.status": event.status.value,
                "agent_fsm.stop_reason": event.stop_reason.value,
                "agent_fsm.final_state": event.final_state.value,
                "agent_fsm.turns": event.turns,
                "gen_ai.usage.input_tokens": event.usage.input_tokens,
                "gen_ai.usage.output_tokens": event.usage.output_tokens,
            }
        )
        if self._content and event.output is not None:
            span.set_attribute("agent_fsm.output", event.output)
        if event.status is RunStatus.FAILED:
            span.set_attribute("error.type", event.stop_reason.value)
            span.set_status(Status(StatusCode.ERROR, event.error or event.stop_reason.value))
        span.end()

    # -- model calls ----------------------------------------------------------------------

    def _child(self, spans: _RunSpans, name: str, attributes: dict[str, Any]) -> Span:
        return self._tracer.start_span(
            name,
            context=trace.set_span_in_context(spans.run),
            kind=SpanKind.CLIENT if name.startswith("chat") else SpanKind.INTERNAL,
            attributes=attributes,
        )

    def _model_requested(self, event: ModelRequested) -> None:
        spans = self._runs.get(event.run_id)
        if spans is None:
            return
        if spans.model is not None:  # its reply never came
            spans.model.end()
        model = event.model or "unknown"
        spans.model = self._child(
            spans,
            f"chat {model}",
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": model,
                "agent_fsm.turn": event.turn,
                "agent_fsm.messages": event.messages,
                "agent_fsm.estimated_prompt_tokens": event.estimated_prompt_tokens,
                "agent_fsm.last_answer": event.last_answer,
            },
        )

    def _model_responded(self, event: ModelResponded) -> None:
        spans = self._runs.get(event.run_id)
        if spans is None or spans.model is None:
            return
        span, spans.model = spans.model, None
        span.set_attributes(
            {
                "gen_ai.usage.input_tokens": event.usage.input_tokens,
                "gen_ai.usage.output_tokens": event.usage.output_tokens,
                "gen_ai.response.finish_reasons": [event.finish_reason.value],
                "agent_fsm.usage_estimated": event.usage.estimated,
                "agent_fsm.tool_calls": [call.name for call in event.tool_calls],
            }
        )
        if self._content:
            reply = {
                "role": "assistant",
                "content": event.text,
                "tool_calls": [
                    {"id": call.id, "name": call.name, "arguments": call.arguments}
                    for call in event.tool_calls
                ],
            }
            span.set_attribute("gen_ai.output.messages", json.dumps([reply]))
        span.end()

    def _model_failed(self, event: ModelFailed) -> None:
        spans = self._runs.get(event.run_id)
        if spans is None:
            return
        attributes: dict[str, Any] = {
            "exception.message": event.message,
            "agent_fsm.permanent": event.permanent,
        }
        if spans.model is None:  # no call was in flight (a last answer that was not sent)
            spans.run.add_event("agent_fsm.model_failed", attributes)
            return
        span, spans.model = spans.model, None
        span.add_event("exception", attributes)
        span.set_attribute("error.type", "permanent" if event.permanent else "transient")
        span.set_status(Status(StatusCode.ERROR, event.message))
        span.end()

    # -- tool calls -----------------------------------------------------------------------

    def _tool_started(self, event: ToolStarted) -> None:
        spans = self._runs.get(event.run_id)
        if spans is None:
            return
        call = event.call
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": call.name,
            "gen_ai.tool.call.id": call.id,
            "agent_fsm.turn": event.turn,
        }
        if self._content:
            attributes["gen_ai.tool.call.arguments"] = call.arguments
        spans.tools[call.id] = self._child(spans, f"execute_tool {call.name}", attributes)

    def _tool_retried(self, event: ToolRetried) -> None:
        spans = self._runs.get(event.run_id)
        span = spans.tools.get(event.call_id) if spans is not None else None
        if span is not None:
            span.add_event(
                "agent_fsm.tool_retried",
                {
                    "agent_fsm.attempt": event.attempt,
                    "exception.message": event.error,
                    "agent_fsm.delay_s": event.delay_s,
                },
            )

    def _tool_finished(self, event: ToolFinished) -> None:
        spans = self._runs.get(event.run_id)
        span = spans.tools.pop(event.call_id, None) if spans is not None else None
        if span is None:
            return
        span.set_attributes(
            {
                "agent_fsm.tool.status": event.status.value,
                "agent_fsm.tool.attempts": event.attempts,
                "agent_fsm.tool.output_chars": event.output_chars,
            }
        )
        if self._content:
            span.set_attribute("gen_ai.tool.call.result", event.output)
        if event.is_error:
            span.set_attribute("error.type", event.status.value)
            span.set_status(Status(StatusCode.ERROR, event.output[:200]))
        span.end()
