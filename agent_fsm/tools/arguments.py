"""A tool call's arguments, from the model's text to what the tool may be called with, and
every way they can fail worded for the model: text that is not JSON (quoted back, since the
history replays it as ``{}``), a value that is not an object, schema violations (each with
its path), and values that do not convert to the function's types. ``ToolRegistry.prepare``
(``tools.tool``) strings them together. Nothing here raises: a bad call is an observation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import jsonschema
from jsonschema.protocols import Validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import from_json

from agent_fsm.messages import clean_json

__all__ = ["UNPARSED", "conversion_errors", "quoted", "schema_errors", "with_lone_surrogates"]

UNPARSED: Any = object()
"""What ``with_lone_surrogates`` returns for text that is not JSON at all."""

_QUOTE_CHARS = 200
"""How much of unparseable arguments an error result quotes back to the model."""


def _where(path: Iterable[Any]) -> str:
    return "/".join(str(p) for p in path) or "(arguments)"


def with_lone_surrogates(raw: str) -> Any:
    """Arguments whose only fault is a lone surrogate escape (``"\\ud83d"``: JSON allows the
    escape, pydantic_core refuses it), parsed with each one replaced by U+FFFD, as the
    transcript holds text (``clean_text``); ``UNPARSED`` for anything else. What comes back
    is read again by pydantic_core's parser, so that it is held to the same nesting limit as
    any arguments (``json.loads`` takes far deeper text, which validation, loop detection and
    the transcript's serialisation could not)."""
    if "\\ud" not in raw.lower():
        return UNPARSED
    try:
        return from_json(json.dumps(clean_json(json.loads(raw)), ensure_ascii=False))
    except (ValueError, RecursionError):
        return UNPARSED


def quoted(raw: str) -> str:
    """The model's own argument text, quoted (and cut short): the history sends it back as
    ``{}`` (``replayable_arguments``), so this result is where the model sees what it wrote."""
    if len(raw) <= _QUOTE_CHARS:
        return f"you sent {raw!r}"
    return f"you sent {raw[:_QUOTE_CHARS]!r}... ({len(raw)} characters)"


def schema_errors(
    tool_name: str,
    validator: Validator,
    fast_check: Callable[[dict[str, Any]], bool] | None,
    arguments: dict[str, Any],
) -> str | None:
    """What is wrong with ``arguments`` by the tool's schema, for the model; None if nothing.

    Must not raise. Patterns match in linear time and the schema was checked for loops when
    the tool was made (``tools.schema_checks``); what remains is a value nested so deeply,
    against a recursive schema, that validating it exhausts the stack: the arguments' fault,
    and said so.
    """
    if fast_check is not None and fast_check(arguments):
        return None
    try:
        errors = list(validator.iter_errors(arguments))
    except RecursionError:
        return (
            f"Invalid arguments for tool '{tool_name}': they are nested too deeply to "
            "validate. Call the tool again with arguments that match its schema."
        )
    return _format_schema_errors(tool_name, errors) if errors else None


def _format_schema_errors(tool_name: str, errors: list[jsonschema.ValidationError]) -> str:
    lines = [f"Invalid arguments for tool '{tool_name}':"]
    for err in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path]):
        lines.append(f"- at {_where(err.absolute_path)}: {err.message}")
    lines.append("Call the tool again with arguments that match its schema.")
    return "\n".join(lines)


def conversion_errors(tool_name: str, exc: PydanticValidationError) -> str:
    """Why arguments that passed the schema do not convert to the function's types."""
    lines = [f"Invalid arguments for tool '{tool_name}':"]
    for err in exc.errors(include_url=False):
        got = json.dumps(err.get("input"), default=repr, ensure_ascii=False)
        if len(got) > 200:
            got = got[:200] + "…"
        lines.append(f"- at {_where(err['loc'])}: {err['msg']} (got {got})")
    lines.append("Call the tool again with arguments that match its schema.")
    return "\n".join(lines)
