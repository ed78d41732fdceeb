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

Hostile input gets the same answer from every store, because every store goes through here:

- ids (``durable.leases.check_id``): a run id or worker id that some store could not keep (a lone
  surrogate, which UTF-8 cannot encode; a NUL, which PostgreSQL's text refuses; more bytes
  than PostgreSQL indexes) is refused with ``ConfigError`` before a store touches its storage;
- text (``encode_header``, ``encode_message``): a lone surrogate in the user's ``notes`` (or
  in any other text of the run) is saved as U+FFFD, as the transcript's text is cleaned where
  it enters the run (``messages.clean_text``): a run does not stop over one unencodable
  character. A note that is not a JSON value at all is the developer's mistake:
  ``CheckpointError`` naming it, never a serializer's own error;
- corrupt checkpoints (``decode_header``): a schema version that is not an integer, or a
  header that does not fit its version (fields of the wrong JSON type, which a migration
  trips over), raise ``CheckpointError`` naming the run, whatever the migration raised;
  ``list_runs`` lists a run it cannot read with ``RunSummary.unreadable`` saying why
  (``schema_problem``, ``read_summary``, ``checkpoint.listed``), and the others as usual.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError

from agent_fsm.errors import CheckpointError
from agent_fsm.messages import Message, clean_text
from agent_fsm.state import RUN_STATE_ADAPTER, RunState
from agent_fsm.table import TERMINAL_STATES, AgentState, StopReason, state_named

__all__ = [
    "CHECKPOINT_SCHEMA_VERSION",
    "HEADER_EXCLUDE",
    "MESSAGE_ADAPTER",
    "MIGRATIONS",
    "Migration",
    "RunSummary",
    "STORED_SUMMARY",
    "UNRECORDED_STOP",
    "decode_entries",
    "decode_header",
    "encode_header",
    "encode_message",
    "encode_model",
    "read_summary",
    "schema_problem",
    "stop_column",
    "stop_value",
    "summarize",
    "summary_columns",
    "SummaryColumns",
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

HEADER_EXCLUDE = {"messages", "trace"}
"""RunState's append-only lists: stored entry by entry, not in the header (a set: pydantic-core
takes a frozenset for ``exclude`` at twice the cost)."""

# The encoders call pydantic-core's serializers directly: ``TypeAdapter.dump_json`` and
# ``BaseModel.model_dump_json`` give the same JSON through a Python layer of keyword
# arguments that costs a third of a small message's encoding, paid on every save.
_HEADER_SERIALIZER = RUN_STATE_ADAPTER.serializer
_MESSAGE_SERIALIZER = MESSAGE_ADAPTER.serializer

_ANY: TypeAdapter[Any] = TypeAdapter(Any)
_T = TypeVar("_T")
_Model = TypeVar("_Model", bound=BaseModel)

STORED_SUMMARY = (
    "run_id",
    "state",
    "turns",
    "total_tokens",
    "messages",
    "last_row",
    "created_at",
    "updated_at",
    "output",
    "error",
    "stop_reason",
    "cost",
)
"""The fields of a ``RunSummary`` a store keeps for each run (``summarize``'s), in order: a
store that keeps them in columns reads them back with ``read_summary``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSummary:
    """One stored run, as ``list_runs`` gives it and ``agent-fsm runs`` lists it."""

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
    stop_reason: StopReason | None = None
    """Why the run stopped, as it recorded it (``RunState.stop_reason``), while its last save
    is in DONE or ERROR; None for a run still going, and for a stopped run whose checkpoint
    predates recorded stop reasons (its last row's label says it: ``last_row``). A store
    keeps it as ``stop_column`` gives it."""
    cost: float | None = None
    """What its model calls cost so far (``RunState.cost``); None while none was priced."""
    lease_holder: str | None = None
    """The worker id on the run's lease: its holder, or its last one once the lease expired
    or was released; None for a run never leased."""
    lease_expires_at: float | None = None
    """When that lease runs (or ran) out, unix time by the store's clock (``PostgresStore``:
    the server's); 0.0 once released."""
    lease_live: bool = False
    """The lease is live by the store's clock: ``lease_holder`` drives the run now."""
    stuck: bool = False
    """The run has not stopped (it is neither DONE nor ERROR) and its lease is not live: its
    worker died or gave it up mid-run, so nobody drives it until a worker resumes it
    (``Agent.resume`` takes it over from its last checkpoint)."""
    priority: int = 0
    """The priority the run was queued with (``durable.queue.RunQueue.enqueue``): workers
    take runnable runs highest first; 0 for a run created otherwise."""
    cancel_requested: str | None = None
    """Why the run was cancelled, while the request waits for its driver (or whoever takes
    the run next) to stop it (``durable.queue.RunCancels.cancel``); None otherwise."""
    unreadable: str | None = None
    """Why this agent_fsm cannot read the run (a schema version it does not read, a summary
    no store writes), or None. ``list_runs`` lists such a run with the fields it could read
    (the others zero or None), so that one corrupt run hides no other; ``load`` raises
    ``CheckpointError`` for it."""


def summarize(state: RunState, *, created_at: float, updated_at: float) -> RunSummary:
    """The summary line of ``state`` (its texts with any NUL, which PostgreSQL's text columns
    refuse, or lone surrogate made U+FFFD, so that every store lists the same line)."""
    name, turns, total_tokens, last_row, output, error, stop_reason, cost = summary_columns(state)
    return RunSummary(
        run_id=state.run_id,
        state=name,
        turns=turns,
        total_tokens=total_tokens,
        messages=len(state.messages),
        last_row=last_row,
        created_at=created_at,
        updated_at=updated_at,
        output=output,
        error=error,
        stop_reason=stop_reason,
        cost=cost,
    )


SummaryColumns = tuple[
    AgentState | str, int, int, int | None, str | None, str | None, StopReason | None, float | None
]
"""``summary_columns``: state, turns, total_tokens, last_row, output, error, stop_reason,
cost."""


def summary_columns(state: RunState) -> SummaryColumns:
    """The fields of ``summarize``'s line that come from ``state`` alone, for a store that
    writes them as columns on every save without making a ``RunSummary`` (a frozen dataclass
    of many fields: its construction costs as much as a statement)."""
    return (
        state.state,
        state.turns,
        state.usage.total_tokens,
        state.trace[-1][0] if state.trace else None,
        _column_text(state.output),
        _column_text(state.error),
        # a run going on holds none (``Lifetime.STOP``): most saves skip the state test
        (
            state.stop_reason
            if state.stop_reason is not None and state.state in TERMINAL_STATES
            else None
        ),
        state.cost,
    )


UNRECORDED_STOP = ""
"""``stop_column`` of a stopped run that recorded no reason."""


def stop_column(summary: RunSummary) -> str | None:
    """The stop reason of ``summary`` as a store keeps it in a column: None for a run that
    has not stopped (so an index of the stopped runs' reasons skips its saves),
    ``UNRECORDED_STOP`` for a stopped one that recorded none, else the reason's value.
    ``read_summary`` reads the first two back as None."""
    return stop_value(summary.stop_reason, stopped=summary.state in TERMINAL_STATES)


def stop_value(reason: StopReason | None, *, stopped: bool) -> str | None:
    """``stop_column`` from a summary's ``reason`` and whether its run ``stopped``, for a
    store that knows the latter already (one test of the state per save)."""
    if reason is not None:
        return reason.value
    return UNRECORDED_STOP if stopped else None


def _column_text(text: str | None) -> str | None:
    if text is None or (text.isascii() and "\x00" not in text):
        return text
    return clean_text(text).replace("\x00", "\ufffd")


# -- writing ----------------------------------------------------------------------------------


def encode_header(state: RunState) -> tuple[int, bytes]:
    """The schema version and JSON header of ``state`` (everything but messages and trace).

    Store the version with the header: ``decode_header`` needs it back. A lone surrogate in
    the header's text (the user's ``notes``) is written as U+FFFD, on the slow path only.

    Raises:
        CheckpointError: a note is not a JSON value, naming it.
    """
    try:
        header = _HEADER_SERIALIZER.to_json(state, exclude=HEADER_EXCLUDE)
    except PydanticSerializationError as exc:
        try:
            header = RUN_STATE_ADAPTER.dump_json(
                _cleaned(RUN_STATE_ADAPTER, state, exclude=HEADER_EXCLUDE),
                exclude=HEADER_EXCLUDE,
            )
        except (PydanticSerializationError, ValueError, RecursionError):
            raise _not_json(state, exc) from exc
    return CHECKPOINT_SCHEMA_VERSION, header


def encode_message(message: Message) -> str:
    """One transcript message as JSON text (``MESSAGE_ADAPTER``'s), for a store that keeps
    messages as text. The engine cleans the transcript's text where it enters the run; one
    that still holds a lone surrogate is written with U+FFFD, not refused with a serializer's
    error."""
    try:
        return _MESSAGE_SERIALIZER.to_json(message).decode()
    except PydanticSerializationError:
        return MESSAGE_ADAPTER.dump_json(_cleaned(MESSAGE_ADAPTER, message)).decode()


def encode_model(model: _Model) -> str:
    """``encode_message`` for any model (a journal's call or result)."""
    try:
        return model.__pydantic_serializer__.to_json(model).decode()
    except PydanticSerializationError:
        return _cleaned(TypeAdapter(type(model)), model).model_dump_json()


def _cleaned(adapter: TypeAdapter[_T], value: _T, **dump: Any) -> _T:
    """``value`` made again with every str in it (dict keys included) cleaned by
    ``clean_text``: dumped to Python, cleaned, validated back. The slow path of the encoders,
    taken only for a value that holds a lone surrogate."""
    return adapter.validate_python(_clean_all(adapter.dump_python(value, **dump)))


def _clean_all(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {_clean_all(key): _clean_all(item) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return type(value)(_clean_all(item) for item in value)
    return value


def _not_json(state: RunState, exc: Exception) -> CheckpointError:
    """The error for a state whose header cannot be JSON: the first note that is not."""
    for key, value in state.notes.items():
        try:
            _ANY.dump_json(_clean_all(value))
        except (PydanticSerializationError, ValueError, RecursionError):
            return CheckpointError(
                f"run {state.run_id!r} cannot be saved: notes[{key!r}] is not a JSON value"
                f" ({type(value).__name__}): notes keep str, int, float, bool, None and lists"
                " and dicts of them, which every store can write and read back"
            )
    return CheckpointError(f"run {state.run_id!r} cannot be saved: {exc}")


# -- reading ----------------------------------------------------------------------------------


def schema_problem(version: object) -> str | None:
    """Why a checkpoint written by schema ``version`` cannot be read by this agent_fsm, as
    the end of a sentence about the run ("checkpoint of run 'r' ..."), or None when it can:
    ``decode_header`` raises it, ``list_runs`` shows it (``RunSummary.unreadable``)."""
    current = CHECKPOINT_SCHEMA_VERSION
    if isinstance(version, bool) or not isinstance(version, int):
        return (
            f"has schema version {version!r}, which is not an integer: agent_fsm did not write"
            " it, or it was damaged"
        )
    if version > current:
        return (
            f"was written by a newer agent_fsm (checkpoint schema version {version}; this"
            f" version reads {current} and older): upgrade agent_fsm"
        )
    for step in range(version, current):
        if step not in MIGRATIONS:
            return (
                f"has schema version {version}, this agent_fsm reads version {current}, and"
                f" there is no migration from version {step} to {step + 1}: resume it with an"
                " older agent_fsm"
            )
    return None


def decode_header(run_id: str, version: int, header: str | bytes) -> RunState:
    """Decode a header written by schema ``version``, migrating it if it is older.

    Returns a RunState with empty ``messages`` and ``trace`` for the caller to fill.

    Raises:
        CheckpointError: naming the run: the version is not an integer, is newer than this
            code, or older with no migration path; or the header is not valid JSON for a
            RunState of ``run_id`` at that version (a migration that fails on it, whatever
            it raised, says the header does not fit its version).
    """
    problem = schema_problem(version)
    if problem is not None:
        raise CheckpointError(f"checkpoint of run {run_id!r} {problem}")
    try:
        if version < CHECKPOINT_SCHEMA_VERSION:
            header = json.dumps(_migrate(run_id, version, json.loads(header)))
        state = RUN_STATE_ADAPTER.validate_json(header)
    except (ValueError, TypeError, RecursionError) as exc:  # ValidationError is a ValueError
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise CheckpointError(f"checkpoint of run {run_id!r} is unreadable: {detail}") from exc
    if state.run_id != run_id:
        raise CheckpointError(
            f"checkpoint of run {run_id!r} is unreadable: its header is for run {state.run_id!r}"
        )
    return state


def decode_entries(
    run_id: str, texts: Sequence[Any], steps: Sequence[Sequence[Any]]
) -> tuple[list[Message], list[tuple[int, int]]]:
    """The transcript and trace of a checkpoint, from the messages' JSON texts and the
    ``(row, turn)`` pairs a store read (whatever their types: a damaged row is caught here).

    Raises:
        CheckpointError: naming the run: a message or a trace entry is unreadable.
    """
    try:
        messages = [MESSAGE_ADAPTER.validate_json(text) for text in texts]
    except (ValueError, TypeError, RecursionError) as exc:  # ValidationError is a ValueError
        detail = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise CheckpointError(
            f"checkpoint of run {run_id!r} has an unreadable message: {detail}"
        ) from exc
    if not all(len(step) == 2 and all(type(n) is int for n in step) for step in steps):
        raise CheckpointError(f"checkpoint of run {run_id!r} has an unreadable trace entry")
    return messages, [(row, turn) for row, turn in steps]


def _migrate(run_id: str, version: int, decoded: Any) -> dict[str, Any]:
    """Apply ``MIGRATIONS`` from ``version`` up to the current version (``schema_problem``
    found the path)."""
    header: Any = decoded
    for step in range(version, CHECKPOINT_SCHEMA_VERSION):
        if not isinstance(header, dict):
            raise CheckpointError(
                f"checkpoint of run {run_id!r} is unreadable: its header at schema version"
                f" {step} is not a JSON object"
            )
        try:
            header = MIGRATIONS[step](header)
        except Exception as exc:  # a header that does not fit its version: any error at all
            raise CheckpointError(
                f"checkpoint of run {run_id!r} is unreadable: its header does not fit schema"
                f" version {step} (migrating it to {step + 1} failed: {type(exc).__name__}:"
                f" {exc})"
            ) from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"checkpoint of run {run_id!r} is unreadable: not a JSON object")
    return header


def unknown_run(run_id: str) -> CheckpointError:
    """The error for a run id with no checkpoint (``load`` of a run never saved)."""
    return CheckpointError(f"no checkpoint for run {run_id!r}")


def read_summary(values: Sequence[object]) -> RunSummary:
    """The summary a store kept in columns as ``values`` (``encoding.STORED_SUMMARY``'s
    fields, in order). Never raises: a value of the wrong type (a damaged row) is listed as
    zero or None and named in ``RunSummary.unreadable``."""
    read: dict[str, Any] = {}
    bad: list[str] = []
    for name, value in zip(STORED_SUMMARY, values, strict=True):
        fits, fallback = _FIELDS[name]
        read[name] = value if fits(value) else fallback
        if not fits(value):
            bad.append(f"{name} is {value!r}"[:100])
    if not isinstance(values[0], str):
        read["run_id"] = repr(values[0])
    read["state"] = state_named(read["state"])
    if read["stop_reason"] is not None:
        read["stop_reason"] = StopReason(read["stop_reason"]) if read["stop_reason"] else None
    unreadable = f"its summary is unreadable: {', '.join(bad)}" if bad else None
    return RunSummary(**read, unreadable=unreadable)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _is_text(value: object) -> bool:
    return value is None or isinstance(value, str)


def _is_state(value: object) -> bool:
    return isinstance(value, str) and value != ""


def _is_run_id(value: object) -> bool:
    return isinstance(value, str)


def _is_row(value: object) -> bool:
    return value is None or _is_count(value)


_STOP_VALUES = frozenset(reason.value for reason in StopReason)


def _is_stop(value: object) -> bool:
    return value is None or value == UNRECORDED_STOP or value in _STOP_VALUES


def _is_cost(value: object) -> bool:
    return value is None or (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


_FIELDS: dict[str, tuple[Callable[[object], bool], object]] = {
    "run_id": (_is_run_id, ""),
    "state": (_is_state, "?"),
    "turns": (_is_count, 0),
    "total_tokens": (_is_count, 0),
    "messages": (_is_count, 0),
    "last_row": (_is_row, None),
    "created_at": (_is_time, 0.0),
    "updated_at": (_is_time, 0.0),
    "output": (_is_text, None),
    "error": (_is_text, None),
    "stop_reason": (_is_stop, None),
    "cost": (_is_cost, None),
}
"""Per stored summary field: whether a value is one a store writes, and what to list if not."""
