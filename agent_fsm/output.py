"""Typed output: what a run's final answer must be, and how the model is held to it.

``Agent(output_type=Invoice)`` (a pydantic model) or ``output_type={...}`` (a JSON Schema of an
object) makes the run's answer a validated value, ``RunResult.value``. Two ways to get it:

* ``output_mode="tool"`` (the default, for every model): the agent offers a terminal tool,
  ``final_result``, whose parameters are the output schema. The tool runtime validates the
  model's arguments against the schema like any call's, then the pydantic model validates them
  again (its own validators may say more than the schema); a successful call ends the run
  (``terminal_tool``) with the value's JSON as the output. A reply in plain text, or a call
  that fails validation, goes back to the model with what was wrong.
* ``output_mode="native"``, for models that constrain their reply to a JSON Schema
  themselves (``supports_native_output``): the schema travels in ``ModelRequest.output`` and
  the reply's text is validated; invalid text goes back to the model with the errors.

Every correction is a model call, so it counts as a turn against ``max_turns``, the token
budget and the termination bound; ``Limits.output_retries`` bounds the failures, after which
the run stops in ERROR ``invalid_output``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
from jsonschema.protocols import Validator
from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from agent_fsm.errors import ConfigError
from agent_fsm.messages import OutputFormat, ToolMessage
from agent_fsm.state import RunResult, RunStatus
from agent_fsm.table import StopReason
from agent_fsm.tools.patterns import backtracking_problem, schema_validator
from agent_fsm.tools.results import ToolResult
from agent_fsm.tools.schema_checks import depth_problem, schema_problem
from agent_fsm.tools.tool import NAME_PATTERN, Tool

__all__ = [
    "DEFAULT_TOOL_NAME",
    "OutputInvalid",
    "OutputMode",
    "OutputSpec",
    "OutputType",
    "typed_result",
]

OutputType = type[BaseModel] | Mapping[str, Any]
"""A pydantic model class, or a JSON Schema (Draft 2020-12) of an object."""
OutputMode = Literal["tool", "native"]

DEFAULT_TOOL_NAME = "final_result"
"""The output tool's name unless ``OutputSpec(tool_name=...)`` says otherwise."""

_MAX_ERRORS_SHOWN = 8


class OutputInvalid(ValueError):
    """A final answer does not validate; the message says why, for the model."""


@dataclass(frozen=True)
class OutputSpec:
    """An agent's output type, ready to hold the model to it.

    Raises:
        ConfigError: for an output type that is neither a pydantic model nor the JSON
            Schema of an object, an invalid schema or tool name, or an unknown mode.
    """

    output_type: OutputType
    mode: OutputMode = "tool"
    tool_name: str = DEFAULT_TOOL_NAME
    schema: dict[str, Any] = field(init=False, repr=False)
    _validator: Validator = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.mode not in ("tool", "native"):
            raise ConfigError(f"output_mode must be 'tool' or 'native', got {self.mode!r}")
        if not isinstance(self.tool_name, str) or not NAME_PATTERN.match(self.tool_name):
            raise ConfigError(f"output tool name {self.tool_name!r} is invalid")
        schema = _schema_of(self.output_type)
        object.__setattr__(self, "schema", schema)
        object.__setattr__(self, "_validator", schema_validator(schema))

    @property
    def model(self) -> type[BaseModel] | None:
        """The pydantic model, when the output type is one."""
        kind = self.output_type
        return kind if isinstance(kind, type) and issubclass(kind, BaseModel) else None

    @property
    def format(self) -> OutputFormat:
        """The schema as a model request carries it (native mode)."""
        name = self.model.__name__ if self.model is not None else "output"
        return OutputFormat(name=name, schema=self.schema)

    def tool(self) -> Tool:
        """The terminal tool the model calls with the output as its arguments (tool mode)."""
        description = (
            "Give the final result, as this tool's arguments. Call it once, when the task "
            "is done; the run ends with it."
        )
        doc = self.schema.get("description")
        if isinstance(doc, str) and doc.strip():
            description += f" The result: {doc.strip()}"
        return Tool(self.tool_name, description, self.schema, self._deliver, terminal=True)

    def parse(self, text: str) -> Any:
        """The validated value of an output given as JSON text.

        Raises:
            OutputInvalid: the text is not JSON, or does not validate; the message lists the
                problems for the model.
        """
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise OutputInvalid(f"the reply is not JSON ({exc})") from None
        except RecursionError:
            raise OutputInvalid("the reply is nested too deeply to be read as JSON") from None
        return self._validate(data)

    def correction(self, problem: str | None) -> str:
        """The message that sends an answer back to the model: what was wrong, what to do."""
        if self.mode == "tool":
            return (
                f"Your reply did not give the result. End the task by calling the "
                f"`{self.tool_name}` tool with the result as its arguments; a reply in plain "
                "text is not accepted."
            )
        return (
            f"Your reply is not a valid result: {problem}. Reply with only the JSON value, "
            "matching the schema you were given."
        )

    # -- internals

    def _deliver(self, **arguments: Any) -> ToolResult:
        """The output tool: validate the arguments into the value; its JSON is the output."""
        value = self._validate(arguments)
        return ToolResult(_dump(value))

    def _validate(self, data: Any) -> Any:
        try:  # linear-time patterns, a checked schema: only a value past the stack can raise
            found = list(self._validator.iter_errors(data))
        except RecursionError:
            raise OutputInvalid("the result is nested too deeply to validate") from None
        errors = sorted(found, key=lambda e: list(e.absolute_path))
        if errors:
            raise OutputInvalid(_describe(errors))
        model = self.model
        if model is None:
            return data
        try:
            return model.model_validate(data)
        except PydanticValidationError as exc:
            problems = [
                f"{'/'.join(str(p) for p in error['loc']) or '(root)'}: {error['msg']}"
                for error in exc.errors()[:_MAX_ERRORS_SHOWN]
            ]
            raise OutputInvalid("; ".join(problems)) from None


def typed_result(result: RunResult, spec: OutputSpec) -> RunResult:
    """``result`` with ``value`` set when the run completed with its output: the output tool
    ended it (tool mode) or its final answer did (native mode; the text validated already,
    or the run would have gone on)."""
    if result.status is not RunStatus.COMPLETED or result.output is None:
        return result
    if spec.mode == "tool":
        ending = _ending_result(result)
        if ending is None or ending.name != spec.tool_name:
            return result
    elif result.stop_reason is not StopReason.FINAL_ANSWER:
        return result
    try:
        value = spec.parse(result.output)
    except OutputInvalid:  # a harness double answered for the output tool, say
        return result
    return result.model_copy(update={"value": value})


def _ending_result(result: RunResult) -> ToolMessage | None:
    """The result of the terminal call that ended the run, if one did."""
    if result.stop_reason is not StopReason.TERMINAL_TOOL:
        return None
    for message in reversed(result.messages):
        if isinstance(message, ToolMessage):
            details = message.details
            runtime = details.get("runtime") if isinstance(details, dict) else None
            if isinstance(runtime, dict) and runtime.get("ends_run") is True:
                return message
    return None


def _schema_of(output_type: object) -> dict[str, Any]:
    """The output type's JSON Schema, checked as a tool's parameters are (``Tool``): deep
    schemas, unresolvable references, patterns the linear engine refuses, loops, and a
    pydantic model that would match with Python's ``re`` are refused here, at construction,
    never met in a run."""
    if isinstance(output_type, type) and issubclass(output_type, BaseModel):
        problem = backtracking_problem(output_type)
        if problem is not None:
            raise ConfigError(f"output_type {output_type.__name__}: {problem}")
        try:
            schema = output_type.model_json_schema()
        except RecursionError:
            raise ConfigError(
                f"output_type {output_type.__name__}: its JSON Schema is nested too deeply to "
                "be made"
            ) from None
    elif isinstance(output_type, Mapping):
        problem = depth_problem(output_type)  # first: the copy below recurses
        if problem is not None:
            raise ConfigError(f"output_type: {problem}")
        schema = json.loads(json.dumps(output_type))  # a private copy, and JSON-able
    else:
        raise ConfigError(
            "output_type must be a pydantic model class or a JSON Schema (a dict), got "
            f"{output_type!r}"
        )
    problem = schema_problem(schema)
    if problem is not None:
        raise ConfigError(f"output_type: {problem}")
    if schema.get("type") != "object":
        raise ConfigError(
            'output_type must describe an object ("type": "object"): wrap a list or a '
            'scalar in one, e.g. {"type": "object", "properties": {"items": ...}}'
        )
    return schema


def _describe(errors: list[jsonschema.ValidationError]) -> str:
    shown = [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in errors[:_MAX_ERRORS_SHOWN]
    ]
    more = len(errors) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more > 0 else "")


def _dump(value: Any) -> str:
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    return json.dumps(value, ensure_ascii=False)
