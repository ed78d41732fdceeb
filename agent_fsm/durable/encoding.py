"""How a checkpoint is encoded: the pieces every store writes, and how they are read back.

A checkpoint of a ``RunState`` is three parts:

- the *header*: every field of RunState except ``messages`` and ``trace``, as one JSON object
  written by ``RUN_STATE_ADAPTER`` (so fields added to RunState are stored with no change
  here), together with the ``CHECKPOINT_SCHEMA_VERSION`` that wrote it (``encode_header``);
- the transcript, one message per index (``MESSAGE_ADAPTER`` encodes one);
- the trace, one ``(row, turn)`` pair per index.

``messages`` and ``trace`` are append-only, so a store writes only the entries beyond those
it already holds (``durable.checkpoint`` states the rules every store keeps).

A header written by an older schema version is upgraded through ``MIGRATIONS`` (version n to
n + 1, over the decoded JSON object) or refused; one written by a newer agent_fsm is refused
(``decode_header``). A store of your own calls these two functions, storing the version
``encode_header`` returns beside the header: that is how it reads checkpoints written by
other versions of agent_fsm, as the store contract checks
(``agent_fsm.testing.CheckpointStoreContract``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import TypeAdapter, ValidationError

from agent_fsm.errors import CheckpointError
from agent_fsm.messages import Message
from agent_fsm.state import RUN_STATE_ADAPTER, RunState
from agent_fsm.table import AgentState

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "MESSAGE_ADAPTER",
    "MIGRATIONS",
    "Migration",
    "RunSummary",
    "decode_header",
    "encode_header",
    "summarize",
    "unknown_run",
]

CHECKPOINT_SCHEMA_VERSION: int = 3
"""The version of the checkpoint encoding this code writes. Raise it, and register a
migration from the previous version, whenever a change to RunState would make an older
header decode differently (a renamed field, a new required field, a changed meaning)."""

Migration = Callable[[dict[str, Any]], dict[str, Any]]
"""Upgrades a decoded header from version n to n + 1 (it may mutate and return its input)."""


def _decisions_with_their_calls(header: dict[str, Any]) -> dict[str, Any]:
    """Version 1 to 2: approval decisions (``approvals``, by call id) become ``decisions``
    that carry their calls, taken from the pending request. The stop reason is new in
    version 2 and absent here: a reopened run derives it from its trace."""
    if "approvals" not in header:
        return header
    approvals = header.pop("approvals") or {}
    control = header.get("control") or {}
    calls = {call.get("id"): call for call in control.get("pending_calls") or ()}
    header["decisions"] = [
        {"call": calls[call_id], "approval": approval}
        for call_id, approval in approvals.items()
        if call_id in calls
    ]
    return header


def _call_streaks_per_turn(header: dict[str, Any]) -> dict[str, Any]:
    """Version 2 to 3: loop detection counts repeats across turns, not calls within one reply:
    the one run of repeats it kept (``last_call``, ``call_repeats``) becomes a streak. The
    ring of recent signatures is kept: a turn of one call has the same signature as that
    call."""
    loop = header.get("loop")
    if not isinstance(loop, dict):
        return header
    last_call, repeats = loop.pop("last_call", None), loop.pop("call_repeats", 0)
    loop["call_streaks"] = {last_call: repeats} if last_call else {}
    return header


MIGRATIONS: dict[int, Migration] = {1: _decisions_with_their_calls, 2: _call_streaks_per_turn}
"""``MIGRATIONS[n]`` upgrades a header of version n to n + 1."""

MESSAGE_ADAPTER: TypeAdapter[Message] = TypeAdapter(Message)
"""Encodes and decodes one transcript message."""

_HEADER_EXCLUDE = {"messages", "trace"}
"""RunState's append-only lists: stored entry by entry, not in the header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """One stored run, as ``agent-fsm runs`` lists it."""

    run_id: str
    state: AgentState | str
    """The state the run was in at its last save (a name, for a custom state)."""
    turns: int
    """Model calls made, retries included."""
    total_tokens: int
    """Input plus output tokens used."""
    messages: int
    """Transcript length."""
    last_row: int | None
    """Index into the machine table of the last transition; None before the first."""
    created_at: float
    """Unix time of the first save."""
    updated_at: float
    """Unix time of the last save."""
    output: str | None
    error: str | None


def summarize(state: RunState, *, created_at: float, updated_at: float) -> RunSummary:
    """The summary line of ``state``."""
    return RunSummary(
        run_id=state.run_id,
        state=state.state,
        turns=state.turns,
        total_tokens=state.usage.total_tokens,
        messages=len(state.messages),
        last_row=state.trace[-1][0] if state.trace else None,
        created_at=created_at,
        updated_at=updated_at,
        output=state.output,
        error=state.error,
    )


def encode_header(state: RunState) -> tuple[int, bytes]:
    """The schema version and JSON header of ``state`` (everything but messages and trace).

    Store the version with the header: ``decode_header`` needs it back."""
    return CHECKPOINT_SCHEMA_VERSION, RUN_STATE_ADAPTER.dump_json(state, exclude=_HEADER_EXCLUDE)


def decode_header(run_id: str, version: int, header: str | bytes) -> RunState:
    """Decode a header written by schema ``version``, migrating it if it is older.

    Returns a RunState with empty ``messages`` and ``trace`` for the caller to fill.

    Raises:
        CheckpointError: the version is newer than this code, older with no migration path,
            or the header is not valid JSON for a RunState of ``run_id``.
    """
    current = CHECKPOINT_SCHEMA_VERSION
    if version > current:
        raise CheckpointError(
            f"checkpoint of run {run_id!r} was written by a newer agent_fsm (checkpoint schema "
            f"version {version}; this version reads {current} and older): upgrade agent_fsm"
        )
    try:
        if version < current:
            header = json.dumps(_migrate(run_id, version, json.loads(header)))
        state = RUN_STATE_ADAPTER.validate_json(header)
    except (ValueError, TypeError, KeyError) as exc:  # ValidationError is a ValueError
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise CheckpointError(f"checkpoint of run {run_id!r} is unreadable: {detail}") from exc
    if state.run_id != run_id:
        raise CheckpointError(
            f"checkpoint of run {run_id!r} is unreadable: its header is for run {state.run_id!r}"
        )
    return state


def _migrate(run_id: str, version: int, decoded: Any) -> dict[str, Any]:
    """Apply ``MIGRATIONS`` from ``version`` up to the current version."""
    if not isinstance(decoded, dict):
        raise CheckpointError(f"checkpoint of run {run_id!r} is unreadable: not a JSON object")
    header: dict[str, Any] = decoded
    for step in range(version, CHECKPOINT_SCHEMA_VERSION):
        migration = MIGRATIONS.get(step)
        if migration is None:
            raise CheckpointError(
                f"checkpoint of run {run_id!r} has schema version {version}, this agent_fsm "
                f"reads version {CHECKPOINT_SCHEMA_VERSION}, and there is no migration from "
                f"version {step} to {step + 1}: resume it with an older agent_fsm"
            )
        header = migration(header)
    return header


def unknown_run(run_id: str) -> CheckpointError:
    """The error for a run id with no checkpoint (``load`` of a run never saved)."""
    return CheckpointError(f"no checkpoint for run {run_id!r}")
