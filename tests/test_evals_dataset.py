"""Datasets and cases (issue 38): typed with pydantic, loaded from and saved to YAML and JSON,
every evaluator kind told apart by ``kind``, wrong files refused with the file named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from agent_fsm import ConfigError
from agent_fsm.evals import (
    Called,
    CalledInOrder,
    Case,
    Check,
    Contains,
    Dataset,
    Equals,
    EvalContext,
    Judge,
    Matches,
    MatchesSchema,
    NotCalled,
    Validates,
    WithinTurns,
)
from agent_fsm.messages import AssistantMessage, UserMessage

ROOT = Path(__file__).resolve().parent.parent


class Answer(BaseModel):
    city: str


def long_enough(context: EvalContext) -> bool:
    return len(context.output or "") > 3


EVERY_KIND = Dataset(
    name="every-kind",
    evaluators=(WithinTurns(turns=3),),
    cases=(
        Case(
            name="one",
            input="What is the capital of France?",
            expected_output="Paris",
            metadata={"difficulty": "easy", "tags": ["geo"]},
            evaluators=(
                Equals(case_sensitive=False),
                Contains(text="Paris"),
                Matches(pattern=r"^Par", full=False),
                MatchesSchema(json_schema={"type": "object", "required": ["city"]}),
                Validates(model=Answer),
                Check(function=long_enough, label="long"),
                Judge(rubric="Names the capital."),
                Called(tools=("lookup",)),
                NotCalled(tools=("delete",)),
                CalledInOrder(tools=("lookup", "answer"), exact=True),
            ),
        ),
        Case(
            name="conversation",
            input=("Capital of Japan?", "And of Spain?"),
            history=(UserMessage(content="hi"), AssistantMessage(content="Hello!")),
            expected_output={"city": "Madrid"},
        ),
    ),
)


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".json"])
def test_a_dataset_saves_and_loads_back_equal(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"data{suffix}"
    EVERY_KIND.save(path)
    loaded = Dataset.load(path)
    # functions and models given in Python come back as references that load the same
    check = loaded.cases[0].evaluators[5]
    validates = loaded.cases[0].evaluators[4]
    assert isinstance(check, Check)
    assert check.function == f"{__name__}:long_enough"
    assert isinstance(validates, Validates)
    assert validates.model == f"{__name__}:Answer"
    assert loaded.model_dump(mode="json") == EVERY_KIND.model_dump(mode="json")
    assert [type(e) for e in loaded.cases[0].evaluators] == [
        type(e) for e in EVERY_KIND.cases[0].evaluators
    ]
    assert loaded.cases[1].input == ("Capital of Japan?", "And of Spain?")
    assert isinstance(loaded.cases[1].history[1], AssistantMessage)


def test_the_yaml_file_is_readable_and_kinds_come_first(tmp_path: Path) -> None:
    path = tmp_path / "data.yaml"
    EVERY_KIND.save(path)
    text = path.read_text()
    assert "- kind: contains\n" in text
    assert "text: Paris" in text
    assert "case_sensitive" not in text.split("- kind: contains")[1].split("- kind")[0]


def test_the_example_dataset_loads_with_its_name_from_the_file() -> None:
    dataset = Dataset.load(ROOT / "examples" / "evals" / "capitals.yaml")
    assert dataset.name == "capitals"
    assert [c.name for c in dataset.cases][:2] == ["france", "australia"]
    assert isinstance(dataset.evaluators[0], WithinTurns)


def test_a_case_with_an_expected_output_and_no_evaluators_is_checked_by_equals() -> None:
    dataset = Dataset(
        cases=(Case(name="a", input="x", expected_output="y"), Case(name="b", input="x"))
    )
    assert dataset.evaluators_for(dataset.cases[0]) == (Equals(),)
    assert dataset.evaluators_for(dataset.cases[1]) == ()
    with_own = Dataset(
        cases=(Case(name="a", input="x", expected_output="y"),), evaluators=(Contains(text="y"),)
    )
    assert with_own.evaluators_for(with_own.cases[0]) == (Contains(text="y"),)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("cases: [}", "not valid YAML"),
        ("name: x\ncases: []", "not a valid dataset"),
        ("cases:\n  - {name: a, input: x}\n  - {name: a, input: y}", "two cases are named 'a'"),
        ("cases:\n  - {name: a, input: x, evaluators: [{kind: nope}]}", "not a valid dataset"),
        ("cases:\n  - {name: a, input: []}", "at least one message"),
    ],
)
def test_a_wrong_dataset_is_a_config_error_naming_the_file(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message) as caught:
        Dataset.load(path)
    assert str(path) in str(caught.value)


def test_unreadable_and_non_json_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the dataset"):
        Dataset.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        Dataset.load(bad)
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"cases": [{"name": "a", "input": "hi"}]}))
    assert Dataset.load(good).name == "good"
