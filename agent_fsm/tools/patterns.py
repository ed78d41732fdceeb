"""Regular expressions in JSON Schema, matched in time linear in the text.

jsonschema evaluates ``pattern`` and ``patternProperties`` (and, through them,
``additionalProperties``) with Python's backtracking ``re``, on the event loop every run
shares: ``{"pattern": "(a+)+$"}`` against ``"a" * 26 + "!"`` takes seconds, four times longer
for every two more characters, and no deadline, abort or other run gets the loop back until it
returns. The schema may come from an MCP server and the text from the model, which an injected
prompt can steer, so either may be hostile.

``schema_validator`` is jsonschema's Draft 2020-12 validator with those three keywords matched
on **pydantic-core's Rust regex engine**, whose matching time is linear in the text (and in
the pattern). Why that engine:

* RE2 (``google-re2``) gives the same guarantee, but it is one more compiled dependency; the
  Rust engine ships with pydantic, and it is the one pydantic itself uses for
  ``constr(pattern=...)`` and ``Field(pattern=...)``, so the schema pass and a pydantic model's
  own pass agree on what matches.
* Containing ``re`` cannot work: it holds the GIL while it matches, so a worker thread freezes
  the loop all the same and cannot be stopped, and a time limit (the ``regex`` package's
  ``timeout=``) still blocks the loop that long for every value checked.

A pattern the engine cannot take (look-around, backreferences, ``\\Z``, a compiled program
over 10 MB) has no bounded way to run, so it is refused before any validator is built:
``pattern_problem`` says why, and ``tools.schema_checks`` turns that into a ``ConfigError``
naming the pattern. jsonschema evaluates ``patternProperties`` with ``re`` in one more place,
working out ``unevaluatedProperties``, beyond a keyword's reach: ``tools.schema_checks``
refuses the two together. And pydantic itself falls back to ``re`` for a pattern given
compiled or under ``regex_engine="python-re"``: ``backtracking_problem`` finds those in a
model, for ``Tool`` and the output type to refuse.

What a pattern means stays what it meant under jsonschema: a search, not anchored; ``\\d``,
``\\w`` and ``\\s`` Unicode-aware as in Python's ``re``; ECMA-262's ``\\uXXXX`` escapes
understood. Text with lone surrogates is matched with each replaced by U+FFFD.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any, cast

import jsonschema
from jsonschema import Draft202012Validator, ValidationError
from jsonschema.protocols import Validator
from pydantic import BaseModel
from pydantic_core import SchemaError, SchemaValidator, core_schema

from agent_fsm.messages import clean_text

__all__ = ["backtracking_problem", "pattern_problem", "schema_validator"]

_SHOWN_CHARS = 80
"""How much of a string that does not match a pattern the error quotes back."""


def pattern_problem(pattern: str) -> str | None:
    """Why the engine cannot take ``pattern``, in its own words, or None."""
    try:
        _engine(pattern)
    except SchemaError as exc:
        return _engine_says(exc)
    return None


def backtracking_problem(model: type[BaseModel]) -> str | None:
    """Why pydantic would match a pattern of ``model`` with Python's ``re``, or None.

    Pydantic matches ``constr(pattern=...)`` and ``Field(pattern=...)`` on the Rust engine,
    unless the pattern is given compiled (``re.compile(...)``) or the model's config says
    ``regex_engine="python-re"``: then the value that passed the schema's linear pass meets
    the backtracking engine all the same. Read from the model's core schema, without
    recursion (it nests as deep as the model's types).
    """
    stack: list[tuple[object, bool]] = [(getattr(model, "__pydantic_core_schema__", None), False)]
    while stack:
        node, python_re = stack.pop()
        if isinstance(node, list | tuple):
            stack.extend((item, python_re) for item in node)
            continue
        if not isinstance(node, Mapping):
            continue
        config = node.get("config")
        if isinstance(config, Mapping) and config.get("regex_engine") == "python-re":
            python_re = True
        pattern = node.get("pattern")
        if isinstance(pattern, re.Pattern):
            return _backtracks(str(pattern.pattern))
        if isinstance(pattern, str) and (python_re or node.get("regex_engine") == "python-re"):
            return _backtracks(pattern)
        stack.extend((value, python_re) for key, value in node.items() if key not in _OPAQUE)
    return None


_OPAQUE = frozenset({"metadata", "default", "cls"})
"""Keys of a core schema whose values are no schema."""


def _backtracks(pattern: str) -> str:
    return (
        f"pydantic would match its pattern {pattern!r} with Python's backtracking re (the "
        "pattern is given compiled, or regex_engine='python-re'), which a crafted value can "
        "keep busy for hours: give the pattern as a str and leave regex_engine at its "
        "default, 'rust-regex', whose matching time is linear"
    )


def _engine_says(exc: SchemaError) -> str:
    """The engine's reason, from pydantic-core's multi-line message."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    for line in reversed(lines):
        if line.startswith("error:"):
            return line.removeprefix("error:").strip()
    return lines[-1].removeprefix("SchemaError:").strip() if lines else "refused"


@functools.lru_cache(maxsize=4096)
def _engine(pattern: str) -> SchemaValidator:
    """The compiled pattern. Raises ``SchemaError`` for one the engine refuses.

    Cached: every pattern of a schema is compiled when the schema is checked, and found here
    again for each value; one evicted meanwhile is compiled again, in time linear in it."""
    return SchemaValidator(core_schema.str_schema(pattern=pattern, regex_engine="rust-regex"))


def _search(pattern: str, text: str) -> bool:
    """Whether ``pattern`` matches anywhere in ``text`` (JSON Schema's ``pattern``), in time
    linear in the text. A pattern the engine refuses matches nothing (a checked schema has
    none). Text with lone surrogates, which the engine cannot read, is matched with each
    replaced by U+FFFD, as the transcript holds it."""
    try:
        engine = _engine(pattern)
    except SchemaError:
        return False
    if engine.isinstance_python(text):
        return True
    cleaned = clean_text(text)
    return cleaned is not text and engine.isinstance_python(cleaned)


def _shown(text: str) -> str:
    if len(text) <= _SHOWN_CHARS:
        return repr(text)
    return f"{text[:_SHOWN_CHARS]!r}... ({len(text)} characters)"


def _pattern(
    validator: Any, pattern: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "string") or not isinstance(pattern, str):
        return
    if not _search(pattern, instance):
        yield ValidationError(f"{_shown(instance)} does not match {pattern!r}")


def _pattern_properties(
    validator: Any, patterns: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(
    validator: Any, allowed: Any, instance: Any, schema: Mapping[str, Any]
) -> Iterator[ValidationError]:
    """jsonschema's ``additionalProperties``, its messages included, with the patterns of
    ``patternProperties`` matched by ``_search``."""
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = {
        key
        for key in instance
        if key not in properties and not any(_search(pattern, key) for pattern in patterns)
    }
    if validator.is_type(allowed, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], allowed, path=extra)
    elif not allowed and extras:
        listed = sorted(extras, key=str)
        joined = ", ".join(repr(extra) for extra in listed)
        if "patternProperties" in schema:
            verb = "does" if len(listed) == 1 else "do"
            regexes = ", ".join(repr(pattern) for pattern in sorted(patterns))
            yield ValidationError(f"{joined} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(listed) == 1 else "were"
            yield ValidationError(
                f"Additional properties are not allowed ({joined} {verb} unexpected)"
            )


_LinearValidator = cast(
    "type[Validator]",
    jsonschema.validators.extend(  # type: ignore[no-untyped-call]
        Draft202012Validator,
        {
            "pattern": _pattern,
            "patternProperties": _pattern_properties,
            "additionalProperties": _additional_properties,
        },
    ),
)


def schema_validator(schema: Mapping[str, Any]) -> Validator:
    """A Draft 2020-12 validator for ``schema`` whose patterns match in linear time.

    ``schema`` must have passed the checks of ``tools.schema_checks``: then no value makes
    validation raise, loop or stall, except one nested so deeply against a recursive schema
    that the stack runs out (``RecursionError``, which callers treat as invalid arguments).
    """
    return _LinearValidator(schema)
