"""Tools: definitions, the registry, argument validation and execution.

A tool failure is an observation, not an exception: an unknown tool, arguments that are not
JSON, a schema violation (every error, with its path), an exception raised by the tool and a
timeout each become an error ``ToolMessage`` that tells the model how to correct itself.
Nothing raised by a tool escapes ``ToolRegistry.run``.

Invalid *definitions* are the developer's mistake and raise ``ConfigError`` when the tool is
defined: a name providers reject, a parameters schema that is not valid JSON Schema, two tools
with one name.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

import jsonschema
from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, create_model
from pydantic import ValidationError as PydanticValidationError

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ToolCall, ToolMessage, ToolSpec, ToolStatus
from agent_fsm.state import ControlKind

__all__ = [
    "ASK_USER",
    "FINISH_TASK",
    "PreparedCall",
    "Tool",
    "ToolRegistry",
    "tool",
]

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Tool names every major provider accepts."""

ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call.

    Args:
        name: what the model calls it; must match ``^[a-zA-Z0-9_-]{1,64}$``.
        description: what it does, for the model.
        parameters: JSON Schema (Draft 2020-12) of the arguments object.
        fn: the implementation, called with the validated arguments as keyword arguments.
            Sync functions run in a worker thread so they never block the event loop.
        control: set only for the built-in control-flow tools, which the engine handles
            itself instead of calling ``fn``.

    Raises:
        ConfigError: for an invalid name or schema, naming the tool.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFunction | None = None
    control: ControlKind | None = None
    validator: Draft202012Validator = field(init=False, repr=False, compare=False)
    is_async: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise ConfigError(
                f"tool name {self.name!r} is invalid: providers accept only letters, digits, "
                "'_' and '-', 1 to 64 characters"
            )
        if self.fn is None and self.control is None:
            raise ConfigError(f"tool {self.name!r} has no function to call")
        if not isinstance(self.parameters, Mapping):
            raise ConfigError(f"tool {self.name!r}: parameters must be a JSON Schema object")
        try:
            Draft202012Validator.check_schema(self.parameters)
        except jsonschema.SchemaError as exc:
            where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
            raise ConfigError(
                f"tool {self.name!r}: parameters are not valid JSON Schema at {where}: "
                f"{exc.message}"
            ) from None
        if self.parameters.get("type") != "object":
            raise ConfigError(
                f'tool {self.name!r}: the parameters schema must have "type": "object" '
                "(tool arguments are always a JSON object)"
            )
        object.__setattr__(self, "validator", Draft202012Validator(self.parameters))
        object.__setattr__(self, "is_async", inspect.iscoroutinefunction(self.fn))

    @property
    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(
            name=self.name, description=self.description, parameters=dict(self.parameters)
        )


def _schema_from_signature(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    """JSON Schema of ``fn``'s keyword arguments, derived through pydantic."""
    try:
        hints = get_type_hints(fn, include_extras=True)
        fields: dict[str, Any] = {}
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"*{param.name} arguments cannot be described to a model")
            annotation = hints.get(param.name, Any)
            default = ... if param.default is inspect.Parameter.empty else param.default
            fields[param.name] = (annotation, default)
        model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
        schema: dict[str, Any] = model.model_json_schema()
    except (TypeError, NameError, PydanticValidationError, ValueError) as exc:
        raise ConfigError(f"tool {name!r}: cannot derive a JSON Schema: {exc}") from None
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return schema


def tool(
    fn: ToolFunction | None = None, *, name: str | None = None, description: str | None = None
) -> Any:
    """Make a ``Tool`` from a function: name from the function, description from its
    docstring, parameters schema from its type hints. Usable bare (``@tool``) or with
    arguments (``@tool(name="lookup")``)."""

    def build(f: ToolFunction) -> Tool:
        tool_name = name or f.__name__
        doc = inspect.getdoc(f) or ""
        summary = description or doc.split("\n\n", 1)[0].strip() or tool_name
        return Tool(tool_name, summary, _schema_from_signature(f, tool_name), f)

    return build(fn) if fn is not None else build


ASK_USER = Tool(
    "ask_user",
    "Ask the user a question and stop until they answer. Use it when you cannot go on "
    "without information only the user has.",
    {
        "type": "object",
        "properties": {"question": {"type": "string", "minLength": 1}},
        "required": ["question"],
        "additionalProperties": False,
    },
    control=ControlKind.ASK_USER,
)

FINISH_TASK = Tool(
    "finish_task",
    "Declare the task complete and stop. Give a summary of the outcome for the user.",
    {
        "type": "object",
        "properties": {"summary": {"type": "string"}},
        "required": ["summary"],
        "additionalProperties": False,
    },
    control=ControlKind.FINISH_TASK,
)


@dataclass(slots=True)
class PreparedCall:
    """A tool call after lookup, JSON parsing and schema validation."""

    call: ToolCall
    tool: Tool | None
    arguments: dict[str, Any] | None
    """The parsed arguments, or None when they were not a JSON object."""
    error: str | None
    """Why the call cannot run, worded for the model; None when it is valid."""


def _format_schema_errors(tool_name: str, errors: list[jsonschema.ValidationError]) -> str:
    lines = [f"Invalid arguments for tool '{tool_name}':"]
    for err in sorted(errors, key=lambda e: [str(p) for p in e.absolute_path]):
        where = "/".join(str(p) for p in err.absolute_path) or "(arguments)"
        lines.append(f"- at {where}: {err.message}")
    lines.append("Call the tool again with arguments that match its schema.")
    return "\n".join(lines)


def serialise_output(value: Any) -> str:
    """Text for the model from a tool's return value: str as is, models and data as JSON.

    Raises:
        TypeError: when the value has no JSON form.
    """
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False)


class ToolRegistry:
    """The tools of one agent, by name; validators are built once, when tools are defined."""

    __slots__ = ("_specs", "_tools")

    def __init__(self, tools: Iterable[Tool]) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            if not isinstance(item, Tool):
                raise ConfigError(
                    f"{item!r} is not a Tool: decorate the function with @tool or wrap it "
                    "in Tool(name, description, parameters, fn)"
                )
            if item.name in self._tools:
                raise ConfigError(f"two tools are named {item.name!r}; tool names must be unique")
            self._tools[item.name] = item
        self._specs = tuple(t.spec for t in self._tools.values())

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """Every tool as the model sees it, in registration order."""
        return self._specs

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def prepare(self, call: ToolCall) -> PreparedCall:
        """Look the tool up, parse and validate the arguments. Must not raise."""
        found = self._tools.get(call.name)
        if found is None:
            available = ", ".join(self._tools) or "(none)"
            return PreparedCall(
                call, None, None,
                f"Unknown tool '{call.name}'. Available tools: {available}.",
            )  # fmt: skip
        try:
            arguments = json.loads(call.arguments) if call.arguments.strip() else {}
        except ValueError as exc:
            return PreparedCall(
                call, found, None,
                f"The arguments for tool '{call.name}' are not valid JSON ({exc}). Send them "
                "as one JSON object that matches the tool's schema.",
            )  # fmt: skip
        if not isinstance(arguments, dict):
            return PreparedCall(
                call, found, None,
                f"The arguments for tool '{call.name}' must be a JSON object, "
                f"not {type(arguments).__name__}.",
            )  # fmt: skip
        errors = list(found.validator.iter_errors(arguments))
        if errors:
            return PreparedCall(call, found, arguments, _format_schema_errors(call.name, errors))
        return PreparedCall(call, found, arguments, None)

    async def run(self, prepared: PreparedCall, timeout_s: float) -> ToolMessage:
        """Execute a prepared call and answer it. Must not raise: every failure is a result."""
        call = prepared.call
        if prepared.error is not None:
            return error_result(call, prepared.error)
        assert prepared.tool is not None
        assert prepared.tool.fn is not None
        assert prepared.arguments is not None
        fn, arguments = prepared.tool.fn, prepared.arguments
        try:
            async with asyncio.timeout(timeout_s):
                if prepared.tool.is_async:
                    value = await fn(**arguments)
                else:
                    value = await asyncio.to_thread(fn, **arguments)
        except TimeoutError:
            return error_result(call, f"Tool '{call.name}' timed out after {timeout_s:g} s.")
        except Exception as exc:
            return error_result(call, f"Tool '{call.name}' failed: {type(exc).__name__}: {exc}")
        try:
            output = serialise_output(value)
        except (TypeError, ValueError) as exc:
            return error_result(
                call,
                f"Tool '{call.name}' returned a value that cannot be sent to the model "
                f"({type(value).__name__}: {exc}).",
            )
        return ToolMessage(tool_call_id=call.id, name=call.name, content=output)


def error_result(call: ToolCall, message: str) -> ToolMessage:
    """An error answer to ``call`` that the model can correct from."""
    return ToolMessage(
        tool_call_id=call.id, name=call.name, content=message, status=ToolStatus.ERROR
    )


def skipped_result(call: ToolCall, reason: str) -> ToolMessage:
    """An answer to a call that was never run, so the transcript stays valid."""
    return ToolMessage(
        tool_call_id=call.id, name=call.name, content=f"Skipped: {reason}",
        status=ToolStatus.SKIPPED,
    )  # fmt: skip
