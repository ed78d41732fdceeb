"""Tool schemas from Python functions: the JSON Schema of the parameters, the description, and
the pydantic model that turns validated JSON into the Python values the function expects.

The schema comes from the type hints through pydantic (``Literal`` becomes ``enum``, defaults
make a parameter optional, pydantic models nest through ``$defs``, ``Annotated[..., Field(...)]``
constraints carry over), and each parameter's description from the docstring, Google, NumPy or
reST style, parsed by ``docstring_parser``. A signature that cannot be described raises
``ConfigError`` naming the tool: that is the developer's mistake, found at definition.

``fast_check`` compiles a quick validity test for the common flat schemas, so that the full
JSON Schema validator runs only to confirm and explain a rejection.
"""

from __future__ import annotations

import inspect
import types
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin, get_type_hints

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from agent_fsm.errors import ConfigError

__all__ = ["DerivedSchema", "derive_schema", "describe_function", "fast_check"]

# Types whose JSON form, once it passed the JSON Schema, already is the Python value the
# function expects: arguments made only of these skip the pydantic pass (it costs a few µs).
_JSON_NATIVE: frozenset[Any] = frozenset({str, int, float, bool, type(None), Any, object})
_CONTAINERS: frozenset[Any] = frozenset({list, dict})


@dataclass(frozen=True, slots=True)
class DerivedSchema:
    """What a function's signature and docstring say about its parameters."""

    parameters: dict[str, Any]
    """JSON Schema (Draft 2020-12) of the arguments object."""
    arguments_model: type[BaseModel] | None
    """Validates JSON arguments into Python values; None when they need no conversion."""


def describe_function(fn: Callable[..., Any], name: str) -> str:
    """The summary line(s) of ``fn``'s docstring, or ``name`` when it has none.

    Only the short description is sent: the long description and the parameter sections are
    for people, and the parameters reach the model through their schema.
    """
    doc = inspect.getdoc(fn) or ""
    try:
        summary = docstring_parser.parse(doc).short_description or ""
    except docstring_parser.ParseError:
        summary = doc.split("\n\n", 1)[0]
    return summary.strip() or name


def _parameter_docs(fn: Callable[..., Any]) -> dict[str, str]:
    doc = inspect.getdoc(fn) or ""
    try:
        parsed = docstring_parser.parse(doc)
    except docstring_parser.ParseError:
        return {}
    return {p.arg_name: " ".join(p.description.split()) for p in parsed.params if p.description}


def _is_json_native(annotation: Any, *, nested: bool = False) -> bool:
    """True when a JSON value that matches the schema of ``annotation`` is already of it. An
    ``int`` is, at the top level only: JSON Schema's integer accepts ``2.0``, which the tool
    layer turns into ``2`` for top-level parameters (``integer_parameters``); a nested one
    needs the arguments model to convert it."""
    if annotation in _JSON_NATIVE:
        return not (nested and annotation is int)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Annotated:
        return all(isinstance(m, FieldInfo) for m in annotation.__metadata__) and _is_json_native(
            args[0], nested=nested
        )
    if origin is Literal:
        return all(isinstance(a, str | int | bool) or a is None for a in args)
    if origin in (Union, types.UnionType):
        return all(_is_json_native(a, nested=nested) for a in args)
    if annotation in _CONTAINERS:
        return True
    if origin is list:
        return all(_is_json_native(a, nested=True) for a in args)
    if origin is dict:
        return (not args or args[0] is str) and all(
            _is_json_native(a, nested=True) for a in args[1:]
        )
    return False


def integer_parameters(parameters: Mapping[str, Any]) -> frozenset[str]:
    """The top-level parameters a schema types as integers (alone, or in an ``anyOf`` such
    as ``int | None``): a JSON number like ``2.0`` passes their validation and must reach the
    function as ``2``."""

    def integer(node: object) -> bool:
        return isinstance(node, Mapping) and node.get("type") == "integer"

    properties = parameters.get("properties")
    if not isinstance(properties, Mapping):
        return frozenset()
    return frozenset(
        name
        for name, node in properties.items()
        if integer(node)
        or (isinstance(node, Mapping) and any(integer(o) for o in node.get("anyOf") or ()))
    )


def _strip_titles(node: Any) -> None:
    """Remove pydantic's generated ``title`` keywords (noise to a model), in place.

    Walks schema keywords only, so a property that is *named* "title" survives.
    """
    if isinstance(node, list):
        for item in node:
            _strip_titles(item)
        return
    if not isinstance(node, dict):
        return
    if isinstance(node.get("title"), str):
        del node["title"]
    for key in ("properties", "$defs", "patternProperties"):
        for sub in (node.get(key) or {}).values():
            _strip_titles(sub)
    for key in ("items", "additionalProperties", "not", "if", "then", "else", "contains"):
        _strip_titles(node.get(key))
    for key in ("anyOf", "allOf", "oneOf", "prefixItems"):
        _strip_titles(node.get(key))


def derive_schema(fn: Callable[..., Any], name: str) -> DerivedSchema:
    """The parameters schema of ``fn`` and the model that coerces its arguments.

    Raises:
        ConfigError: naming the tool, when a parameter cannot be described (``*args``,
            ``**kwargs``, positional-only parameters, types pydantic cannot express).
    """
    try:
        hints = get_type_hints(fn, include_extras=True)
        described = _parameter_docs(fn)
        fields: dict[str, Any] = {}
        native = True
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"*{param.name} arguments cannot be described to a model")
            if param.kind is param.POSITIONAL_ONLY:
                raise TypeError(f"parameter {param.name!r} is positional-only")
            if param.name not in hints:
                raise TypeError(
                    f"parameter {param.name!r} has no type annotation, so the model would be "
                    f"told it accepts anything: annotate it ({param.name}: str, ...), or "
                    f"{param.name}: Any to accept any JSON value on purpose"
                )
            annotation = hints[param.name]
            native = native and _is_json_native(annotation)
            default = ... if param.default is inspect.Parameter.empty else param.default
            description = described.get(param.name)
            if description is not None and not _has_description(annotation):
                fields[param.name] = (annotation, Field(default, description=description))
            else:
                fields[param.name] = (annotation, default)
        with warnings.catch_warnings():
            # A parameter named like a BaseModel attribute ("json", "schema") is fine here:
            # the model is only used to validate, and values are read from its __dict__.
            warnings.filterwarnings("ignore", "Field name .* shadows", UserWarning)
            model = create_model(
                f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields
            )
        schema: dict[str, Any] = model.model_json_schema()
    except Exception as exc:  # pydantic's schema errors have no common base worth naming
        raise ConfigError(f"tool {name!r}: cannot derive a JSON Schema: {_describe(exc)}") from None
    _strip_titles(schema)
    schema.setdefault("properties", {})
    return DerivedSchema(schema, None if native else model)


def _has_description(annotation: Any) -> bool:
    if get_origin(annotation) is not Annotated:
        return False
    return any(isinstance(m, FieldInfo) and m.description for m in annotation.__metadata__)


def _describe(exc: BaseException) -> str:
    """The first line of the message (without pydantic's trailing links), after the
    exception's name unless it is a builtin one: pydantic's own classes say what failed, and
    which of them is raised (some subclass TypeError) varies between its versions."""
    first_line = str(exc).strip().split("\n", 1)[0]
    kind = type(exc)
    return first_line if kind.__module__ == "builtins" else f"{kind.__name__}: {first_line}"


_TYPE_TESTS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: type(v) is str,
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}
_ANNOTATIONS = frozenset({"description", "default", "title", "examples"})


def _property_check(schema: Any) -> Callable[[Any], bool] | None:
    """A test for a property schema made only of a primitive type (and annotations)."""
    if not isinstance(schema, Mapping) or not set(schema) <= _ANNOTATIONS | {"type"}:
        return None
    kind = schema.get("type")
    return _TYPE_TESTS.get(kind) if isinstance(kind, str) else None


def fast_check(schema: Mapping[str, Any]) -> Callable[[dict[str, Any]], bool] | None:
    """A quick validity test for a flat object schema of primitive properties, or None.

    JSON Schema validation costs several µs per call, a noticeable share of a turn; most tool
    schemas are this simple. The test may reject valid arguments (1.0 for an integer) but
    never accepts invalid ones: a rejection goes to the full validator, which decides and
    explains.
    """
    if not set(schema) <= _ANNOTATIONS | {"type", "properties", "required", "additionalProperties"}:
        return None
    extra = schema.get("additionalProperties", True)
    properties = schema.get("properties", {})
    required = tuple(schema.get("required", ()))
    if not isinstance(extra, bool) or not isinstance(properties, Mapping):
        return None
    tests = {name: _property_check(sub) for name, sub in properties.items()}
    if any(test is None for test in tests.values()):
        return None
    checks: dict[str, Callable[[Any], bool]] = {k: t for k, t in tests.items() if t is not None}
    closed = extra is False

    def check(arguments: dict[str, Any]) -> bool:
        for name in required:
            if name not in arguments:
                return False
        for name, value in arguments.items():
            test = checks.get(name)
            if test is None:
                if closed:
                    return False
            elif not test(value):
                return False
        return True

    return check
