"""Structured trace files: a run's events as JSON Lines, and the run rebuilt from them.

One event per line, serialised with ``events.EVENT_ADAPTER`` (so a line is exactly what a
subscriber received, ``kind`` first). ``TraceWriter`` records; ``read_trace`` parses;
``recorded_runs`` / ``read_run`` rebuild what a diagram overlay or a replay needs: the
transitions taken (``TraceEntry``), the final state and the stop reason. Nothing else is
stored twice: the transitions come from ``StateChanged`` and the outcome from ``RunFinished``.

A file may hold several runs (a writer subscribed to an agent records every run it makes);
events are grouped by ``run_id``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pydantic import ValidationError

from agent_fsm.errors import TraceFileError
from agent_fsm.events import (
    EVENT_ADAPTER,
    Event,
    MessageUpdated,
    RunFinished,
    RunStarted,
    StateChanged,
)
from agent_fsm.messages import Usage
from agent_fsm.state import RunStatus, TraceEntry
from agent_fsm.table import AgentState, StopReason, state_named, trigger_named

__all__ = [
    "RecordedRun",
    "TraceFileError",
    "TraceWriter",
    "read_run",
    "read_trace",
    "recorded_runs",
    "select_run",
]

StrPath = str | os.PathLike[str]


class TraceWriter:
    """An event handler that appends every event to a JSON Lines file.

    ``agent.subscribe(TraceWriter("run.jsonl"))`` records every later run of the agent;
    ``run.subscribe(...)`` records one run. The file is truncated when the writer is created
    (``append=True`` keeps what is there), so a bad path fails here, not mid-run. Each line
    is flushed as it is written, so a crashed process leaves a readable prefix; the file is
    closed after each ``RunFinished`` and reopened by the next event. ``close()`` (or a
    ``with`` block) closes it early.

    Args:
        path: the file to write.
        append: keep the file's existing lines.
        include_deltas: also record ``MessageUpdated`` streaming fragments (off by default:
            ``ModelResponded`` already holds each full reply, and fragments dominate the size).
    """

    def __init__(
        self, path: StrPath, *, append: bool = False, include_deltas: bool = False
    ) -> None:
        self.path = Path(path)
        self.include_deltas = include_deltas
        self._file: IO[bytes] | None = None
        with self.path.open("ab" if append else "wb"):
            pass

    def __call__(self, event: Event) -> None:
        if isinstance(event, MessageUpdated) and not self.include_deltas:
            return
        if self._file is None:
            self._file = self.path.open("ab")
        self._file.write(EVENT_ADAPTER.dump_json(event) + b"\n")
        self._file.flush()
        if isinstance(event, RunFinished):
            self.close()

    def close(self) -> None:
        """Close the file (the next event reopens it, appending)."""
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _describe(error: ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    more = f" (and {error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where + ': ' if where else ''}{first['msg']}{more}"


def read_trace(path: StrPath) -> list[Event]:
    """Every event in a JSON Lines trace file, in order; blank lines are skipped.

    Raises:
        TraceFileError: naming the line that is not valid JSON or not an agent_fsm event.
        OSError: when the file cannot be opened.
    """
    events: list[Event] = []
    with Path(path).open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                events.append(EVENT_ADAPTER.validate_json(line))
            except ValidationError as exc:
                raise TraceFileError(
                    f"{path}:{number}: not an agent_fsm event: {_describe(exc)}"
                ) from None
    return events


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedRun:
    """One run rebuilt from its events: what an overlay or a replay needs.

    It has the ``run_id``, ``trace``, ``final_state``, ``stop_reason`` and ``turns`` of a
    ``RunResult``, so ``render(..., run=recorded)`` accepts either. A run whose file ends
    before ``RunFinished`` (the process died) has ``finished`` None; its final state is the
    last state reached and its stop reason None.
    """

    run_id: str
    input: str | None
    """The user message that started the run, when ``RunStarted`` was recorded."""
    trace: tuple[TraceEntry, ...]
    """Every transition, rebuilt from the ``StateChanged`` events."""
    finished: RunFinished | None
    events: tuple[Event, ...]
    """All of this run's events, in order."""

    @property
    def final_state(self) -> AgentState | str | None:
        if self.finished is not None:
            return self.finished.final_state
        return self.trace[-1].dest if self.trace else None

    @property
    def stop_reason(self) -> StopReason | None:
        return self.finished.stop_reason if self.finished is not None else None

    @property
    def status(self) -> RunStatus | None:
        return self.finished.status if self.finished is not None else None

    @property
    def turns(self) -> int:
        if self.finished is not None:
            return self.finished.turns
        return self.trace[-1].turn if self.trace else 0

    @property
    def usage(self) -> Usage | None:
        return self.finished.usage if self.finished is not None else None

    @property
    def output(self) -> str | None:
        return self.finished.output if self.finished is not None else None


def _entry(event: StateChanged) -> TraceEntry:
    return TraceEntry(
        trigger=trigger_named(event.trigger),
        source=state_named(event.source),
        dest=state_named(event.dest),
        guards=event.guards,
        label=event.label,
        turn=event.turn,
    )


def recorded_runs(events: Iterable[Event]) -> list[RecordedRun]:
    """The runs in ``events``, grouped by run id, in order of first appearance (a trigger or
    state that is not the default loop's is a custom state's, kept by name)."""
    grouped: dict[str, list[Event]] = {}
    for event in events:
        grouped.setdefault(event.run_id, []).append(event)
    runs = []
    for run_id, own in grouped.items():
        trace: list[TraceEntry] = []
        for event in own:
            if isinstance(event, StateChanged):
                trace.append(_entry(event))
        started = next((e for e in own if isinstance(e, RunStarted)), None)
        finished = next((e for e in reversed(own) if isinstance(e, RunFinished)), None)
        runs.append(
            RecordedRun(
                run_id=run_id,
                input=started.input if started is not None else None,
                trace=tuple(trace),
                finished=finished,
                events=tuple(own),
            )
        )
    return runs


def select_run(
    runs: Sequence[RecordedRun], run_id: str | None, source: str, option: str = "run_id=ID"
) -> RecordedRun:
    """The run named ``run_id``, or the only run when ``run_id`` is None.

    Args:
        option: how the caller names a run, for the error (the CLI says ``--run-id ID``).

    Raises:
        TraceFileError: when there is no such run, no run at all, or several and no id.
    """
    if run_id is not None:
        for run in runs:
            if run.run_id == run_id:
                return run
        known = ", ".join(run.run_id for run in runs) or "none"
        raise TraceFileError(f"{source}: no run {run_id!r} (runs: {known})")
    if not runs:
        raise TraceFileError(f"{source}: no events")
    if len(runs) > 1:
        known = ", ".join(run.run_id for run in runs)
        raise TraceFileError(f"{source}: holds {len(runs)} runs ({known}); pick one with {option}")
    return runs[0]


def read_run(path: StrPath, run_id: str | None = None) -> RecordedRun:
    """The one run recorded in ``path`` (or the run ``run_id`` of several).

    Raises:
        TraceFileError: for a bad line (named), an empty file, an unknown run id, or a file
            with several runs and no ``run_id``.
    """
    return select_run(recorded_runs(read_trace(path)), run_id, str(path))
