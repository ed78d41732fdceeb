"""Datasets and cases: what an eval runs, typed with pydantic, kept in YAML or JSON.

    name: capitals
    evaluators:                      # applied to every case
      - kind: within_turns
        turns: 4
    cases:
      - name: france
        input: What is the capital of France?
        expected_output: Paris       # with no evaluators at all, checked by `equals`
        evaluators:
          - kind: contains
            text: Paris
          - kind: called
            tools: [lookup_capital]
        metadata: {difficulty: easy}
      - name: follow-up
        input: [Capital of Japan?, And its population?]   # a conversation

YAML needs the ``evals`` extra (``pip install -e '.[evals]'``: pyyaml); JSON needs
nothing. Evaluators are told apart by ``kind``: ``equals``, ``contains``, ``matches``,
``schema``, ``validates``, ``check``, ``judge``, ``called``, ``not_called``,
``called_in_order``, ``within_turns``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from agent_fsm.errors import ConfigError
from agent_fsm.evals.evaluators import Check, Contains, Equals, Matches, MatchesSchema, Validates
from agent_fsm.evals.judge import Judge
from agent_fsm.evals.trajectory import Called, CalledInOrder, NotCalled, WithinTurns
from agent_fsm.extras import install_hint
from agent_fsm.messages import Message

__all__ = ["AnyEvaluator", "Case", "Dataset"]

AnyEvaluator = Annotated[
    Equals
    | Contains
    | Matches
    | MatchesSchema
    | Validates
    | Check
    | Judge
    | Called
    | NotCalled
    | CalledInOrder
    | WithinTurns,
    Field(discriminator="kind"),
]
"""Any built-in evaluator, told apart by ``kind``."""

_FROZEN = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


class Case(BaseModel):
    """One task: what the user says, what a right answer is, and how to judge the run."""

    model_config = _FROZEN

    name: str = Field(min_length=1)
    """Unique within the dataset: results, resumes and baselines are keyed by it."""
    input: str | tuple[str, ...]
    """The user's message, or a conversation: each message sent in turn, each run going on
    from the previous one's transcript."""
    history: tuple[Message, ...] = ()
    """An earlier conversation the first run starts from (``Agent.start(history=...)``)."""
    expected_output: JsonValue = None
    """The right answer (text, or the JSON of a typed output), for ``equals`` and judges."""
    evaluators: tuple[AnyEvaluator, ...] = ()
    metadata: dict[str, JsonValue] = Field(default_factory=dict)

    @field_validator("input")
    @classmethod
    def _some_input(cls, value: str | tuple[str, ...]) -> str | tuple[str, ...]:
        if isinstance(value, tuple) and not value:
            raise ValueError("a conversation needs at least one message")
        return value


class Dataset(BaseModel):
    """Cases, and the evaluators applied to every one of them."""

    model_config = _FROZEN

    name: str = "dataset"
    cases: tuple[Case, ...] = Field(min_length=1)
    evaluators: tuple[AnyEvaluator, ...] = ()
    """Applied to every case, before the case's own."""

    @field_validator("cases")
    @classmethod
    def _unique_names(cls, cases: tuple[Case, ...]) -> tuple[Case, ...]:
        seen: set[str] = set()
        for case in cases:
            if case.name in seen:
                raise ValueError(f"two cases are named {case.name!r}: names must be unique")
            seen.add(case.name)
        return cases

    def evaluators_for(self, case: Case) -> tuple[AnyEvaluator, ...]:
        """What judges ``case``: the dataset's evaluators, then its own; ``equals`` alone
        when there are none and the case has an expected output."""
        chosen = (*self.evaluators, *case.evaluators)
        if not chosen and case.expected_output is not None:
            return (Equals(),)
        return chosen

    @classmethod
    def load(cls, path: str | Path) -> Dataset:
        """Read a dataset from a ``.yaml``/``.yml`` or ``.json`` file.

        Raises:
            ConfigError: the file is missing, unreadable, or not a valid dataset (the message
                names the file and the first problems).
        """
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read the dataset {str(path)!r}: {exc}") from None
        data = _parse(path, text)
        if isinstance(data, dict):
            data.setdefault("name", path.stem)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise ConfigError(f"{path} is not a valid dataset: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write the dataset to a ``.yaml``/``.yml`` or ``.json`` file; ``load`` reads it
        back equal (functions and models given in Python are saved as references)."""
        path = Path(path)
        data: dict[str, Any] = {"name": self.name}
        if self.evaluators:
            data["evaluators"] = [_dumped(e) for e in self.evaluators]
        data["cases"] = [_case_data(case) for case in self.cases]
        if _is_yaml(path):
            text = _yaml().safe_dump(data, sort_keys=False, allow_unicode=True)
        else:
            text = json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        path.write_text(text, encoding="utf-8")


def _case_data(case: Case) -> dict[str, Any]:
    """A case as saved: what differs from the defaults, messages whole (a message's
    ``role`` is a default, and tells the kinds apart)."""
    data = case.model_dump(mode="json", exclude_defaults=True, exclude={"evaluators", "history"})
    if case.history:
        data["history"] = [m.model_dump(mode="json", exclude_none=True) for m in case.history]
    if case.evaluators:
        data["evaluators"] = [_dumped(e) for e in case.evaluators]
    return data


def _dumped(evaluator: BaseModel) -> dict[str, Any]:
    """An evaluator as saved: its ``kind`` first (a default, which ``exclude_defaults``
    would drop), then what differs from the defaults."""
    return {
        "kind": getattr(evaluator, "kind"),  # noqa: B009 (every member of AnyEvaluator has one)
        **evaluator.model_dump(mode="json", exclude_defaults=True),
    }


def _parse(path: Path, text: str) -> Any:
    if not _is_yaml(path):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{path} is not valid JSON: {exc}") from None
    yaml = _yaml()
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None


def _is_yaml(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")


def _yaml() -> Any:
    """pyyaml, imported when a YAML file is read or written (the ``evals`` extra)."""
    try:
        import yaml
    except ModuleNotFoundError:
        raise ConfigError(
            "YAML datasets need pyyaml, which comes with the evals extra: "
            f"{install_hint('evals')} (or use a .json dataset)"
        ) from None
    return yaml
