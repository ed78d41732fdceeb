"""Record a run, replay it offline, and assert it takes the same transitions.

A recording is a trace file (``agent_fsm.durable.tracefile``, JSON Lines): the events of a run hold
every model reply (``ModelResponded``), every failed model call (``ModelFailed``), every tool
result (``ToolFinished``) and every transition (``StateChanged``). So any run recorded with a
``TraceWriter`` (in production, or by ``agent-fsm run --trace``) is already a regression test:

    record_run(agent, "Weather in Paris?", "paris.jsonl")   # or: agent.subscribe(TraceWriter(...))
    assert_replays(agent, "paris.jsonl")                     # offline, in a test

Replay is offline: the model is a ``ScriptedModel`` over the recorded replies (failed calls
raise the recorded error again), and each of the agent's tools is a double answering its
calls, in order, with the recorded results (recorded exceptions and timeouts are raised
again, so the tool runtime words them as it did). Arguments are still validated against the
tools' schemas, so invalid calls are answered by the agent itself. The clock is fake: a run
recorded as stopped by ``timeout`` does not replay.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent_fsm.durable.tracefile import RecordedRun, TraceWriter, read_run
from agent_fsm.events import (
    Event,
    ModelFailed,
    ModelRequested,
    ModelResponded,
    ToolFinished,
    ToolStarted,
)
from agent_fsm.messages import AssistantMessage, ModelResponse, ToolCall, ToolStatus
from agent_fsm.models.base import ModelCallError
from agent_fsm.state import RunResult, TraceEntry
from agent_fsm.testing.behaviour import FakeClock, user_tools
from agent_fsm.testing.harness import run_sync
from agent_fsm.testing.models import ScriptedModel, ScriptItem
from agent_fsm.tools.results import ToolResult
from agent_fsm.tools.tool import Tool

if TYPE_CHECKING:
    from agent_fsm.agent import Agent

__all__ = [
    "Recording",
    "ReplayMismatch",
    "assert_replays",
    "load_recording",
    "record_run",
    "replay",
]

StrPath = str | Path


@dataclass(frozen=True, slots=True, kw_only=True)
class Recording:
    """What a replay needs from one recorded run."""

    run: RecordedRun
    input: str
    replies: tuple[ScriptItem, ...]
    """What each model call returned (or raised), in order."""
    tool_results: tuple[tuple[ToolCall, ToolFinished], ...]
    """Every tool call and its recorded answer, in order."""

    @property
    def trace(self) -> tuple[TraceEntry, ...]:
        return self.run.trace


class ReplayMismatch(AssertionError):
    """A replay took other transitions than the recording; the message is a diff."""


def record_run(
    agent: Agent, user_input: str, path: StrPath, *, run_id: str | None = None
) -> RunResult:
    """Run ``agent`` once (for real) and record its events to ``path`` (JSON Lines)."""
    writer = TraceWriter(path)
    run = agent.start(user_input, run_id=run_id)
    run.subscribe(writer)
    try:
        return run_sync(run.run)
    finally:
        writer.close()


def _replies(events: Sequence[Event]) -> tuple[ScriptItem, ...]:
    """What each model call returned or raised, in order. A call begins with its
    ``ModelRequested``; an empty reply is responded *and* failed: the reply is replayed."""
    items: list[ScriptItem] = []
    answered = True
    for e in events:
        if isinstance(e, ModelRequested):
            answered = False
        elif isinstance(e, ModelResponded):
            items.append(
                ModelResponse(
                    message=AssistantMessage(content=e.text, tool_calls=e.tool_calls),
                    finish_reason=e.finish_reason,
                    usage=e.usage,
                )
            )
            answered = True
        elif isinstance(e, ModelFailed) and not answered:
            items.append(ModelCallError(e.message, transient=not e.permanent))
            answered = True
    return tuple(items)


def load_recording(path: StrPath, run_id: str | None = None) -> Recording:
    """Read the run recorded in ``path`` (or the run ``run_id`` of several).

    Raises:
        TraceFileError: for a bad file, or one with several runs and no ``run_id``.
    """
    run = read_run(path, run_id)
    calls = {
        (e.turn, e.call.id): e.call for e in run.events if isinstance(e, ToolStarted)
    }  # fmt: skip
    results = tuple(
        (calls.get((e.turn, e.call_id), ToolCall(id=e.call_id, name=e.name)), e)
        for e in run.events
        if isinstance(e, ToolFinished)
    )
    return Recording(
        run=run, input=run.input or "", replies=_replies(run.events), tool_results=results
    )


_FAILED = re.compile(r"^Tool '[^']*' failed: (\w+): (.*)$", re.DOTALL)
_TIMED_OUT = re.compile(r"^Tool '[^']*' timed out after ")


def _raise_recorded(output: str) -> ToolResult:
    """Reproduce a recorded error: a timeout in the runtime's words, an exception by raising
    one of the same type name and message (so the runtime words it the same way)."""
    if _TIMED_OUT.match(output):
        return ToolResult(output=output, is_error=True)
    found = _FAILED.match(output)
    if found:  # the same exception type name and message, so the same result text
        raise type(found.group(1), (Exception,), {})(found.group(2))
    raise RuntimeError(output)


def _replay_double(tool: Tool, answers: list[ToolFinished]) -> Tool:
    async def double(**arguments: Any) -> Any:
        if not answers:
            raise RuntimeError(f"the recording has no further result for {tool.name!r}")
        answer = answers.pop(0)
        if answer.status is ToolStatus.OK:
            return answer.output
        return _raise_recorded(answer.output)

    return replace(tool, fn=double)


def _offline(agent: Agent, recording: Recording) -> tuple[Agent, ScriptedModel]:
    executed: dict[str, list[ToolFinished]] = {}
    for call, finished in recording.tool_results:
        if finished.status is ToolStatus.SKIPPED or agent.registry.prepare(call).error is not None:
            continue  # never reached the tool: the agent answers it again itself
        executed.setdefault(call.name, []).append(finished)
    model = ScriptedModel(recording.replies, name="replay")
    clock = FakeClock()
    tools = [_replay_double(t, executed.get(t.name, [])) for t in user_tools(agent)]
    return agent.replace(model=model, tools=tools, clock=clock, sleep=clock.sleep), model


def replay(agent: Agent, recording: Recording | StrPath, *, run_id: str | None = None) -> RunResult:
    """Run ``agent`` offline against a recording: recorded replies, recorded tool results."""
    if not isinstance(recording, Recording):
        recording = load_recording(recording, run_id)
    offline, _ = _offline(agent, recording)
    text = recording.input
    return run_sync(lambda: offline.run(text))


def _lines(trace: Sequence[TraceEntry], stop: str | None) -> list[str]:
    lines = [
        f"turn {e.turn}: {e.source} --{e.label}[{' and '.join(e.guards) or 'else'}]--> {e.dest}"
        for e in trace
    ]
    return [*lines, f"stopped: {stop}"]


def assert_replays(
    agent: Agent, recording: Recording | StrPath, *, run_id: str | None = None
) -> RunResult:
    """Replay ``recording`` offline and assert the run takes the recorded transitions, in
    order, and stops for the recorded reason.

    Raises:
        ReplayMismatch: with a unified diff of the recorded and replayed transitions.
    """
    if not isinstance(recording, Recording):
        recording = load_recording(recording, run_id)
    result = replay(agent, recording)
    stop = recording.run.stop_reason
    expected = _lines(recording.trace, stop.value if stop else None)
    actual = _lines(result.trace, result.stop_reason.value)
    if expected != actual:
        diff = "\n".join(
            difflib.unified_diff(expected, actual, "recorded", "replayed", lineterm="")
        )
        raise ReplayMismatch(
            f"the replay of run {recording.run.run_id} took other transitions than the "
            f"recording:\n{diff}"
        )
    return result
