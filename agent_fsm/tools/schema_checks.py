"""What a JSON Schema must pass before anything validates against it: checks that neither a
hostile schema nor a hostile value can turn validation against the event loop every run
shares. A tool's schema comes from the developer, from a pydantic model, or from an MCP
server, whose author writes it.

* **Depth.** jsonschema checks and applies a schema recursively: one nested ~100 objects deep
  raises ``RecursionError``. A document nested more than ``MAX_SCHEMA_DEPTH`` levels is
  refused, measured without recursion before anything else reads it.
* **References.** Every ``$ref`` must resolve inside the schema (nothing is fetched), found
  when the tool is made rather than when the model first calls it.
* **Patterns.** Each ``pattern`` and ``patternProperties`` key must be one the linear-time
  engine takes (``tools.patterns``), and ``unevaluatedProperties`` may not stand beside
  ``patternProperties`` (jsonschema would match those with Python's ``re``).
* **Loops.** ``{"$defs": {"a": {"$ref": "#/$defs/a"}}}`` sends validation round until the
  stack runs out, on any value. A chain of ``$ref``, ``allOf``, ``anyOf``, ``oneOf``, ``not``,
  ``if``/``then``/``else`` and ``dependentSchemas`` that leads back to itself is refused, and
  so is one longer than ``MAX_SCHEMA_DEPTH``: a recursive schema must descend into the value
  (``properties``, ``items``...) on its way round, as a tree's does.

``schema_problem`` runs them all, in that order (jsonschema's own ``check_schema`` after the
depth, which it would not survive, and before the rest, which assume valid JSON Schema), and
says what is wrong in a sentence that callers put after whose schema it is, in a
``ConfigError``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from agent_fsm.tools.patterns import pattern_problem

__all__ = ["MAX_SCHEMA_DEPTH", "depth_problem", "schema_problem"]

MAX_SCHEMA_DEPTH = 64
"""The deepest schema accepted: JSON objects and arrays nested within one another (a
``{"type": "object", "properties": {"a": ...}}`` level is two), and the longest chain of
``$ref`` and in-place subschemas one value meets. Real schemas stay far below it (pydantic's
nest through ``$defs``; OpenAI's strict mode allows ten object levels); jsonschema's recursion
exhausts the stack past ~190."""


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Every check, in order: what is wrong with ``schema``, or None. The depth first, before
    anything recursive reads it; then jsonschema's own ``check_schema``; every ``$ref``
    resolving inside it; then the patterns, loops and chains (``_evaluation_problem``)."""
    problem = depth_problem(schema)
    if problem is not None:
        return problem
    try:
        Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"the schema is not valid JSON Schema at {where}: {exc.message}"
    unresolvable = _unresolvable_refs(schema)
    if unresolvable:
        return (
            f"the schema's $refs refer to what they do not define: {', '.join(unresolvable)} "
            "(every $ref must point inside the schema, e.g. #/$defs/...)"
        )
    return _evaluation_problem(schema)


def depth_problem(document: object) -> str | None:
    """Why ``document`` is too deep to read safely, or None.

    Walks without recursion and visits a shared object once, so a hostile document costs
    time in its size, never in its depth or in the paths through it.
    """
    height = _height(document)
    if height is None:
        return "the schema contains itself (a Python object cycle): it is not JSON"
    if height > MAX_SCHEMA_DEPTH:
        return (
            f"the schema is nested {height} levels deep (JSON objects and arrays within one "
            f"another); at most {MAX_SCHEMA_DEPTH} are accepted"
        )
    return None


def _height(document: object) -> int | None:
    """Levels of containers in ``document``; None when a container contains itself."""
    heights: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[object, bool]] = [(document, False)]
    while stack:
        node, finished = stack.pop()
        children = _contents(node)
        if children is None:
            continue
        key = id(node)
        if finished:
            open_.discard(key)
            below = (heights[id(c)] for c in children if _contents(c) is not None)
            heights[key] = 1 + max(below, default=0)
        elif key in open_:
            return None
        elif key not in heights:
            open_.add(key)
            stack.append((node, True))
            stack.extend((child, False) for child in children)
    return heights.get(id(document), 0)


def _contents(node: object) -> list[object] | None:
    if isinstance(node, Mapping):
        return list(node.values())
    if isinstance(node, list | tuple):
        return list(node)
    return None


def _unresolvable_refs(schema: Mapping[str, Any]) -> list[str]:
    """The ``$ref`` and ``$dynamicRef`` values of ``schema`` that do not resolve within it:
    found here, not when the model first calls the tool (where the validator would raise
    inside the run). Nothing is fetched: a run's validation never touches the network."""
    resolver = _registry(schema).resolver("")
    bad = []
    for ref in _refs(schema):
        try:
            resolver.lookup(ref)
        except Unresolvable:
            bad.append(ref)
    return bad


def _registry(schema: Mapping[str, Any]) -> Registry[Any]:
    registry: Registry[Any] = Registry().with_resource("", DRAFT202012.create_resource(schema))
    return registry


def _refs(schema: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            for keyword in _REFS:
                ref = node.get(keyword)
                if isinstance(ref, str):
                    found.append(ref)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


# -- what validation can reach ------------------------------------------------------------------

_REFS = ("$ref", "$dynamicRef")
_IN_PLACE = ("not", "if", "then", "else")
"""Keywords whose subschema applies to the same value (so a loop through them never ends)."""
_IN_PLACE_LISTS = ("allOf", "anyOf", "oneOf")
_IN_PLACE_MAPS = ("dependentSchemas",)
_INTO = (
    "items",
    "contains",
    "additionalProperties",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
)
"""Keywords whose subschema applies to a part of the value."""
_INTO_LISTS = ("prefixItems",)
_INTO_MAPS = ("properties", "patternProperties")


@dataclass(slots=True)
class _Node:
    """One subschema that validation can apply, as the walk found it."""

    schema: Mapping[str, Any]
    where: str
    resolver: Any
    """referencing's resolver at this subschema (its ``$id`` base), for its ``$ref``."""
    in_place: list[int]
    """The ``id`` of each subschema applied to the same value (``$ref`` targets included)."""


def _subschemas(schema: Mapping[str, Any]) -> Iterator[tuple[str, object, bool]]:
    """Each subschema of ``schema``: where it is, it, and whether it applies in place."""
    for keyword in (*_IN_PLACE, *_INTO):
        if keyword in schema:
            yield keyword, schema[keyword], keyword in _IN_PLACE
    for keyword in (*_IN_PLACE_LISTS, *_INTO_LISTS):
        items = schema.get(keyword)
        if isinstance(items, list):
            for index, item in enumerate(items):
                yield f"{keyword}/{index}", item, keyword in _IN_PLACE_LISTS
    for keyword in (*_IN_PLACE_MAPS, *_INTO_MAPS):
        named = schema.get(keyword)
        if isinstance(named, Mapping):
            for name, item in named.items():
                yield f"{keyword}/{name}", item, keyword in _IN_PLACE_MAPS


def _walk(schema: Mapping[str, Any]) -> tuple[dict[int, _Node], str | None]:
    """Every subschema validation can apply, from the root and through each ``$ref``, and
    the first ``$ref`` that cannot be followed (None when all can)."""
    root = _Node(schema, "", _registry(schema).resolver(""), [])
    nodes = {id(schema): root}
    stack = [root]
    while stack:
        node = stack.pop()
        found: list[tuple[str, object, Any, bool]] = []
        for where, sub, in_place in _subschemas(node.schema):
            found.append((_join(node.where, where), sub, None, in_place))
        for keyword in _REFS:
            ref = node.schema.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolved = node.resolver.lookup(ref)
            except Unresolvable:
                return nodes, ref
            where = ref.partition("#")[2].strip("/") or ref
            found.append((where, resolved.contents, resolved.resolver, True))
        for where, sub, resolver, in_place in found:
            if not isinstance(sub, Mapping):
                continue
            if in_place:
                node.in_place.append(id(sub))
            if id(sub) in nodes:
                continue
            if resolver is None:
                resolver = node.resolver.in_subresource(DRAFT202012.create_resource(sub))
            child = _Node(sub, where, resolver, [])
            nodes[id(sub)] = child
            stack.append(child)
    return nodes, None


def _join(base: str, where: str) -> str:
    return f"{base}/{where}" if base else where


def _evaluation_problem(schema: Mapping[str, Any]) -> str | None:
    """Why validating against ``schema`` (valid JSON Schema, no deeper than
    ``MAX_SCHEMA_DEPTH``) could stall or never end, or None: a pattern the linear engine
    refuses, ``unevaluatedProperties`` beside ``patternProperties``, a loop or an overlong
    chain of subschemas applied to one value."""
    nodes, unfollowed = _walk(schema)
    if unfollowed is not None:
        return f"the $ref {unfollowed!r} cannot be followed"
    for node in nodes.values():
        problem = _pattern_problem(node)
        if problem is not None:
            return problem
    if any("unevaluatedProperties" in n.schema for n in nodes.values()) and any(
        "patternProperties" in n.schema for n in nodes.values()
    ):
        return (
            "unevaluatedProperties cannot be used beside patternProperties: jsonschema "
            "evaluates those patterns for it with Python's backtracking re, which a crafted "
            "property name can keep busy for hours (use additionalProperties instead)"
        )
    return _chain_problem(nodes)


def _pattern_problem(node: _Node) -> str | None:
    patterns: list[tuple[str, object]] = []
    if "pattern" in node.schema:
        patterns.append((_join(node.where, "pattern"), node.schema["pattern"]))
    named = node.schema.get("patternProperties")
    if isinstance(named, Mapping):
        patterns.extend((_join(node.where, "patternProperties"), key) for key in named)
    for where, pattern in patterns:
        refused = pattern_problem(pattern) if isinstance(pattern, str) else None
        if refused is not None:
            return (
                f"the pattern {pattern!r} at {where} cannot be used: {refused}. Patterns run "
                "on a linear-time engine (pydantic-core's Rust regex), so that no value can "
                "keep validation busy; it has no look-around, backreferences or \\Z (use \\z)"
            )
    return None


def _chain_problem(nodes: dict[int, _Node]) -> str | None:
    """A loop, or the longest chain, of subschemas applied to one value: found without
    recursion (depth first, with an explicit stack; each subschema's longest chain is worked
    out once, so the cost is linear in the subschemas and their links)."""
    longest: dict[int, int] = {}
    for start in nodes:
        stack: list[tuple[int, int]] = [(start, 0)]
        on_path: set[int] = set()
        while stack:
            key, index = stack.pop()
            if key in longest:
                continue
            node = nodes[key]
            if index == 0:
                if key in on_path:
                    return (
                        f"the subschema at {node.where or '(root)'} leads back to itself "
                        "through $ref/allOf/anyOf/oneOf/not/if/then/else without descending "
                        "into the value, so validating any value would never end"
                    )
                on_path.add(key)
            if index < len(node.in_place):
                stack.append((key, index + 1))
                stack.append((node.in_place[index], 0))
                continue
            on_path.discard(key)
            longest[key] = 1 + max((longest[c] for c in node.in_place), default=0)
            if longest[key] > MAX_SCHEMA_DEPTH:
                return (
                    f"the subschema at {node.where or '(root)'} starts a chain of "
                    f"{longest[key]} subschemas applied to one value ($ref, allOf, anyOf, "
                    f"...); at most {MAX_SCHEMA_DEPTH} are accepted"
                )
    return None
