"""The evaluators of an answer: exact, contains, regex, a JSON Schema or a pydantic model for
typed output, and a Python function.

Each is a frozen pydantic model with a ``kind``, so a dataset holds them in YAML or JSON
(``- kind: contains`` / ``text: Paris``). A function (``Check``) or a pydantic model
(``Validates``) is named there by a reference, ``module:attr`` or ``path/file.py:attr``,
resolved as ``agent-fsm eval --agent`` resolves an agent (``agent_fsm.loading``); in Python
the object itself may be given, and is saved as ``module:qualname``.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from typing import Any, Literal

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError, field_serializer

from agent_fsm.evals.context import EvalContext, Verdict
from agent_fsm.loading import load_object

__all__ = ["Check", "Contains", "Equals", "Matches", "MatchesSchema", "Validates", "reference"]

_SPEC = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


def reference(value: object) -> str:
    """How a function or class given in Python is saved: ``module:qualname`` (a string stays
    as it is). One defined in ``__main__`` or inside a function saves, but will not load."""
    if isinstance(value, str):
        return value
    module = getattr(value, "__module__", "?")
    name = getattr(value, "__qualname__", type(value).__qualname__)
    return f"{module}:{name}"


def _json_of(value: Any) -> JsonValue:
    if isinstance(value, BaseModel):
        dumped: JsonValue = value.model_dump(mode="json")
        return dumped
    return value  # type: ignore[no-any-return]


def _typed_or_parsed(context: EvalContext) -> tuple[bool, Any]:
    """The typed output if the run has one, else the output parsed as JSON; (False, why) when
    there is neither."""
    if context.value is not None:
        return True, _json_of(context.value)
    if context.output is None:
        return False, "the run gave no output"
    try:
        return True, json.loads(context.output)
    except ValueError:
        return False, f"the output is not JSON: {context.output[:200]!r}"


class Equals(BaseModel):
    """The answer equals ``value``, or the case's expected output when ``value`` is None.

    Text is compared after stripping surrounding whitespace (and case, unless
    ``case_sensitive``); an expected value that is not a string is compared with the typed
    output (or the output parsed as JSON). A case with no expected value and no ``value``
    passes: there is nothing to compare.
    """

    model_config = _SPEC

    kind: Literal["equals"] = "equals"
    value: JsonValue = None
    case_sensitive: bool = True

    @property
    def name(self) -> str:
        return self.kind

    async def evaluate(self, context: EvalContext) -> Verdict:
        expected = self.value if self.value is not None else context.expected
        if expected is None:
            return Verdict(evaluator=self.name, passed=True, reason="no expected output")
        if isinstance(expected, str):
            got = (context.output or "").strip()
            want = expected.strip()
            if not self.case_sensitive:
                got, want = got.casefold(), want.casefold()
            if got == want:
                return Verdict(evaluator=self.name, passed=True)
            return Verdict(
                evaluator=self.name,
                passed=False,
                reason=f"expected {expected!r}, got {context.output!r}",
            )
        ok, got_value = _typed_or_parsed(context)
        if ok and got_value == expected:
            return Verdict(evaluator=self.name, passed=True)
        why = got_value if not ok else f"expected {expected!r}, got {got_value!r}"
        return Verdict(evaluator=self.name, passed=False, reason=str(why))


class Contains(BaseModel):
    """The output holds ``text``."""

    model_config = _SPEC

    kind: Literal["contains"] = "contains"
    text: str
    case_sensitive: bool = True

    @property
    def name(self) -> str:
        return f"contains({self.text!r})"

    async def evaluate(self, context: EvalContext) -> Verdict:
        output = context.output or ""
        found = (
            self.text in output
            if self.case_sensitive
            else self.text.casefold() in output.casefold()
        )
        reason = "" if found else f"{self.text!r} not in {output[:200]!r}"
        return Verdict(evaluator=self.name, passed=found, reason=reason)


class Matches(BaseModel):
    """The output matches the regular expression ``pattern`` (anywhere: ``re.search``;
    anchor it with ``^``/``$`` or set ``full``)."""

    model_config = _SPEC

    kind: Literal["matches"] = "matches"
    pattern: str
    full: bool = False
    ignore_case: bool = False

    @property
    def name(self) -> str:
        return f"matches({self.pattern!r})"

    async def evaluate(self, context: EvalContext) -> Verdict:
        flags = re.IGNORECASE if self.ignore_case else 0
        output = context.output or ""
        search = re.fullmatch if self.full else re.search
        found = search(self.pattern, output, flags) is not None
        reason = "" if found else f"{output[:200]!r} does not match {self.pattern!r}"
        return Verdict(evaluator=self.name, passed=found, reason=reason)


class MatchesSchema(BaseModel):
    """The typed output (or the output parsed as JSON) is valid under a JSON Schema."""

    model_config = _SPEC

    kind: Literal["schema"] = "schema"
    json_schema: dict[str, Any]

    @property
    def name(self) -> str:
        return self.kind

    async def evaluate(self, context: EvalContext) -> Verdict:
        ok, value = _typed_or_parsed(context)
        if not ok:
            return Verdict(evaluator=self.name, passed=False, reason=str(value))
        errors = sorted(Draft202012Validator(self.json_schema).iter_errors(value), key=str)
        if not errors:
            return Verdict(evaluator=self.name, passed=True)
        reason = "; ".join(
            f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:3]
        )
        return Verdict(evaluator=self.name, passed=False, reason=reason)


class Validates(BaseModel):
    """The typed output (or the output parsed as JSON) validates as the pydantic model
    ``model``: the class, or a reference to it (``app.schemas:Answer``)."""

    model_config = _SPEC

    kind: Literal["validates"] = "validates"
    model: type[BaseModel] | str

    @field_serializer("model")
    def _save_model(self, model: type[BaseModel] | str) -> str:
        return reference(model)

    @property
    def name(self) -> str:
        return f"validates({reference(self.model).rpartition(':')[2]})"

    async def evaluate(self, context: EvalContext) -> Verdict:
        model = self.model if not isinstance(self.model, str) else load_object(self.model, type)
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return Verdict(evaluator=self.name, passed=False, reason=f"{model} is no model")
        if isinstance(context.value, model):
            return Verdict(evaluator=self.name, passed=True)
        ok, value = _typed_or_parsed(context)
        if not ok:
            return Verdict(evaluator=self.name, passed=False, reason=str(value))
        try:
            model.model_validate(value)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(map(str, first["loc"])) or "(root)"
            return Verdict(
                evaluator=self.name,
                passed=False,
                reason=f"{exc.error_count()} error(s); {where}: {first['msg']}",
            )
        return Verdict(evaluator=self.name, passed=True)


CheckResult = bool | float | Verdict | tuple[bool, str]
"""What a ``Check`` function may return: pass or fail, a score (passes at 0.5 or more), a
verdict, or (passed, reason)."""


class Check(BaseModel):
    """A Python function of the ``EvalContext`` decides (sync or async); see ``CheckResult``
    for what it may return. ``function`` is the callable, or a reference to it."""

    model_config = _SPEC

    kind: Literal["check"] = "check"
    function: Callable[..., Any] | str
    label: str | None = None
    """The name in the report; the function's own name by default."""

    @field_serializer("function")
    def _save_function(self, function: Callable[..., Any] | str) -> str:
        return reference(function)

    @property
    def name(self) -> str:
        return self.label or reference(self.function).rpartition(":")[2].rpartition(".")[2]

    async def evaluate(self, context: EvalContext) -> Verdict:
        function: object = self.function
        if isinstance(function, str):
            # any object is an ``object``: load_object takes it as it is, never calls it
            function = load_object(function, object)
        if not callable(function):
            return Verdict(
                evaluator=self.name, passed=False, reason=f"{self.function} is no function"
            )
        answer = function(context)
        if inspect.isawaitable(answer):
            answer = await answer
        return _verdict_of(self.name, answer)


def _verdict_of(name: str, answer: object) -> Verdict:
    if isinstance(answer, Verdict):
        return answer
    if isinstance(answer, bool):
        return Verdict(evaluator=name, passed=answer, reason="" if answer else "returned False")
    if isinstance(answer, int | float):
        score = float(answer)
        return Verdict(evaluator=name, passed=score >= 0.5, score=score)
    if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[0], bool):
        return Verdict(evaluator=name, passed=answer[0], reason=str(answer[1]))
    return Verdict(
        evaluator=name,
        passed=False,
        reason=f"returned {type(answer).__name__}, not a bool, a score, a Verdict or "
        "(passed, reason)",
    )
