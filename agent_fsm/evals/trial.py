"""One trial: run one case once, check the run's invariants, judge it, and record it.

The run is driven step by step, never past the agent's termination bound, and every run is
checked by the same invariants the test harness asserts (``check_invariants``: it ended in
DONE or ERROR within the bound, its transcript answers every call once and in order, usage
adds up and budgets held, a control tool stopped the run as the table says). A broken
promise fails the trial whatever the evaluators said. Nothing the run or an evaluator does
raises out of here, except what stops the whole process (``BaseException``: Ctrl-C, a
crash), which is what a resumed eval picks up after.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from agent_fsm.agent import Agent, History
from agent_fsm.evals.context import CallBudget, EvalContext, Evaluator, Verdict
from agent_fsm.evals.dataset import Case
from agent_fsm.evals.records import OUTPUT_KEPT, Pricing, TrialRecord
from agent_fsm.events import Event
from agent_fsm.messages import Usage
from agent_fsm.models.base import Model
from agent_fsm.run.engine import Run
from agent_fsm.state import RunResult
from agent_fsm.testing.invariants import InvariantViolation, check_invariants

__all__ = ["Trial", "play_trial"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Trial:
    """What one trial needs beyond its case: the agent and how it is judged."""

    agent: Agent
    evaluators: Sequence[Evaluator]
    judge: Model | None = None
    judge_budget: CallBudget | None = None
    """The eval's budget; each trial draws from it through one of its own."""
    pricing: Pricing | None = None


@dataclass(slots=True)
class _Played:
    results: list[RunResult]
    violation: str | None = None
    error: str | None = None
    latency_s: float = 0.0


async def play_trial(trial: Trial, case: Case, repeat: int) -> TrialRecord:
    """Run ``case`` once (``repeat`` is its number), then check and judge it."""
    played = await _play(trial.agent, case)
    budget = (
        CallBudget(limit=trial.judge_budget.limit, parent=trial.judge_budget)
        if trial.judge_budget is not None
        else None
    )
    verdicts: list[Verdict] = []
    last = played.results[-1] if played.results else None
    usage = sum((r.usage for r in played.results), Usage())
    turns = sum(r.turns for r in played.results)
    if last is not None and played.error is None:
        context = EvalContext(
            case=case.name,
            input=case.input,
            expected=case.expected_output,
            metadata=case.metadata,
            result=last,
            turns=turns,
            judge=trial.judge,
            judge_budget=budget,
        )
        verdicts = [await _judged(evaluator, context) for evaluator in trial.evaluators]
    passed = (
        last is not None
        and played.error is None
        and played.violation is None
        and all(v.passed for v in verdicts)
    )
    return TrialRecord(
        case=case.name,
        repeat=repeat,
        passed=passed,
        verdicts=tuple(verdicts),
        violation=played.violation,
        error=played.error,
        status=last.status.value if last is not None else None,
        stop_reason=last.stop_reason.value if last is not None else None,
        turns=turns,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cost=trial.pricing.cost(usage) if trial.pricing is not None else None,
        latency_s=played.latency_s,
        tools_called=_tools_called(played.results),
        output=last.output[:OUTPUT_KEPT] if last is not None and last.output else None,
        run_ids=tuple(r.run_id for r in played.results),
        judge_calls=budget.made if budget is not None else 0,
        judge_tokens=budget.usage.total_tokens if budget is not None else 0,
    )


def _tools_called(results: Sequence[RunResult]) -> tuple[str, ...]:
    """The tools the model called over the case, in order (a conversation's last run holds
    the earlier runs' transcripts as its history, so only the last is read)."""
    if not results:
        return ()
    context = EvalContext(
        case="", input="", expected=None, metadata={}, result=results[-1], turns=0
    )
    return tuple(context.tools_called)


async def _judged(evaluator: Evaluator, context: EvalContext) -> Verdict:
    try:
        return await evaluator.evaluate(context)
    except Exception as exc:  # an evaluator's failure fails its verdict, not the eval
        name = getattr(evaluator, "name", type(evaluator).__name__)
        return Verdict(
            evaluator=str(name), passed=False, reason=f"raised {type(exc).__name__}: {exc}"
        )


async def _play(agent: Agent, case: Case) -> _Played:
    """Each message of the case in turn, each run going on from the previous transcript."""
    inputs = (case.input,) if isinstance(case.input, str) else case.input
    played = _Played(results=[])
    history: History | None = case.history or None
    bound = agent.bound
    started = time.perf_counter()
    try:
        for text in inputs:
            run = agent.start(text, history=history)
            events: list[Event] = []
            run.subscribe(events.append)
            if not await _drive(run, bound.transitions):
                played.violation = (
                    f"the run had not ended after {bound.transitions} transitions, the "
                    f"termination bound ({bound.formula}); it was in {run.state.state}"
                )
                break
            result = run.result
            played.results.append(result)
            try:
                check_invariants(
                    result,
                    limits=agent.limits,
                    bound=bound,
                    events=events,
                    rows=agent.machine.rows,
                )
            except InvariantViolation as exc:
                played.violation = str(exc)
                break
            history = result
    except Exception as exc:  # a programming error escaped the run: the trial records it
        played.error = f"{type(exc).__name__}: {exc}"
    played.latency_s = time.perf_counter() - started
    return played


async def _drive(run: Run, cap: int) -> bool:
    """Step until the run ends or ``cap`` transitions were taken; True when it ended."""
    for _ in range(cap):
        if run.done:
            break
        await run.step()
    return run.done
