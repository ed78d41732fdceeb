"""Tool schemas for Gemini: a copy of a JSON Schema in the OpenAPI subset Gemini's
``FunctionDeclaration.parameters`` takes, and what that copy lost.

Gemini reads function parameters as its own ``Schema`` object (OpenAPI 3.0 flavoured): upper-case
``type`` names, ``nullable`` instead of ``null`` in a type list, ``enum`` of strings only, one
``items`` schema, ``anyOf`` but no ``oneOf``/``allOf``/``not``, no ``$ref``, no
``additionalProperties``, only a few ``format`` values, and ``properties``/``required`` on
objects alone (``required`` naming only declared properties). A request that breaks one of
these rules fails with HTTP 400 before the model sees it, so every schema goes through
``gemini_schema`` first, which rewrites a copy.

Rules (the path of each keyword is reported as ``"properties/when/format"``):

- rewritten exactly, no issue: ``$ref`` to ``#/$defs/...``/``#/definitions/...`` (inlined; a
  cycle is fatal), ``type: [T, "null"]`` and ``anyOf: [..., {"type": "null"}]`` (``nullable``),
  ``null`` in ``enum``, string ``const`` (``enum: [c]``), a single-schema ``allOf`` (merged),
  ``exclusiveMinimum``/``exclusiveMaximum`` on integers (``minimum``/``maximum`` ± 1), and a
  root object without properties (sent with no ``parameters``, as the API wants for a tool
  without arguments);
- dropped silently, because they constrain nothing (annotations) or say nothing Gemini does
  not assume: ``$schema``, ``$id``, ``$anchor``, ``$comment``, ``title``, ``examples``,
  ``deprecated``, ``readOnly``, ``writeOnly``, ``content*``, ``$defs``/``definitions`` (after
  inlining), unknown keywords (ignored by JSON Schema validators too), ``default: null``, and
  ``additionalProperties: true|false`` (a Gemini object is the properties it declares);
- dropped or loosened with a non-fatal issue (the provider holds the model to less than the
  tool checks; the engine still validates every call against the whole schema):
  ``oneOf`` (sent as ``anyOf``), ``additionalProperties`` with a schema, ``patternProperties``,
  ``propertyNames``, ``dependentRequired``, ``dependentSchemas``, ``dependencies``,
  ``unevaluated*``, ``not``, ``if``/``then``/``else``, ``multipleOf``, ``uniqueItems``,
  ``contains``/``minContains``/``maxContains``, ``exclusiveMinimum``/``exclusiveMaximum`` on
  numbers, unsupported ``format`` values, non-string ``enum``/``const``, ``prefixItems``
  (their ``anyOf`` becomes ``items``), an array without ``items`` (sent as an array of
  strings: narrower, so what the model sends still fits the tool), ``required`` names that
  are not declared properties, several types (``anyOf`` of each), a root that takes free-form
  arguments (sent without parameters);
- fatal (the tool cannot be sent): a ``$ref`` that is not local or does not resolve, a
  recursive ``$ref``, ``allOf`` with several schemas, an unknown ``type``, and a root that is
  not an object.

Like ``openai_schema`` this module is pure: plain JSON-shaped data in and out, no SDK.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent_fsm.models.common import resolve_ref

__all__ = ["GeminiSchema", "SchemaProblem", "gemini_schema"]

_TYPES = {
    "string": "STRING",
    "number": "NUMBER",
    "integer": "INTEGER",
    "boolean": "BOOLEAN",
    "array": "ARRAY",
    "object": "OBJECT",
}
# The formats the Gemini API accepts per type; any other is refused with HTTP 400.
_FORMATS = {
    "STRING": frozenset({"enum", "date-time"}),
    "NUMBER": frozenset({"float", "double"}),
    "INTEGER": frozenset({"int32", "int64"}),
}
# Keywords copied as they are, under Gemini's spelling, for the types they apply to.
_COPIED: Mapping[str, tuple[str, frozenset[str] | None]] = {
    "description": ("description", None),
    "minimum": ("minimum", frozenset({"NUMBER", "INTEGER"})),
    "maximum": ("maximum", frozenset({"NUMBER", "INTEGER"})),
    "minLength": ("minLength", frozenset({"STRING"})),
    "maxLength": ("maxLength", frozenset({"STRING"})),
    "pattern": ("pattern", frozenset({"STRING"})),
    "minItems": ("minItems", frozenset({"ARRAY"})),
    "maxItems": ("maxItems", frozenset({"ARRAY"})),
    "minProperties": ("minProperties", frozenset({"OBJECT"})),
    "maxProperties": ("maxProperties", frozenset({"OBJECT"})),
}
_SILENT = frozenset(
    {
        "$schema", "$id", "$anchor", "$comment", "$defs", "definitions", "title", "examples",
        "example", "deprecated", "readOnly", "writeOnly", "contentMediaType",
        "contentEncoding", "contentSchema", "$dynamicAnchor", "$vocabulary",
    }
)  # fmt: skip
_LOOSENED = {
    "patternProperties": "dropped: Gemini cannot constrain keys by pattern",
    "propertyNames": "dropped: Gemini cannot constrain property names",
    "dependentRequired": "dropped: Gemini has no dependent requirements",
    "dependentSchemas": "dropped: Gemini has no dependent schemas",
    "dependencies": "dropped: Gemini has no dependent requirements",
    "unevaluatedProperties": "dropped: Gemini has no unevaluated properties",
    "unevaluatedItems": "dropped: Gemini has no unevaluated items",
    "not": "dropped: Gemini cannot exclude values",
    "if": "dropped: Gemini has no conditional schemas",
    "then": "dropped: Gemini has no conditional schemas",
    "else": "dropped: Gemini has no conditional schemas",
    "multipleOf": "dropped: Gemini has no multipleOf",
    "uniqueItems": "dropped: Gemini cannot require unique items",
    "contains": "dropped: Gemini has no contains",
    "minContains": "dropped: Gemini has no contains",
    "maxContains": "dropped: Gemini has no contains",
}
# Handled by the walker itself, beyond the tables above.
_STRUCTURAL = frozenset(
    {
        "type", "enum", "const", "format", "nullable", "default", "properties", "required",
        "additionalProperties", "items", "prefixItems", "anyOf", "oneOf", "allOf", "$ref",
        "exclusiveMinimum", "exclusiveMaximum",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class SchemaProblem:
    """One thing the Gemini copy of a schema lost (or, when ``fatal``, could not express)."""

    keyword: str
    """The keyword with its place in the tool's schema, e.g. ``"properties/when/format"``."""
    detail: str
    fatal: bool = False


@dataclass(frozen=True, slots=True)
class GeminiSchema:
    """The outcome of ``gemini_schema``."""

    parameters: dict[str, Any] | None
    """The copy to send as ``FunctionDeclaration.parameters``; None when the tool is sent
    without parameters (no properties, or a fatal problem: then it cannot be sent at all)."""
    problems: tuple[SchemaProblem, ...] = ()

    @property
    def fatal(self) -> bool:
        """Whether the tool cannot be sent to Gemini at all."""
        return any(problem.fatal for problem in self.problems)


class _Fatal(Exception):
    def __init__(self, keyword: str, detail: str) -> None:
        super().__init__(detail)
        self.problem = SchemaProblem(keyword, detail, fatal=True)


@dataclass
class _Walk:
    root: Mapping[str, Any]
    problems: list[SchemaProblem] = field(default_factory=list)
    expanding: tuple[str, ...] = ()

    def lost(self, path: str, keyword: str, detail: str) -> None:
        problem = SchemaProblem(_join(path, keyword), detail)
        if problem not in self.problems:  # a $defs entry used twice is reported once
            self.problems.append(problem)


def gemini_schema(schema: Mapping[str, Any]) -> GeminiSchema:
    """Convert a copy of a tool's JSON Schema into Gemini's function ``parameters``.

    Args:
        schema: the tool's parameter schema; never modified (the result shares nothing
            with it).

    Returns:
        The parameters to send (None for a tool sent without them) and the problems, in the
        order met; with a fatal problem the parameters are None.
    """
    walk = _Walk(root=schema)
    try:
        node = _node(walk, schema, "")
        parameters = _root(walk, node, schema)
    except _Fatal as fatal:
        return GeminiSchema(None, (*walk.problems, fatal.problem))
    return GeminiSchema(parameters, tuple(walk.problems))


def _root(walk: _Walk, node: dict[str, Any], schema: Mapping[str, Any]) -> dict[str, Any] | None:
    node.pop("nullable", None)
    if node.get("type", "OBJECT") != "OBJECT" or "anyOf" in node:
        raise _Fatal("type", "a tool's parameters must be one object (Gemini takes no other)")
    if node.get("properties"):
        return node
    if schema.get("additionalProperties", True) is not False or "patternProperties" in schema:
        walk.lost(
            "",
            "properties",
            "the tool takes free-form arguments, which Gemini cannot declare: it is offered "
            "without parameters",
        )
    return None  # the API refuses an OBJECT without properties; no parameters is its spelling


def _node(walk: _Walk, raw: Any, path: str) -> dict[str, Any]:
    """The Gemini form of the schema ``raw`` found at ``path``."""
    if raw is True:
        return {}
    if not isinstance(raw, Mapping):
        raise _Fatal(path or "(root)", f"{raw!r} is no schema Gemini can express")
    depth = len(walk.expanding)
    try:  # the references followed stay on the stack while their subtree is converted
        source, path = _expanded(walk, raw, path)
        return _convert(walk, source, path)
    finally:
        walk.expanding = walk.expanding[:depth]


def _convert(walk: _Walk, source: Mapping[str, Any], path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    kind, nullable = _type(walk, source, path)
    nullable = nullable or source.get("nullable") is True
    merged = False
    if "anyOf" in source or "oneOf" in source:
        variants, null_variant = _variants(walk, source, path)
        nullable = nullable or null_variant
        if len(variants) == 1 and kind is None:  # Optional[X]: X itself, nullable
            out.update(variants[0])
            kind, merged = out.get("type"), True
        elif variants:
            out["anyOf"] = variants
    values, enum_null = _enum(walk, source, path)
    nullable = nullable or enum_null
    if kind is None:
        kind = _implied_type(source, values)
    if isinstance(kind, list):  # several types: one variant each
        out["anyOf"] = [*out.get("anyOf", []), *({"type": k} for k in kind)]
        kind = None
    if kind is not None:
        out["type"] = kind
    if values is not None and kind == "STRING":
        out["enum"] = values
    elif values is not None:
        walk.lost(path, "enum", "dropped: Gemini takes only string enums")
    _copy_keywords(walk, source, path, kind, out)
    if kind == "OBJECT":
        _object(walk, source, path, out)
    elif kind == "ARRAY" and not (merged and "items" in out):
        _array(walk, source, path, out)
    if nullable:
        out["nullable"] = True
    return out


def _expanded(walk: _Walk, raw: Mapping[str, Any], path: str) -> tuple[Mapping[str, Any], str]:
    """``raw`` with its ``$ref`` and single-schema ``allOf`` merged in (siblings win), and
    the path its problems are reported at (a reference's target, for a reference)."""
    source: dict[str, Any] = dict(raw)
    ref = source.pop("$ref", None)
    if ref is not None:
        if not isinstance(ref, str):
            raise _Fatal(_join(path, "$ref"), "not a string")
        if ref in walk.expanding:
            raise _Fatal(_join(path, "$ref"), f"recursive reference {ref!r}: Gemini has no $ref")
        target = resolve_ref(walk.root, ref)
        if not isinstance(target, Mapping):
            raise _Fatal(_join(path, "$ref"), f"cannot resolve {ref!r} inside the schema")
        walk.expanding = (*walk.expanding, ref)
        inner, path = _expanded(walk, target, _target_path(ref))
        source = {**inner, **source}
    all_of = source.pop("allOf", None)
    if all_of is not None:
        if not isinstance(all_of, list) or len(all_of) != 1 or not isinstance(all_of[0], Mapping):
            raise _Fatal(_join(path, "allOf"), "Gemini cannot combine several schemas")
        inner, _ = _expanded(walk, all_of[0], _join(path, "allOf/0"))
        source = {**inner, **source}
    return source, path


def _type(walk: _Walk, source: Mapping[str, Any], path: str) -> tuple[Any, bool]:
    """(Gemini type, a list of them, or None; whether ``null`` was among the types)."""
    raw = source.get("type")
    if raw is None:
        return None, False
    names = raw if isinstance(raw, list) else [raw]
    kinds: list[str] = []
    for name in names:
        if name == "null":
            continue
        if name not in _TYPES:
            raise _Fatal(_join(path, "type"), f"unknown type {name!r}")
        if _TYPES[name] not in kinds:
            kinds.append(_TYPES[name])
    null = "null" in names
    if not kinds:
        return None, null
    if len(kinds) > 1:
        walk.lost(path, "type", "several types: sent as anyOf, one variant per type")
        return kinds, null
    return kinds[0], null


def _variants(
    walk: _Walk, source: Mapping[str, Any], path: str
) -> tuple[list[dict[str, Any]], bool]:
    """The ``anyOf``/``oneOf`` variants in Gemini form, and whether one was only null."""
    variants: list[dict[str, Any]] = []
    null = False
    for keyword in ("anyOf", "oneOf"):
        raw = source.get(keyword)
        if raw is None:
            continue
        if not isinstance(raw, list):
            raise _Fatal(_join(path, keyword), "not a list of schemas")
        if keyword == "oneOf":
            walk.lost(path, keyword, "sent as anyOf: a value fitting several variants is allowed")
        for index, sub in enumerate(raw):
            if isinstance(sub, Mapping) and sub.get("type") == "null" and len(sub) == 1:
                null = True
                continue
            converted = _node(walk, sub, _join(path, f"{keyword}/{index}"))
            if converted.pop("nullable", False):
                null = True
            variants.append(converted)
    return variants, null


def _enum(walk: _Walk, source: Mapping[str, Any], path: str) -> tuple[list[Any] | None, bool]:
    """(The enum values, None when there is no enum; whether null was one of them)."""
    if "const" in source:
        values: Any = [source["const"]]
        keyword = "const"
    elif "enum" in source:
        values, keyword = source["enum"], "enum"
    else:
        return None, False
    if not isinstance(values, list):
        raise _Fatal(_join(path, keyword), "not a list")
    null = None in values
    values = [value for value in values if value is not None]
    if not values:
        return None, null
    if not all(isinstance(value, str) for value in values):
        walk.lost(path, keyword, "dropped: Gemini takes only string enums")
        return None, null
    return list(values), null


def _implied_type(source: Mapping[str, Any], values: list[Any] | None) -> str | None:
    """The type a schema without ``type`` implies by its keywords, if one does."""
    if values is not None:
        return "STRING"
    if "properties" in source:
        return "OBJECT"
    if "items" in source or "prefixItems" in source:
        return "ARRAY"
    if {"minLength", "maxLength", "pattern"} & set(source):
        return "STRING"
    return None


def _copy_keywords(
    walk: _Walk, source: Mapping[str, Any], path: str, kind: str | None, out: dict[str, Any]
) -> None:
    for keyword, value in source.items():
        copied = _COPIED.get(keyword)
        if copied is not None:
            name, applies = copied
            if applies is None or kind in applies or kind is None:
                _bound(out, name, copy.deepcopy(value))
        elif keyword in _LOOSENED:
            walk.lost(path, keyword, _LOOSENED[keyword])
        elif keyword == "format":
            _format(walk, value, path, kind, out)
        elif keyword in ("exclusiveMinimum", "exclusiveMaximum"):
            _exclusive(walk, keyword, value, path, kind, out)
        elif keyword == "default" and value is not None:
            out["default"] = copy.deepcopy(value)
        # _SILENT, _STRUCTURAL and unknown keywords: nothing to copy here


def _format(walk: _Walk, value: Any, path: str, kind: str | None, out: dict[str, Any]) -> None:
    if kind is not None and value in _FORMATS.get(kind, ()):
        out["format"] = value
    else:
        walk.lost(path, "format", f"dropped: Gemini does not take format {value!r} here")


def _exclusive(
    walk: _Walk, keyword: str, value: Any, path: str, kind: str | None, out: dict[str, Any]
) -> None:
    if kind == "INTEGER" and isinstance(value, int) and not isinstance(value, bool):
        if keyword == "exclusiveMinimum":
            _bound(out, "minimum", value + 1)
        else:
            _bound(out, "maximum", value - 1)
        return
    walk.lost(path, keyword, "dropped: Gemini has no exclusive bounds for numbers")


def _bound(out: dict[str, Any], name: str, value: Any) -> None:
    """Set ``out[name]``; of two numeric bounds (``minimum`` and an exclusive one made
    inclusive) the tighter wins."""
    current = out.get(name)
    numbers = (int, float)
    if (
        name in ("minimum", "maximum")
        and isinstance(current, numbers)
        and isinstance(value, numbers)
    ):
        value = max(current, value) if name == "minimum" else min(current, value)
    out[name] = value


def _object(walk: _Walk, source: Mapping[str, Any], path: str, out: dict[str, Any]) -> None:
    properties = source.get("properties")
    if properties is not None:
        if not isinstance(properties, Mapping):
            raise _Fatal(_join(path, "properties"), "not an object")
        converted = {
            name: _node(walk, sub, _join(path, f"properties/{_escape(name)}"))
            for name, sub in properties.items()
        }
        if converted:  # the API refuses an empty ``properties``
            out["properties"] = converted
    required = source.get("required")
    if isinstance(required, list) and required:
        declared = out.get("properties", {})
        kept = [name for name in required if name in declared]
        if len(kept) < len(required):
            walk.lost(path, "required", "names no declared property: Gemini refuses it, dropped")
        if kept:
            out["required"] = kept
    extra = source.get("additionalProperties")
    if isinstance(extra, Mapping) and extra:
        walk.lost(path, "additionalProperties", "dropped: Gemini cannot type extra properties")


def _array(walk: _Walk, source: Mapping[str, Any], path: str, out: dict[str, Any]) -> None:
    items = source.get("items")
    prefix = source.get("prefixItems")
    if isinstance(items, list):  # draft 4-7 tuples
        prefix, items = items, source.get("additionalItems")
    if isinstance(prefix, list) and prefix:
        walk.lost(
            path, "prefixItems", "Gemini has no tuples: items may be any of them, in any order"
        )
        variants = [
            _node(walk, sub, _join(path, f"prefixItems/{i}")) for i, sub in enumerate(prefix)
        ]
        if isinstance(items, Mapping) and items:
            variants.append(_node(walk, items, _join(path, "items")))
        out["items"] = variants[0] if len(variants) == 1 else {"anyOf": variants}
        return
    converted = _node(walk, items, _join(path, "items")) if isinstance(items, Mapping) else {}
    if not converted or ("type" not in converted and "anyOf" not in converted):
        walk.lost(path, "items", "Gemini needs an item type: sent as an array of strings")
        converted = {**converted, "type": "STRING"}
    out["items"] = converted


def _target_path(ref: Any) -> str:
    return ref[2:] if isinstance(ref, str) and ref.startswith("#/") else ""


def _join(path: str, keyword: str) -> str:
    return f"{path}/{keyword}" if path else keyword


def _escape(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")
