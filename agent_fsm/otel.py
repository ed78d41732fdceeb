"""OpenTelemetry traces of runs: an event handler that turns a run's events into spans (and,
from ``otel_metrics``, ``FleetMetrics``: the runs of a store as gauges).

``OtelTracer`` is an ordinary event handler (``Agent(handlers=[OtelTracer()])`` or
``agent.subscribe(OtelTracer())``), so tracing costs nothing to an agent that does not use it
and needs no hook in the engine. It follows the OpenTelemetry semantic conventions for
generative AI:

* one span per activation of a run, ``invoke_agent {agent_name}`` (a paused run that is
  resumed gets a new one, marked ``agent_fsm.resumed``), whose span events are the guard that
  ended or paused it (``agent_fsm.guard_tripped``), compactions, steering and aborts, and whose
  ``agent_fsm.edges`` attribute counts the transitions it took (``"THINK->ACT act": 12``, one
  entry per edge of the table, so its size is bounded by the table, not by the run); with
  ``transition_events=True`` each transition is also a span event of its own
  (``agent_fsm.transition``, with the row's guards, label and turn);
* under it, one span per model call, ``chat {model}``, with token usage and finish reasons
  (a failed call is a span with status ERROR, and its retry a span of its own);
* and one span per tool call, ``execute_tool {tool}``, whose status is ERROR when the call
  was answered as failed, with each retry as a span event; a sub-agent's run
  (``Agent.as_tool``, whose events reach the parent's handlers) is an ``invoke_agent`` span
  under the ``execute_tool`` span of the call that started it; a child that goes on after
  its parent's pause (its call answered then) nests under an ``execute_tool`` span of the
  resumed parent's activation, marked ``agent_fsm.continued``, which ends with the child's.

A failed run ends its span with status ERROR, ``error.type`` set to the stop reason and the
run's error as the description. Message content (the input, replies, tool arguments and
results) is recorded only with ``capture_content=True``: traces often leave the team that
owns the data.

Only ``opentelemetry-api`` is imported (``pip install -e '.[otel]'``); which SDK,
processor and exporter receive the spans is the application's choice, through the global
tracer provider or the one passed in.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from time import time_ns
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
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
    SubAgentStarted,
    ToolFinished,
    ToolRetried,
    ToolStarted,
)
from agent_fsm.otel_metrics import FleetMetrics
from agent_fsm.state import RunStatus
from agent_fsm.version import __version__

__all__ = ["FleetMetrics", "OtelTracer"]


@dataclass(slots=True)
class _Pending:
    """A model or tool call under way: its span is made when the call ends, with every
    attribute at once and the start time recorded here. One ``start_span`` with all the
    attributes costs the SDK about half of a ``start_span`` followed by ``set_attributes``
    (measured with ``benchmarks/instructions.py``), and no one sees a span before it ends:
    processors export ended spans only."""

    name: str
    kind: SpanKind
    start_ns: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any], int]] = field(default_factory=list)
    tool: str = ""
    """The tool of a tool call ("" for a model call)."""
    span: Span | None = None
    """The span, when something had to nest under it before the call ended (a sub-agent's
    run under the call that started it)."""


@dataclass(slots=True)
class _RunSpans:
    """The open span of one run's activation, and its calls under way."""

    run: Span
    context: Context
    """The run span as the parent of its calls' spans."""
    model: _Pending | None = None
    tools: dict[str, _Pending] = field(default_factory=dict)
    edges: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """How often each (source, dest, label) was taken in this activation."""


class OtelTracer:
    """Records runs as OpenTelemetry spans (see the module docstring for their shape).

    Args:
        tracer_provider: where spans go; the global provider
            (``opentelemetry.trace.set_tracer_provider``) when None.
        agent_name: ``gen_ai.agent.name``, and the run span's name ``invoke_agent {name}``.
        capture_content: also record the input, the replies, tool arguments and results.
        transition_events: also record every transition as a span event. Off by default:
            four events per turn cost more than the rest of a turn's tracing (measured with
            ``benchmarks/instructions.py``), and the run span's ``agent_fsm.edges`` already
            says which edges were taken and how often.

    One tracer may serve many agents and many concurrent runs: spans are kept per run id.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        agent_name: str = "agent_fsm",
        capture_content: bool = False,
        transition_events: bool = False,
    ) -> None:
        self._tracer: Tracer = trace.get_tracer(
            "agent_fsm", __version__, tracer_provider=tracer_provider
        )
        self._agent_name = agent_name
        self._content = capture_content
        self._transition_events = transition_events
        self._runs: dict[str, _RunSpans] = {}
        self._callers: dict[str, Span] = {}
        """The ``execute_tool`` span of the call that started each sub-agent run, until that
        run's span is opened under it."""
        self._continued: dict[str, tuple[str, str]] = {}
        """For a child that goes on after its parent's pause: the parent run, and the key of
        its call's span among the parent's calls, until the child's activation ends."""
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
            "sub_agent_started": self._sub_agent_started,
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
            self._end_open_calls(previous, "the run was reopened")
            previous.run.end()
        caller = self._callers.pop(run_id, None)
        span = self._tracer.start_span(
            f"invoke_agent {self._agent_name}",
            context=None if caller is None else trace.set_span_in_context(caller),
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": self._agent_name,
                "gen_ai.conversation.id": run_id,
                "agent_fsm.run.id": run_id,
                **attributes,
            },
        )
        self._runs[run_id] = _RunSpans(run=span, context=trace.set_span_in_context(span))

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
        spans = self._runs.get(event.run_id)
        if spans is None:
            return
        edge = (event.source, event.dest, event.label)
        spans.edges[edge] = spans.edges.get(edge, 0) + 1
        if not self._transition_events:
            return
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
        self._end_continued(event)
        spans = self._runs.pop(event.run_id, None)
        if spans is None:
            return
        self._end_open_calls(spans, f"the run ended ({event.stop_reason.value})")
        span = spans.run
        span.set_attributes(
            {
                "agent_fsm.status": event.status.value,
                "agent_fsm.stop_reason": event.stop_reason.value,
                "agent_fsm.final_state": event.final_state.value,
                "agent_fsm.turns": event.turns,
                "agent_fsm.transitions": sum(spans.edges.values()),
                "agent_fsm.edges": [
                    f"{source}->{dest} {label}: {count}"
                    for (source, dest, label), count in spans.edges.items()
                ],
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

    def _end_continued(self, event: RunFinished) -> None:
        """A child that went on after its parent's pause stopped: the span of its call, in
        the parent's activation, ends with it."""
        if not self._continued:
            return
        continued = self._continued.pop(event.run_id, None)
        if continued is None:
            return
        parent_id, key = continued
        spans = self._runs.get(parent_id)
        call = spans.tools.pop(key, None) if spans is not None else None
        if spans is None or call is None:
            return
        failed = event.status is RunStatus.FAILED
        error = (event.stop_reason.value, event.error or event.stop_reason.value)
        attributes: dict[str, Any] = {"agent_fsm.sub_agent.status": event.status.value}
        self._end_call(spans, call, attributes, error if failed else None)

    # -- model and tool calls -------------------------------------------------------------

    def _end_call(
        self,
        spans: _RunSpans,
        call: _Pending,
        attributes: dict[str, Any],
        error: tuple[str, str] | None = None,
    ) -> None:
        """Record ``call`` as an ended span, with ``attributes`` added to those it started
        with, and status ERROR (``error.type``, description) when ``error`` is given."""
        if error is not None:
            attributes["error.type"] = error[0]
        span = call.span
        if span is None:
            call.attributes.update(attributes)
            span = self._start_call(spans, call)
        else:
            span.set_attributes(attributes)
        for name, event_attributes, timestamp in call.events:
            span.add_event(name, event_attributes, timestamp)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error[1]))
        span.end()

    def _start_call(self, spans: _RunSpans, call: _Pending) -> Span:
        """The span of ``call``, started at its recorded time with the attributes it has."""
        return self._tracer.start_span(
            call.name,
            context=spans.context,
            kind=call.kind,
            attributes=call.attributes,
            start_time=call.start_ns,
        )

    def _end_open_calls(self, spans: _RunSpans, why: str) -> None:
        """End the spans of calls whose closing event never came (the run ended around
        them), as errors."""
        calls = [*([spans.model] if spans.model is not None else []), *spans.tools.values()]
        spans.model, spans.tools = None, {}
        for call in calls:
            self._end_call(spans, call, {}, ("interrupted", why))

    def _model_requested(self, event: ModelRequested) -> None:
        spans = self._runs.get(event.run_id)
        if spans is None:
            return
        if spans.model is not None:  # its reply never came
            self._end_call(spans, spans.model, {}, ("interrupted", "no reply came"))
        model = event.model or "unknown"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": model,
            "agent_fsm.turn": event.turn,
            "agent_fsm.messages": event.messages,
            "agent_fsm.estimated_prompt_tokens": event.estimated_prompt_tokens,
        }
        if event.last_answer:
            attributes["agent_fsm.last_answer"] = True
        spans.model = _Pending(f"chat {model}", SpanKind.CLIENT, time_ns(), attributes)

    def _model_responded(self, event: ModelResponded) -> None:
        spans = self._runs.get(event.run_id)
        if spans is None or spans.model is None:
            return
        call, spans.model = spans.model, None
        attributes: dict[str, Any] = {
            "gen_ai.usage.input_tokens": event.usage.input_tokens,
            "gen_ai.usage.output_tokens": event.usage.output_tokens,
            "gen_ai.response.finish_reasons": (event.finish_reason.value,),
            "agent_fsm.tool_calls": tuple(call.name for call in event.tool_calls),
        }
        if event.usage.estimated:  # like last_answer, said only when true: each costs the SDK
            attributes["agent_fsm.usage_estimated"] = True
        if self._content:
            reply = {
                "role": "assistant",
                "content": event.text,
                "tool_calls": [
                    {"id": call.id, "name": call.name, "arguments": call.arguments}
                    for call in event.tool_calls
                ],
            }
            attributes["gen_ai.output.messages"] = json.dumps([reply])
        self._end_call(spans, call, attributes)

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
        call, spans.model = spans.model, None
        call.events.append(("exception", attributes, time_ns()))
        kind = "permanent" if event.permanent else "transient"
        self._end_call(spans, call, {}, (kind, event.message))

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
        spans.tools[call.id] = _Pending(
            f"execute_tool {call.name}", SpanKind.INTERNAL, time_ns(), attributes, tool=call.name
        )

    def _sub_agent_started(self, event: SubAgentStarted) -> None:
        """A sub-agent's run nests under the call that started it: its tool's open call
        (a sub-agent tool's calls run one at a time, so there is one), whose span is made
        now rather than when the call ends."""
        spans = self._runs.get(event.run_id)
        if spans is None:
            return
        caller: _Pending | None = None
        if event.continued:  # its call was answered at the pause: it has a span of its own
            caller = self._continued_call(spans, event)
        else:
            for call in reversed(spans.tools.values()):
                if call.tool == event.tool:
                    caller = call
                    break
        if caller is None:
            return
        if caller.span is None:
            caller.span = self._start_call(spans, caller)
        if len(self._callers) < 10_000:  # runs that never start must not pile up
            self._callers[event.sub_agent_run_id] = caller.span

    def _continued_call(self, spans: _RunSpans, event: SubAgentStarted) -> _Pending:
        """An ``execute_tool`` span for the call of a child that goes on after its parent's
        pause (``agent_fsm.continued``): the call was answered when the parent paused, so
        this activation has no span for it; it ends when the child's activation does."""
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": event.tool,
            "gen_ai.tool.call.id": event.tool_call_id,
            "agent_fsm.turn": event.turn,
            "agent_fsm.continued": True,
        }
        call = _Pending(
            f"execute_tool {event.tool}", SpanKind.INTERNAL, time_ns(), attributes, tool=event.tool
        )
        key = f"continued {event.sub_agent_run_id}"
        spans.tools[key] = call
        if len(self._continued) < 10_000:
            self._continued[event.sub_agent_run_id] = (event.run_id, key)
        return call

    def _tool_retried(self, event: ToolRetried) -> None:
        spans = self._runs.get(event.run_id)
        call = spans.tools.get(event.call_id) if spans is not None else None
        if call is not None:
            attributes = {
                "agent_fsm.attempt": event.attempt,
                "exception.message": event.error,
                "agent_fsm.delay_s": event.delay_s,
            }
            call.events.append(("agent_fsm.tool_retried", attributes, time_ns()))

    def _tool_finished(self, event: ToolFinished) -> None:
        spans = self._runs.get(event.run_id)
        call = spans.tools.pop(event.call_id, None) if spans is not None else None
        if spans is None or call is None:
            return
        attributes: dict[str, Any] = {
            "agent_fsm.tool.status": event.status.value,
            "agent_fsm.tool.attempts": event.attempts,
            "agent_fsm.tool.output_chars": event.output_chars,
        }
        if self._content:
            attributes["gen_ai.tool.call.result"] = event.output
        error = (event.status.value, event.output[:200]) if event.is_error else None
        self._end_call(spans, call, attributes, error)
