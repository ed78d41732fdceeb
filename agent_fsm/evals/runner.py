"""Run a dataset against an agent: every case ``repeats`` times, at most ``concurrency``
trials at once, each recorded as it finishes, then summarised into an ``EvalReport``.

    report = await evaluate(agent, Dataset.load("capitals.yaml"), repeats=5, concurrency=4)
    print(report_text(report))

With a ``store`` (an ``EvalStore``), each finished trial is written to it before the next is
counted, under ``eval_id``: running the same eval id again after a crash runs only the
trials it has no record of, and the report covers them all.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from agent_fsm.agent import Agent
from agent_fsm.errors import ConfigError
from agent_fsm.evals.context import CallBudget
from agent_fsm.evals.dataset import Case, Dataset
from agent_fsm.evals.records import Pricing, TrialRecord
from agent_fsm.evals.report import EvalReport, summarise
from agent_fsm.evals.store import EvalStore
from agent_fsm.evals.trial import Trial, play_trial
from agent_fsm.models.base import Model
from agent_fsm.testing.harness import run_sync

__all__ = ["OnTrial", "evaluate", "evaluate_sync"]

OnTrial = Callable[[TrialRecord, int, int], None]
"""Called as each trial finishes: the record, trials done so far, trials in all (a progress
bar: ``agent_fsm.evals.progress.ProgressBar``). Called on the event loop: keep it quick."""

DEFAULT_JUDGE_CALLS_PER_TRIAL = 4
"""The judge budget when none is given: this many calls per trial to be run."""


def _dataset_of(dataset: Dataset | str | Path) -> Dataset:
    return dataset if isinstance(dataset, Dataset) else Dataset.load(dataset)


async def evaluate(
    agent: Agent,
    dataset: Dataset | str | Path,
    *,
    repeats: int = 1,
    concurrency: int = 4,
    judge: Model | None = None,
    max_judge_calls: int | None = None,
    pricing: Pricing | None = None,
    store: EvalStore | None = None,
    eval_id: str | None = None,
    agent_name: str | None = None,
    confidence: float = 0.95,
    on_trial: OnTrial | None = None,
) -> EvalReport:
    """Run every case of ``dataset`` ``repeats`` times against ``agent`` and report.

    Args:
        agent: the agent under evaluation; its runs are checked by the run invariants.
        dataset: a ``Dataset``, or the path of a YAML or JSON one.
        repeats: runs per case (models are not deterministic: the report's intervals narrow
            as this grows).
        concurrency: trials at once, at least 1.
        judge: the model LLM judges (``Judge`` evaluators) call.
        max_judge_calls: the most judge calls the whole eval may make; by default
            ``DEFAULT_JUDGE_CALLS_PER_TRIAL`` per trial to run.
        pricing: what the agent's tokens cost, for the report's cost columns.
        store: where each trial is recorded as it finishes (and the report at the end).
        eval_id: the eval's id in ``store``; an id the store holds continues that eval.
            A fresh id when None.
        agent_name: how the report names the agent (``--agent``'s reference); its repr
            by default.
        confidence: of the report's intervals.
        on_trial: called as each trial finishes (progress).

    Raises:
        ConfigError: bad arguments, an unreadable dataset, or an ``eval_id`` of the store
            that ran another dataset.
    """
    data = _dataset_of(dataset)
    if repeats < 1 or concurrency < 1:
        raise ConfigError(
            f"repeats and concurrency must be at least 1, got {repeats}, {concurrency}"
        )
    eval_id = eval_id or uuid.uuid4().hex[:12]
    names = [case.name for case in data.cases]
    name = agent_name or repr(agent)
    done: list[TrialRecord] = []
    if store is not None:
        done = store.begin(eval_id, dataset=data.name, agent=name, cases=names, repeats=repeats)
    finished = {(t.case, t.repeat) for t in done}
    todo = [(c, r) for r in range(repeats) for c in data.cases if (c.name, r) not in finished]
    calls = max_judge_calls
    if calls is None:
        calls = DEFAULT_JUDGE_CALLS_PER_TRIAL * len(todo)
    budget = CallBudget(limit=calls)
    budget.made = min(calls, sum(t.judge_calls for t in done))  # a resume spends the rest
    trials = {
        case.name: Trial(
            agent=agent,
            evaluators=data.evaluators_for(case),
            judge=judge,
            judge_budget=budget,
            pricing=pricing,
        )
        for case in data.cases
    }
    total = repeats * len(names)
    records = await _run_all(
        trials, todo, concurrency, (len(done), total), store, eval_id, on_trial
    )
    report = summarise(
        [*done, *records],
        eval_id=eval_id,
        dataset=data.name,
        agent=name,
        cases=names,
        repeats=repeats,
        confidence=confidence,
    )
    if store is not None:
        store.finish(eval_id, report)
    return report


async def _run_all(
    trials: dict[str, Trial],
    todo: Sequence[tuple[Case, int]],
    concurrency: int,
    counts: tuple[int, int],
    store: EvalStore | None,
    eval_id: str,
    on_trial: OnTrial | None,
) -> list[TrialRecord]:
    """Play ``todo``, at most ``concurrency`` at once, recording each as it finishes."""
    gate = asyncio.Semaphore(concurrency)
    already, total = counts
    records: list[TrialRecord] = []

    async def one(case: Case, repeat: int) -> None:
        async with gate:
            record = await play_trial(trials[case.name], case, repeat)
        if store is not None:
            store.add(eval_id, record)
        records.append(record)
        if on_trial is not None:
            on_trial(record, already + len(records), total)

    async with asyncio.TaskGroup() as group:
        for case, repeat in todo:
            group.create_task(one(case, repeat))
    return records


def evaluate_sync(
    agent: Agent,
    dataset: Dataset | str | Path,
    *,
    repeats: int = 1,
    concurrency: int = 4,
    judge: Model | None = None,
    max_judge_calls: int | None = None,
    pricing: Pricing | None = None,
    store: EvalStore | None = None,
    eval_id: str | None = None,
    agent_name: str | None = None,
    confidence: float = 0.95,
    on_trial: OnTrial | None = None,
) -> EvalReport:
    """``evaluate`` for synchronous code (also callable inside a running event loop: it then
    runs on a fresh loop in a worker thread)."""

    async def main() -> EvalReport:
        try:
            return await evaluate(
                agent,
                dataset,
                repeats=repeats,
                concurrency=concurrency,
                judge=judge,
                max_judge_calls=max_judge_calls,
                pricing=pricing,
                store=store,
                eval_id=eval_id,
                agent_name=agent_name,
                confidence=confidence,
                on_trial=on_trial,
            )
        finally:
            # the models' HTTP clients are bound to this loop, which is about to close
            for model in (agent.run_config.model, judge):
                aclose = getattr(model, "aclose", None)
                if aclose is not None:
                    await aclose()

    return run_sync(main)
