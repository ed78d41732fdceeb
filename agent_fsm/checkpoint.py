"""Placeholder until the checkpoint stores land (branch ``store``): an in-memory store that
keeps each run's latest state as JSON, to build the engine against the protocol."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agent_fsm.errors import CheckpointError
from agent_fsm.journal import MemoryJournal, ToolJournal
from agent_fsm.state import RUN_STATE_ADAPTER, RunState

__all__ = ["CheckpointStore", "MemoryStore"]


@runtime_checkable
class CheckpointStore(Protocol):
    def save(self, state: RunState) -> None: ...
    def load(self, run_id: str) -> RunState: ...
    def exists(self, run_id: str) -> bool: ...
    def delete(self, run_id: str) -> None: ...
    def journal(self, run_id: str) -> ToolJournal: ...
    def close(self) -> None: ...


class MemoryStore:
    def __init__(self) -> None:
        self._states: dict[str, bytes] = {}
        self._journals: dict[str, MemoryJournal] = {}

    def save(self, state: RunState) -> None:
        self._states[state.run_id] = RUN_STATE_ADAPTER.dump_json(state)

    def load(self, run_id: str) -> RunState:
        try:
            return RUN_STATE_ADAPTER.validate_json(self._states[run_id])
        except KeyError:
            raise CheckpointError(f"no checkpoint for run {run_id!r}") from None

    def exists(self, run_id: str) -> bool:
        return run_id in self._states

    def delete(self, run_id: str) -> None:
        self._states.pop(run_id, None)
        self._journals.pop(run_id, None)

    def journal(self, run_id: str) -> ToolJournal:
        return self._journals.setdefault(run_id, MemoryJournal())

    def close(self) -> None:
        pass
