"""Strict mode for tool schemas: adapting a schema to it, and undoing what that adaptation adds.

The API's strict mode (``"strict": true`` on a function tool) holds the model's arguments to the
schema, but only accepts closed, fully required objects. ``strict_schema`` rewrites a tool's
schema into that form. One of its rewrites changes what the model sends: an optional property
becomes a nullable required one, so the model sends ``null`` for an argument it leaves out. The
engine validates arguments against the tool's *own* schema, where that ``null`` is usually
invalid, so ``without_strict_nulls`` takes those nulls out of the reply again.

Like ``openai_convert``, this module works on plain JSON-shaped data and never imports
``openai``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from agent_fsm.models.common import resolve_ref
from agent_fsm.tools.patterns import schema_validator

__all__ = ["strict_obstacle", "strict_schema", "without_strict_nulls"]


# --------------------------------------------------------------------------- requests


class _NotExpressible(Exception):
    """Internal: the schema uses something strict mode cannot represent."""


# Keywords strict mode rejects and that have no faithful rewrite.
_UNSUPPORTED = frozenset(
    {"allOf", "not", "if", "then", "else", "patternProperties", "dependentSchemas"}
)


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """Adapt a copy of a JSON Schema to the API's strict mode, or None if it cannot be.

    Strict mode wants every object closed and fully required. Recursively, each object gets
    ``additionalProperties: false`` and lists every property in ``required``; a property that
    was optional becomes nullable instead (the model then sends ``null`` for "not given");
    ``default`` is dropped (strict mode rejects it, and every property is sent anyway);
    ``oneOf`` becomes the ``anyOf`` strict mode supports.

    Returns None, rather than a schema meaning something else, for what strict mode cannot
    express: free-form objects (no ``properties``, or ``additionalProperties`` other than
    false), ``allOf``, ``not``, conditionals and ``patternProperties``.

    Args:
        schema: the tool's parameter schema; never modified.
    """
    try:
        return _strict_node(schema)
    except _NotExpressible:
        return None


def strict_obstacle(schema: Mapping[str, Any]) -> str | None:
    """What keeps ``schema`` out of strict mode (a keyword, or "free-form object"), or None
    when ``strict_schema`` can adapt it."""
    try:
        _strict_node(schema)
    except _NotExpressible as exc:
        return str(exc)
    return None


def _strict_node(node: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _UNSUPPORTED:
            raise _NotExpressible(key)
        if key == "default":
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, Mapping):
            out[key] = {name: _strict_sub(sub) for name, sub in value.items()}
        elif key in ("anyOf", "oneOf", "prefixItems") and isinstance(value, list):
            out["anyOf" if key == "oneOf" else key] = [_strict_sub(sub) for sub in value]
        elif key == "items":
            out[key] = (
                [_strict_sub(sub) for sub in value]
                if isinstance(value, list)
                else _strict_sub(value)
            )
        else:
            out[key] = copy.deepcopy(value)
    if _is_object_schema(out):
        _close_object(out)
    return out


def _strict_sub(node: Any) -> Any:
    return _strict_node(node) if isinstance(node, Mapping) else copy.deepcopy(node)


def _is_object_schema(node: Mapping[str, Any]) -> bool:
    kind = node.get("type")
    return kind == "object" or (isinstance(kind, list) and "object" in kind) or "properties" in node


def _close_object(node: dict[str, Any]) -> None:
    properties = node.get("properties")
    if not isinstance(properties, dict) or node.get("additionalProperties", False) is not False:
        raise _NotExpressible("free-form object")
    required = node.get("required", [])
    for name, sub in properties.items():
        if name not in required:
            properties[name] = _nullable(sub)
    node["required"] = list(properties)
    node["additionalProperties"] = False


def _nullable(node: Any) -> Any:
    if not isinstance(node, dict):
        return node
    kind = node.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return node
    variants = node.get("anyOf")
    if isinstance(variants, list):
        if {"type": "null"} not in variants:
            node["anyOf"] = [*variants, {"type": "null"}]
        return node
    if isinstance(kind, str | list) and "const" not in node:
        node["type"] = [*kind, "null"] if isinstance(kind, list) else [kind, "null"]
        if isinstance(node.get("enum"), list) and None not in node["enum"]:
            node["enum"] = [*node["enum"], None]
        return node
    outer: dict[str, Any] = {}
    if "description" in node:
        outer["description"] = node.pop("description")
    outer["anyOf"] = [node, {"type": "null"}]
    return outer


# --------------------------------------------------------------------------- replies


def without_strict_nulls(arguments: str, schema: Mapping[str, Any]) -> str:
    """A strict tool call's arguments without the nulls the strict adaptation made it send.

    Removes, in nested objects too, each key whose value is null where the tool's own schema
    neither requires the property nor accepts null for it: the properties ``strict_schema``
    made nullable. Then re-serialises the JSON. Whether null is accepted is decided by the same
    Draft 2020-12 validation the engine applies, so a null the original schema allows is kept;
    so is a null for a required property, for the engine to report.

    Returns ``arguments`` itself when nothing was removed, and whenever it is not a JSON object:
    text that is not JSON must reach the engine intact. Must not raise: the reply is built from
    whatever the server sent.

    Args:
        arguments: the raw argument text, as the model produced it.
        schema: the tool's original parameter schema (not its strict adaptation); never
            modified.
    """
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return arguments
    if not isinstance(value, dict):
        return arguments
    stripper = _NullStripper(schema)
    try:
        cleaned = stripper.clean(value, schema)
    except (_CannotTell, RecursionError):  # when in doubt, the model's own text
        return arguments
    if not stripper.removed:
        return arguments
    return json.dumps(cleaned, ensure_ascii=False)


class _NullStripper:
    """Walks arguments alongside the original schema, through the keywords strict mode adapts
    (``properties``, ``items``, ``prefixItems``, ``anyOf``, ``oneOf`` and local ``$ref``)."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = root
        self._validator = schema_validator(root)
        self.removed = 0

    def clean(self, value: Any, node: Any, followed: frozenset[str] = frozenset()) -> Any:
        """``value``, an instance of ``node``, with the added nulls removed (never in place).

        ``followed`` holds the references already followed for this same value, so that a
        reference cycle in the schema cannot loop.
        """
        if not isinstance(node, Mapping) or not isinstance(value, dict | list):
            return value
        ref = node.get("$ref")
        if isinstance(ref, str) and ref not in followed:
            target = resolve_ref(self._root, ref)
            if target is not None:
                value = self.clean(value, target, followed | {ref})
        for key in ("anyOf", "oneOf"):
            variants = node.get(key)
            if isinstance(variants, list):
                value = self._clean_as_variant(value, variants, followed)
        if isinstance(value, dict):
            return self._clean_object(value, node)
        return self._clean_array(value, node)

    def _clean_object(self, value: dict[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
        properties = node.get("properties")
        if not isinstance(properties, Mapping):
            return value
        required = node.get("required")
        required = required if isinstance(required, list) else []
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key in properties:
                sub = properties[key]
                if item is None and key not in required and not self._fits(None, sub):
                    self.removed += 1
                    continue
                item = self.clean(item, sub)
            out[key] = item
        return out

    def _clean_array(self, value: list[Any], node: Mapping[str, Any]) -> list[Any]:
        items = node.get("items")
        prefix = node.get("prefixItems", items if isinstance(items, list) else [])
        prefix = prefix if isinstance(prefix, list) else []
        rest = items if isinstance(items, Mapping) else None
        return [
            self.clean(item, prefix[i] if i < len(prefix) else rest) for i, item in enumerate(value)
        ]

    def _clean_as_variant(self, value: Any, variants: list[Any], followed: frozenset[str]) -> Any:
        # The first variant the cleaned value fits is the one the model meant; when none fits,
        # this value is left as it came, for the engine to report.
        for variant in variants:
            removed = self.removed
            candidate = self.clean(value, variant, followed)
            if self._fits(candidate, variant):
                return candidate
            self.removed = removed
        return value

    def _fits(self, instance: Any, schema: Any) -> bool:
        """Whether ``instance`` is valid against ``schema``, a part of the root schema."""
        try:
            return bool(self._validator.evolve(schema=schema).is_valid(instance))
        except Exception as err:  # an unresolvable $ref, say: the engine will report that
            raise _CannotTell from err


class _CannotTell(Exception):
    """Internal: the original schema cannot be evaluated here."""
