"""Evals are resumable and their results kept (issue 38): each finished (case, repeat) is in
the SQLite store before the next is counted, so an eval whose process died continues where
it was, and a UI can list evals and show their trials and reports."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agent_fsm import Agent, ConfigError, Limits
from agent_fsm.evals import Case, Dataset, EvalStore, evaluate_sync
from agent_fsm.messages import ModelRequest
from agent_fsm.testing import FunctionModel

ROOT = Path(__file__).resolve().parent.parent

DATASET = Dataset(
    name="four",
    cases=tuple(
        Case(name=f"case-{i}", input=f"Say {i}.", expected_output=str(i)) for i in range(4)
    ),
)


def _says_the_number(request: ModelRequest) -> str:
    return str(request.messages[-1].content).removeprefix("Say ").removesuffix(".")


def _agent(model: FunctionModel) -> Agent:
    return Agent(model=model, limits=Limits(max_turns=3))


CHILD = """
import os, sys
from agent_fsm import Agent, Limits
from agent_fsm.evals import Dataset, EvalStore, evaluate_sync
from agent_fsm.testing import FunctionModel

calls = 0

def answer(request):
    global calls
    calls += 1
    if calls == 6:
        os._exit(3)  # the process dies mid-eval: no cleanup, no exception handlers
    return str(request.messages[-1].content).removeprefix("Say ").removesuffix(".")

store = EvalStore(sys.argv[2])
evaluate_sync(
    Agent(model=FunctionModel(answer), limits=Limits(max_turns=3)),
    Dataset.load(sys.argv[1]), repeats=2, concurrency=1, store=store, eval_id="crashed",
)
"""


def test_an_eval_whose_process_died_resumes_from_its_store(tmp_path: Path) -> None:
    data, path = tmp_path / "four.json", tmp_path / "evals.sqlite3"
    DATASET.save(data)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    child = subprocess.run(
        [sys.executable, str(script), str(data), str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,  # bounds a hang only
        check=False,
    )
    assert child.returncode == 3, child.stderr
    with EvalStore(path) as store:
        assert sorted((t.case, t.repeat) for t in store.trials("crashed")) == sorted(
            [(f"case-{i}", 0) for i in range(4)] + [("case-0", 1)]
        )
        assert store.report("crashed") is None  # it never finished
        assert [(e.recorded, e.finished_at) for e in store.evals()] == [(5, None)]
        again = FunctionModel(_says_the_number)
        report = evaluate_sync(
            _agent(again), Dataset.load(data), repeats=2, store=store, eval_id="crashed"
        )
        assert len(again.requests) == 3  # only the trials it had no record of
        assert (report.overall.runs, report.overall.passed) == (8, 8)
        listed = store.evals()
        assert [(e.eval_id, e.recorded, e.passed, e.cases, e.repeats) for e in listed] == [
            ("crashed", 8, 8, 4, 2)
        ]
        assert listed[0].finished_at is not None
        stored = store.report("crashed")
        assert stored is not None
        assert stored.overall == report.overall
        assert len(stored.trials) == 8


def test_an_eval_id_of_another_dataset_is_refused(tmp_path: Path) -> None:
    with EvalStore(tmp_path / "e.sqlite3") as store:
        evaluate_sync(_agent(FunctionModel(_says_the_number)), DATASET, store=store, eval_id="x")
        other = Dataset(name="other", cases=(Case(name="a", input="Say 1."),))
        with pytest.raises(ConfigError, match="ran dataset 'four'"):
            evaluate_sync(_agent(FunctionModel(_says_the_number)), other, store=store, eval_id="x")
        with pytest.raises(ConfigError, match="and 1 repeats"):
            evaluate_sync(
                _agent(FunctionModel(_says_the_number)),
                DATASET,
                repeats=2,
                store=store,
                eval_id="x",
            )


def test_the_store_shares_a_file_with_a_checkpoint_store(tmp_path: Path) -> None:
    from agent_fsm import SQLiteStore

    path = tmp_path / "app.sqlite3"
    agent = _agent(FunctionModel(_says_the_number)).replace(store=SQLiteStore(path))
    with EvalStore(path) as store:
        report = evaluate_sync(agent, DATASET, store=store, eval_id="shared")
    assert report.overall.passed == 4
    assert {run.run_id for run in SQLiteStore(path).list_runs()} >= set(report.trials[0].run_ids)
