"""Evals: how often is the agent right, and did any run break a promise.

A ``Dataset`` of ``Case``s (YAML or JSON) runs against an agent, every case ``repeats`` times;
each run is checked by the run invariants and judged by evaluators; the ``EvalReport`` gives
pass rates with Wilson intervals, tokens, cost, latency and turns (median, p90) and stop
reasons, as a terminal table or an HTML page, and gates against a saved baseline.

    from agent_fsm.evals import Dataset, evaluate_sync, report_text, assert_pass_rate

    report = evaluate_sync(agent, Dataset.load("capitals.yaml"), repeats=5)
    print(report_text(report))
    assert_pass_rate(agent, "capitals.yaml", repeats=5, at_least=0.9)   # in a test

From the command line: ``agent-fsm eval capitals.yaml --agent app.agents:support``. YAML
datasets need the ``evals`` extra (``pip install -e '.[evals]'``).
"""

from agent_fsm.evals.assertions import EvalFailure, assert_pass_rate
from agent_fsm.evals.context import CallBudget, EvalContext, Evaluator, Verdict
from agent_fsm.evals.dataset import AnyEvaluator, Case, Dataset
from agent_fsm.evals.evaluators import Check, Contains, Equals, Matches, MatchesSchema, Validates
from agent_fsm.evals.gate import GateResult, Regression, RegressionError, assert_no_regression, gate
from agent_fsm.evals.judge import Judge
from agent_fsm.evals.progress import ProgressBar
from agent_fsm.evals.records import Pricing, TrialRecord
from agent_fsm.evals.report import EvalReport, Summary
from agent_fsm.evals.report_html import report_html
from agent_fsm.evals.report_text import report_text
from agent_fsm.evals.runner import evaluate, evaluate_sync
from agent_fsm.evals.stats import Interval, Spread, difference_interval, wilson_interval
from agent_fsm.evals.store import EvalInfo, EvalStore
from agent_fsm.evals.trajectory import Called, CalledInOrder, NotCalled, WithinTurns

__all__ = [
    # datasets
    "Case",
    "Dataset",
    # evaluators
    "AnyEvaluator",
    "Evaluator",
    "EvalContext",
    "Verdict",
    "Equals",
    "Contains",
    "Matches",
    "MatchesSchema",
    "Validates",
    "Check",
    "Judge",
    "CallBudget",
    "Called",
    "NotCalled",
    "CalledInOrder",
    "WithinTurns",
    # running
    "evaluate",
    "evaluate_sync",
    "Pricing",
    "ProgressBar",
    "EvalStore",
    "EvalInfo",
    # the report
    "EvalReport",
    "Summary",
    "TrialRecord",
    "report_text",
    "report_html",
    # statistics and the gate
    "Interval",
    "Spread",
    "wilson_interval",
    "difference_interval",
    "gate",
    "GateResult",
    "Regression",
    "RegressionError",
    "assert_no_regression",
    # in tests
    "assert_pass_rate",
    "EvalFailure",
]
