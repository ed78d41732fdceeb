"""A trace file (``TraceWriter``, ``--trace``) as a read-only source of runs for the ui.

``TraceRuns`` offers what the pages read of a store: ``list_runs`` (summaries) and
``load`` (a ``RunState`` rebuilt from each run's events: the transcript from the model's
replies and the tools' answers, the trace matched to the table's rows, the outcome). It
re-reads the file on each call, so a file a running process still writes is followed live
like a store. What a trace keeps and a checkpoint does not is each model call's usage:
``usage_by_turn`` gives it, and the step-through shows the usage as of each step. A trace
keeps no timestamps (durations show 0) and no system prompt; it cannot be steered.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from agent_fsm.durable.encoding import RunSummary
from agent_fsm.durable.listing import stop_kept, stop_names
from agent_fsm.durable.tracefile import RecordedRun, read_trace, recorded_runs
from agent_fsm.errors import CheckpointError, TraceFileError
from agent_fsm.events import ModelResponded, ToolFinished
from agent_fsm.messages import AssistantMessage, Message, ToolMessage, Usage, UserMessage
from agent_fsm.state import RunState
from agent_fsm.table import TERMINAL_STATES, AgentState, Row, StopReason

__all__ = ["TraceRuns"]


class TraceRuns:
    """The runs recorded in one trace file, read against the table ``rows``."""

    def __init__(self, path: str | Path, rows: Sequence[Row]) -> None:
        self.path = Path(path)
        self.rows = tuple(rows)
        self._index = {
            (r.trigger, r.source, r.dest, r.guards, r.label): i for i, r in enumerate(rows)
        }

    def _runs(self) -> list[RecordedRun]:
        try:
            return recorded_runs(read_trace(self.path))
        except TraceFileError as exc:
            if "no events" in str(exc):
                return []
            raise

    def _row_of(self, run: RecordedRun) -> list[tuple[int, int]]:
        found = []
        for entry in run.trace:
            key = (entry.trigger, entry.source, entry.dest, tuple(entry.guards), entry.label)
            index = self._index.get(key)
            if index is None:
                raise CheckpointError(
                    f"run {run.run_id} of {self.path} took a transition no row of this table "
                    f"has ({entry.source} → {entry.dest}, {entry.label}): give the ui its agent"
                )
            found.append((index, entry.turn))
        return found

    def list_runs(
        self,
        limit: int | None = None,
        *,
        states: str | Iterable[str] | None = None,
        stop_reasons: StopReason | str | Iterable[StopReason | str | None] | None = None,
    ) -> list[RunSummary]:
        """The recorded runs, the last recorded first (a trace's order of appearance)."""
        chosen = None if states is None else {states} if isinstance(states, str) else set(states)
        stops = stop_names(stop_reasons)
        summaries = []
        for run in reversed(self._runs()):
            state = run.final_state or AgentState.OBSERVE
            if chosen is not None and str(state) not in chosen:
                continue
            try:
                trace = self._row_of(run)
                unreadable = None
            except CheckpointError as exc:
                trace, unreadable = [], str(exc)
            usage = run.usage or _total(run)
            finished = run.finished
            summary = RunSummary(
                run_id=run.run_id,
                state=state,
                turns=run.turns,
                total_tokens=usage.total_tokens,
                messages=len(_messages(run)),
                last_row=trace[-1][0] if trace else None,
                created_at=0.0,
                updated_at=0.0,
                output=finished.output if finished is not None else None,
                error=finished.error if finished is not None else None,
                stop_reason=finished.stop_reason
                if finished is not None and state in TERMINAL_STATES
                else None,
                cost=finished.cost if finished is not None else None,
                unreadable=unreadable,
            )
            if stops is None or stop_kept(summary, stops):
                summaries.append(summary)
        return summaries if limit is None else summaries[: max(limit, 0)]

    def load(self, run_id: str) -> RunState:
        """The run ``run_id`` rebuilt from its events.

        Raises:
            CheckpointError: no such run in the file, or one made with another table.
        """
        run = self._find(run_id)
        finished = run.finished
        state = run.final_state or AgentState.OBSERVE
        return RunState(
            run_id=run.run_id,
            state=state,
            messages=_messages(run),
            turns=run.turns,
            usage=run.usage or _total(run),
            trace=self._row_of(run),
            output=finished.output if finished is not None else None,
            error=finished.error if finished is not None else None,
            stop_reason=run.stop_reason if state in TERMINAL_STATES else None,
        )

    def usage_by_turn(self, run_id: str) -> dict[int, Usage]:
        """The usage of the run's model calls up to and including each turn."""
        total, found = Usage(), {0: Usage()}
        for event in self._find(run_id).events:
            if isinstance(event, ModelResponded):
                total = total + event.usage
                found[event.turn] = total
        return found

    def _find(self, run_id: str) -> RecordedRun:
        for run in self._runs():
            if run.run_id == run_id:
                return run
        raise CheckpointError(f"no run {run_id!r} in {self.path}")

    def close(self) -> None:
        """Nothing to release: the file is read per call."""


def _messages(run: RecordedRun) -> list[Message]:
    messages: list[Message] = []
    if run.input is not None:
        messages.append(UserMessage(content=run.input))
    for event in run.events:
        if isinstance(event, ModelResponded):
            messages.append(
                AssistantMessage(content=event.text, tool_calls=event.tool_calls, usage=event.usage)
            )
        elif isinstance(event, ToolFinished):
            messages.append(
                ToolMessage(
                    tool_call_id=event.call_id,
                    name=event.name,
                    content=event.output,
                    status=event.status,
                )
            )
    return messages


def _total(run: RecordedRun) -> Usage:
    total = Usage()
    for event in run.events:
        if isinstance(event, ModelResponded):
            total = total + event.usage
    return total
