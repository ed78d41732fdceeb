"""What a tool's return value becomes: the text the model sees, the details people see, and
the answers for calls that failed or never ran.

``output`` goes to the model; ``details`` go to events and people only (``ToolMessage.details``).
Facts the runtime adds (attempts, retries, truncation, an abandoned thread, a journal replay)
sit under the ``"runtime"`` key of ``details``, so they never collide with the tool's own.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import json
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue

from agent_fsm.content import ContentPart, FilePart, ImagePart, PartSupport, TextPart, encoded_size
from agent_fsm.messages import ToolCall, ToolMessage, ToolStatus, clean_message

__all__ = [
    "NOT_RERUN",
    "outcome_unknown",
    "outcome_unknown_answer",
    "ToolResult",
    "error_result",
    "merge_runtime_details",
    "PART_CARRIERS",
    "serialise_output",
    "split_parts",
    "skipped_result",
    "fit_turn",
    "readable_parts",
    "truncate",
]


class ToolResult(BaseModel):
    """What a tool may return to say more than its output.

    ``ToolResult("3 files deleted", details={"deleted": [...]})``: the model reads ``output``;
    ``details`` reach events and the transcript's ``ToolMessage.details`` but never the model;
    ``is_error=True`` answers the call as failed (the model should correct itself) without
    raising.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    output: str
    """The text the model sees."""
    details: JsonValue = None
    """Structured data for people and events only; must be JSON-able."""
    is_error: bool = False
    """Answer the call as an error the model should correct."""
    parts: tuple[ContentPart, ...] = ()
    """Images and files for the model after ``output`` (``ToolMessage.parts``)."""

    def __init__(
        self,
        output: str,
        details: JsonValue = None,
        is_error: bool = False,
        parts: Sequence[ContentPart] = (),
    ) -> None:
        super().__init__(output=output, details=details, is_error=is_error, parts=tuple(parts))


_MEDIA = (ImagePart, FilePart)
PART_CARRIERS = (ImagePart, FilePart, list, tuple)
"""The types of return value that may carry images or files (``split_parts``): one
``isinstance`` keeps every other return off that path."""


def split_parts(value: Any) -> tuple[str, tuple[ContentPart, ...]] | None:
    """A return value with images or files, as the result's text and its parts: an
    ``ImagePart`` or ``FilePart`` alone, or a list or tuple holding at least one, whose
    leading text (a str or ``TextPart``) becomes the text and the rest the parts (a str
    among them a ``TextPart``; any other item its JSON text). None for any other value
    (``serialise_output`` takes it).

    Raises:
        TypeError, ValueError: an item has no JSON form.
    """
    if isinstance(value, _MEDIA):
        return "", (value,)
    if not isinstance(value, list | tuple) or not any(isinstance(item, _MEDIA) for item in value):
        return None
    items = list(value)
    text = ""
    if items and isinstance(items[0], str | TextPart):
        first = items.pop(0)
        text = first if isinstance(first, str) else first.text
    parts: list[ContentPart] = []
    for item in items:
        if isinstance(item, TextPart | ImagePart | FilePart):
            parts.append(item)
        else:
            parts.append(TextPart(text=serialise_output(item)))
    return text, tuple(parts)


def _json_default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=False, default=_json_default)
"""Built once: ``json.dumps`` with options builds a new encoder on every call."""


def serialise_output(value: Any) -> str:
    """Text for the model from a tool's return value: str as is, everything else as JSON.

    pydantic models, dataclasses, dates and enums inside the value are converted; NaN and
    infinities are refused (they are not JSON).

    Raises:
        TypeError, ValueError: when the value has no JSON form.
    """
    kind = type(value)
    if kind is str:
        return value  # type: ignore[no-any-return]
    if kind is int:  # the commonest returns skip the encoder: same text as json.dumps
        return str(value)
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return _ENCODER.encode(value)


def merge_runtime_details(details: JsonValue, runtime: dict[str, JsonValue]) -> JsonValue:
    """``details`` with the runtime's facts under ``"runtime"``; a non-dict value of the
    tool's own moves under ``"value"``."""
    if not runtime:
        return details
    if details is None:
        return {"runtime": runtime}
    if isinstance(details, dict):
        previous = details.get("runtime")
        merged = {**previous, **runtime} if isinstance(previous, dict) else runtime
        return {**details, "runtime": merged}
    return {"value": details, "runtime": runtime}


def truncate(text: str, keep: int, name: str, original_chars: int | None = None) -> str:
    """The first ``keep`` characters of ``text`` plus a marker telling the model how much was
    cut and how to ask for less; ``text`` unchanged when it fits.

    Args:
        original_chars: the size of the output ``text`` was taken from, when ``text`` is
            itself already cut (its first ``keep`` characters must be the original's).
    """
    if len(text) <= keep:
        return text
    total = len(text) if original_chars is None else original_chars
    return (
        f"{text[:keep]}\n[output truncated: {total - keep:,} of {total:,} characters were cut. "
        f"Call '{name}' again asking for less (a narrower query, a smaller range, fewer items "
        "or a page) to see the rest.]"
    )


def error_result(call: ToolCall, message: str, details: JsonValue = None) -> ToolMessage:
    """An error answer to ``call`` that the model can correct from."""
    return clean_message(ToolMessage(
        tool_call_id=call.id, name=call.name, content=message, status=ToolStatus.ERROR,
        details=details,
    ))  # fmt: skip


def outcome_unknown(call: ToolCall, why: str | None = None) -> ToolMessage:
    """The answer to a call that may have run, and whose outcome cannot be known: it started
    before an interruption and its tool is not idempotent (so it is not run again), or the
    journal that would say could not be read (``why``). Never "not run" and never "failed":
    a model told either may send the call again, and the effect happen twice."""
    because = (
        f"the journal that records it could not be read ({why})"
        if why is not None
        else f"it started before an interruption and {NOT_RERUN}"
    )
    return outcome_unknown_answer(call, because)


NOT_RERUN = "is not re-run because the tool is not idempotent"
"""Why a call whose outcome is unknown is not made again (``outcome_unknown``)."""


def outcome_unknown_answer(call: ToolCall, because: str) -> ToolMessage:
    """The "outcome unknown" answer, ``because`` saying what is known: the one wording of
    the engine's journal (``outcome_unknown``) and of a DBOS run's
    (``agent_fsm.dbos.answers``), flagged ``runtime.outcome_unknown``."""
    return error_result(
        call,
        f"The outcome of this call to '{call.name}' is unknown: {because}. Check its effect "
        "before calling it again.",
        {"runtime": {"outcome_unknown": True}},
    )


def skipped_result(call: ToolCall, reason: str) -> ToolMessage:
    """An answer to a call that was never run, so the transcript stays valid."""
    return ToolMessage(
        tool_call_id=call.id, name=call.name, content=f"Skipped: {reason}",
        status=ToolStatus.SKIPPED,
    )  # fmt: skip


def _fair_shares(sizes: Sequence[int], budget: int) -> list[int]:
    """Characters each output may keep so that together they fit ``budget``: outputs below
    an equal share keep everything, and what they leave is shared among the longer ones."""
    shares = list(sizes)
    left, count = budget, len(sizes)
    for index in sorted(range(len(sizes)), key=sizes.__getitem__):
        share = left // count
        if sizes[index] > share:
            shares[index] = share
        left -= shares[index]
        count -= 1
    return shares


def _runtime_int(result: ToolMessage, key: str) -> int:
    """``details["runtime"][key]`` when it is an int, else the output's own length."""
    runtime = result.details.get("runtime") if isinstance(result.details, dict) else None
    value = runtime.get(key) if isinstance(runtime, dict) else None
    return value if isinstance(value, int) else len(result.content)


def fit_turn(results: list[ToolMessage], budget: int) -> None:
    """Cut the longest outputs of one turn, in place, until together they fit ``budget``
    characters (``Limits.turn_max_output_chars``), each keeping a fair share."""
    if sum([len(r.content) for r in results]) <= budget:
        return
    # An output the tool's own limit already cut counts at the size it was cut to.
    sizes = [_runtime_int(r, "shown_chars") for r in results]
    originals = [_runtime_int(r, "original_chars") for r in results]
    for index, share in enumerate(_fair_shares(sizes, budget)):
        if share >= sizes[index]:
            continue
        result = results[index]
        runtime_update: dict[str, JsonValue] = {
            "original_chars": originals[index],
            "shown_chars": share,
            "cut_by_turn_limit": True,
        }
        results[index] = result.model_copy(
            update={
                "content": truncate(result.content, share, result.name, originals[index]),
                "details": merge_runtime_details(result.details, runtime_update),
            }
        )


def readable_parts(results: list[ToolMessage], support: PartSupport) -> None:
    """Replace, in place, each image or file of a turn's results that the model's provider
    cannot take (``PartSupport.problem``: its media type, a URL it does not fetch, its size)
    with a note in the result's text saying what it was and why the model cannot see it,
    and ``details["runtime"]["unreadable_parts"]`` for people. Sent as it is, the request
    would fail before it left (a permanent model error), and so would every request after
    it, a resume's included: the run could never go on with this model. Told instead, the
    model can do without it or ask for another form."""
    for index, result in enumerate(results):
        if not result.parts:
            continue
        kept: list[ContentPart] = []
        notes: list[str] = []
        unreadable: list[JsonValue] = []
        for part in result.parts:
            why = support.problem(part)
            if why is None or isinstance(part, TextPart):
                kept.append(part)
                continue
            kind = "an image" if isinstance(part, ImagePart) else "a file"
            what = part.url or f"{part.media_type}, {encoded_size(part):,} bytes"
            notes.append(f"[The tool returned {kind} ({what}) that cannot be shown: {why}.]")
            unreadable.append({"kind": kind[kind.index(" ") + 1 :], "why": why})
        if notes:
            runtime: dict[str, JsonValue] = {"unreadable_parts": unreadable}
            results[index] = result.model_copy(
                update={
                    "content": "\n".join([result.content, *notes]).strip(),
                    "parts": tuple(kept),
                    "details": merge_runtime_details(result.details, runtime),
                }
            )
