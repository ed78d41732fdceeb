"""Tools: definitions, the registry, and argument validation.

A tool failure is an observation, not an exception: an unknown tool, arguments that are not
JSON, a schema violation (every error, with its path) or arguments that do not convert to the
function's types each become an error ``ToolMessage`` that tells the model how to correct
itself (worded in ``arguments.py``). Running a prepared call (timeouts, threads, retries,
output limits) is ``execution.py``'s job.

Invalid *definitions* are the developer's mistake and raise ``ConfigError`` when the tool is
defined: a name providers reject, a parameters schema that is not valid JSON Schema or that
validation could not survive (too deep, a ``$ref`` loop, a pattern no linear-time engine
takes: ``schema_checks.py``), a signature that cannot be described, a bad timeout or retry
setting, two tools with one name. Validation matches patterns in linear time
(``patterns.py``), so no argument can hold the event loop.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, overload

from jsonschema.protocols import Validator
from pydantic import BaseModel, JsonValue
from pydantic import ValidationError as PydanticValidationError
from pydantic_core import from_json

from agent_fsm.errors import ConfigError
from agent_fsm.messages import ToolCall, ToolSpec
from agent_fsm.state import ControlKind
from agent_fsm.tools.arguments import (
    UNPARSED,
    conversion_errors,
    quoted,
    schema_errors,
    with_lone_surrogates,
)
from agent_fsm.tools.patterns import backtracking_problem, schema_validator
from agent_fsm.tools.results import ToolResult, error_result, serialise_output, skipped_result
from agent_fsm.tools.schema_checks import schema_problem
from agent_fsm.tools.schemas import (
    derive_schema,
    describe_function,
    fast_check,
    integer_parameters,
)

__all__ = [
    "ASK_USER",
    "FINISH_TASK",
    "ApprovalPredicate",
    "PreparedCall",
    "Tool",
    "ToolRegistry",
    "ToolResult",
    "error_result",
    "serialise_output",
    "skipped_result",
    "tool",
]

NAME_PATTERN = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
"""Tool names every major provider accepts."""

ToolFunction = Callable[..., Any] | Callable[..., Awaitable[Any]]

ApprovalPredicate = Callable[[dict[str, Any]], bool]
"""Decides from a call's validated JSON arguments whether a person must approve it first."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call.

    Args:
        name: what the model calls it; must match ``^[a-zA-Z0-9_-]{1,64}$``.
        description: what it does, for the model.
        parameters: JSON Schema (Draft 2020-12) of the arguments object.
        fn: the implementation, called with the validated arguments as keyword arguments.
            Sync functions run in a daemon worker thread so they never block the event loop.
        control: set only for the built-in control-flow tools, which the engine handles
            itself instead of calling ``fn``.
        timeout_s: seconds one call may take; ``Limits.tool_timeout_s`` when None.
        max_output_chars: longest output sent to the model before it is cut;
            ``Limits.tool_max_output_chars`` when None.
        sequential: never run a call of this tool alongside other calls of the same reply.
        idempotent: running a call twice does no harm, so it may be retried on the errors
            in ``retry_on``, and re-run after an interruption. Never assumed.
        retry_on: exception types that count as transient for an idempotent tool.
        max_retries: retries after the first attempt; ``Limits.tool_max_retries`` when None.
        requires_approval: True, or a predicate over the validated JSON arguments, when a
            person must approve a call before it runs (a predicate that raises counts as
            "needs approval").
        arguments_model: converts validated JSON arguments into the function's Python types
            (``@tool`` derives it); None passes the JSON values as they are.
        terminal: a successful call ends the run (DONE, stop reason ``terminal_tool``) with
            the call's output as the run's output: a ``submit_answer`` that delivers the
            result. Ranked after ``ask_user`` and ``finish_task`` and before approvals and
            the limits; only the first valid call of a terminal tool in a reply runs (later
            ones are skipped), and a failed one goes back to the model like any error.

    Raises:
        ConfigError: for an invalid name, schema or option, naming the tool.
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFunction | None = None
    control: ControlKind | None = None
    _: KW_ONLY
    timeout_s: float | None = None
    max_output_chars: int | None = None
    sequential: bool = False
    idempotent: bool = False
    retry_on: tuple[type[BaseException], ...] = (TimeoutError,)
    max_retries: int | None = None
    requires_approval: bool | ApprovalPredicate = False
    arguments_model: type[BaseModel] | None = field(default=None, repr=False)
    terminal: bool = False
    validator: Validator = field(init=False, repr=False, compare=False)
    """Validates arguments against ``parameters``, matching its patterns in linear time
    (``tools.patterns``)."""
    fast_check: Callable[[dict[str, Any]], bool] | None = field(
        init=False, repr=False, compare=False
    )
    """A quick test that passes only arguments the schema accepts, for simple schemas (flat,
    primitive types); a failure is confirmed, and explained, by the full validator."""
    is_async: bool = field(init=False, repr=False, compare=False)
    receives_call: bool = field(init=False, repr=False, compare=False)
    """The function takes the ``ToolCall`` first, before the arguments: an async function
    marked ``fn.receives_call = True`` (a sub-agent tool, whose child run is named after
    its call: ``run.delegation``)."""
    integer_parameters: frozenset[str] = field(init=False, repr=False, compare=False)
    """Top-level parameters typed integer: a validated ``2.0`` among them is passed as ``2``
    when no arguments model converts the arguments."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not NAME_PATTERN.match(self.name):
            raise ConfigError(
                f"tool name {self.name!r} is invalid: providers accept only letters, digits, "
                "'_' and '-', 1 to 64 characters"
            )
        if self.fn is None and self.control is None:
            raise ConfigError(f"tool {self.name!r} has no function to call")
        if self.fn is not None and not callable(self.fn):
            raise ConfigError(f"tool {self.name!r}: fn must be callable, got {self.fn!r}")
        if not isinstance(self.parameters, Mapping):
            raise ConfigError(f"tool {self.name!r}: parameters must be a JSON Schema object")
        self._check_schema()
        self._check_options()
        object.__setattr__(self, "validator", schema_validator(self.parameters))
        object.__setattr__(self, "fast_check", fast_check(self.parameters))
        object.__setattr__(self, "is_async", _is_async(self.fn))
        receives = getattr(self.fn, "receives_call", False) is True and self.is_async
        object.__setattr__(self, "receives_call", receives)
        object.__setattr__(self, "integer_parameters", integer_parameters(self.parameters))

    def _check_schema(self) -> None:
        """Refuse a parameters schema that is not JSON Schema, or that validation could not
        survive (``schema_problem``); one that is not an object's; and an arguments model
        that would match a pattern with Python's ``re`` (``backtracking_problem``)."""
        problem = schema_problem(self.parameters)
        if problem is None and self.parameters.get("type") != "object":
            problem = (
                'the parameters schema must have "type": "object" (tool arguments are always '
                "a JSON object)"
            )
        model = self.arguments_model
        if problem is None and isinstance(model, type) and issubclass(model, BaseModel):
            problem = backtracking_problem(model)
        if problem is not None:
            raise ConfigError(f"tool {self.name!r}: {problem}")

    def _check_options(self) -> None:
        problems: list[str] = []
        timeout = self.timeout_s
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            problems.append(f"timeout_s must be a finite number of seconds > 0, got {timeout!r}")
        for option, low in (("max_output_chars", 1), ("max_retries", 0)):
            value = getattr(self, option)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < low
            ):
                problems.append(f"{option} must be an integer >= {low}, got {value!r}")
        retry_on = self.retry_on
        if isinstance(retry_on, type):
            retry_on = (retry_on,)
            object.__setattr__(self, "retry_on", retry_on)
        if not isinstance(retry_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in retry_on
        ):
            problems.append(f"retry_on must be a tuple of exception types, got {retry_on!r}")
        if self.max_retries and not self.idempotent:
            problems.append(
                "max_retries needs idempotent=True (a tool that is not idempotent is never retried)"
            )
        if not isinstance(self.requires_approval, bool) and not callable(self.requires_approval):
            problems.append("requires_approval must be a bool or a predicate over the arguments")
        for flag in ("sequential", "idempotent", "terminal"):
            if not isinstance(getattr(self, flag), bool):
                problems.append(f"{flag} must be a bool")
        if problems:
            raise ConfigError(f"tool {self.name!r}: " + "; ".join(problems))

    @property
    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(
            name=self.name, description=self.description, parameters=dict(self.parameters)
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function itself, as if ``@tool`` had not wrapped it (a test, or code that
        uses the function directly): no validation, timeout or retry, which only calls the
        model makes get. An async function gives its coroutine.

        Raises:
            TypeError: for a control-flow tool, which has no function of its own.
        """
        if self.fn is None:
            raise TypeError(f"tool {self.name!r} is run by the engine itself: it has no function")
        return self.fn(*args, **kwargs)

    def needs_approval(self, arguments: dict[str, Any]) -> bool:
        """Whether a call with these (validated) arguments must wait for a person.

        Must not raise: a predicate that fails counts as "needs approval" (fail safe).
        """
        rule = self.requires_approval
        if isinstance(rule, bool):
            return rule
        try:
            return bool(rule(dict(arguments)))
        except Exception:
            return True


def _is_async(fn: object) -> bool:
    if fn is None:
        return False
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    )


@overload
def tool(fn: ToolFunction, /) -> Tool: ...
@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    **options: Any,
) -> Callable[[ToolFunction], Tool]: ...
def tool(
    fn: ToolFunction | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
    **options: Any,
) -> Tool | Callable[[ToolFunction], Tool]:
    """Make a ``Tool`` from a function.

    The name comes from the function, the description from its docstring's summary, the
    parameters schema from its type hints (with per-argument descriptions from a Google,
    NumPy or reST docstring). Usable bare (``@tool``) or with arguments
    (``@tool(name="lookup", timeout_s=5, idempotent=True)``); any ``Tool`` option may be given.
    ``parameters={...}`` replaces the derived schema; the function then receives the JSON
    values as they are.

    Raises:
        ConfigError: naming the tool, when the signature cannot be described or an option
            is invalid.
    """

    def build(f: ToolFunction) -> Tool:
        if not callable(f):
            raise ConfigError(f"@tool needs a function, got {f!r}")
        tool_name = name or getattr(f, "__name__", type(f).__name__)
        if not isinstance(tool_name, str) or not NAME_PATTERN.match(tool_name):
            raise ConfigError(
                f"tool name {tool_name!r} is invalid: providers accept only letters, digits, "
                "'_' and '-', 1 to 64 characters"
            )
        summary = description or describe_function(f, tool_name)
        if parameters is not None:
            return Tool(tool_name, summary, parameters, f, **options)
        derived = derive_schema(f, tool_name)
        return Tool(
            tool_name,
            summary,
            derived.parameters,
            f,
            arguments_model=derived.arguments_model,
            **options,
        )

    unknown = sorted(set(options) - _TOOL_OPTIONS)
    if unknown:
        raise ConfigError(f"@tool got unknown option(s) {unknown}")
    return build(fn) if fn is not None else build


_TOOL_OPTIONS = frozenset(
    {
        "timeout_s",
        "max_output_chars",
        "sequential",
        "idempotent",
        "retry_on",
        "max_retries",
        "requires_approval",
        "terminal",
    }
)

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
    """A tool call after lookup, JSON parsing, schema validation and type conversion."""

    call: ToolCall
    tool: Tool | None
    arguments: dict[str, Any] | None
    """The parsed JSON arguments, or None when they were not a JSON object."""
    error: str | None
    """Why the call cannot run, worded for the model; None when it is valid."""
    values: dict[str, Any] | None = None
    """The keyword arguments for the function (``arguments`` converted to its types)."""
    runtime: dict[str, JsonValue] | None = None
    """Facts the runtime adds to the call's answer whatever it is (``details["runtime"]``):
    a ``before_tool`` hook's change of the arguments (``tools.hooks``)."""


class ToolRegistry:
    """The tools of one agent, by name; validators are built once, when tools are defined."""

    __slots__ = ("_spec_of", "_specs", "_tools")

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
        self._spec_of = {spec.name: spec for spec in self._specs}

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        """Every tool as the model sees it, in registration order."""
        return self._specs

    @property
    def tools(self) -> tuple[Tool, ...]:
        """Every tool, in registration order."""
        return tuple(self._tools.values())

    def spec_of(self, name: str) -> ToolSpec | None:
        """The tool ``name`` as the model sees it (the very object ``specs`` holds), or None."""
        return self._spec_of.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def prepare(self, call: ToolCall) -> PreparedCall:
        """Look the tool up, parse, validate and convert the arguments. Must not raise."""
        found = self._tools.get(call.name)
        if found is None:
            available = ", ".join(self._tools) or "(none)"
            return PreparedCall(
                call, None, None,
                f"Unknown tool '{call.name}'. Available tools: {available}.",
            )  # fmt: skip
        problem = ""
        try:
            # pydantic_core's parser: the same values as json.loads, at a sixth of the cost.
            arguments = from_json(call.arguments) if call.arguments.strip() else {}
        except ValueError as exc:
            arguments, problem = with_lone_surrogates(call.arguments), str(exc)
        if arguments is UNPARSED:
            return PreparedCall(
                call, found, None,
                f"The arguments for tool '{call.name}' are not valid JSON ({problem}): "
                f"{quoted(call.arguments)}. Send them as one JSON object that matches the "
                "tool's schema.",
            )  # fmt: skip
        if not isinstance(arguments, dict):
            return PreparedCall(
                call, found, None,
                f"The arguments for tool '{call.name}' must be a JSON object, "
                f"not {type(arguments).__name__}: {quoted(call.arguments)}.",
            )  # fmt: skip
        invalid = schema_errors(call.name, found.validator, found.fast_check, arguments)
        if invalid is not None:
            return PreparedCall(call, found, arguments, invalid)
        model = found.arguments_model
        if model is None:
            for name in found.integer_parameters:
                value = arguments.get(name)
                if type(value) is float and value.is_integer():
                    arguments[name] = int(value)
            return PreparedCall(call, found, arguments, None, arguments)
        try:
            converted = model.model_validate(arguments)
        except PydanticValidationError as exc:
            return PreparedCall(call, found, arguments, conversion_errors(call.name, exc))
        except Exception as exc:  # a user validator that raised something else
            return PreparedCall(
                call, found, arguments,
                f"Invalid arguments for tool '{call.name}': {type(exc).__name__}: {exc}",
            )  # fmt: skip
        given = converted.model_fields_set
        values = {k: v for k, v in converted.__dict__.items() if k in given}
        return PreparedCall(call, found, arguments, None, values)
