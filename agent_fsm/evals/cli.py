"""``agent-fsm eval DATASET --agent module:attr``: the eval command.

The command line registers it (``add_eval_command``); everything it does is here. It runs
the dataset against the agent with a progress bar on stderr, prints the text report, keeps
every trial in a SQLite store as it finishes (``--eval-id`` continues an eval that was
interrupted), and can write the report as JSON (a baseline) and HTML, gate against a
baseline, and require a pass rate.

Exit codes: 0 the eval passed; 1 it fell short (a run broke a run invariant, the pass rate is
below ``--at-least``, or a rate regressed against ``--baseline``); 2 bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path
from typing import Any, Protocol

from agent_fsm.errors import ConfigError
from agent_fsm.evals.dataset import Dataset
from agent_fsm.evals.gate import gate
from agent_fsm.evals.progress import ProgressBar
from agent_fsm.evals.records import Pricing
from agent_fsm.evals.report import EvalReport
from agent_fsm.evals.report_html import report_html
from agent_fsm.evals.report_text import report_text
from agent_fsm.evals.runner import evaluate_sync
from agent_fsm.evals.store import EvalStore
from agent_fsm.loading import load_agent, load_object
from agent_fsm.models.base import Model

__all__ = ["add_eval_command", "run_eval_command"]

DEFAULT_STORE = "agent_fsm.sqlite3"
"""Where results go by default: the file ``agent-fsm runs`` reads too."""
STORE_VARIABLE = "AGENT_FSM_EVAL_STORE"
"""The environment variable that names another default (a SQLite file)."""


class _Commands(Protocol):
    """What ``add_eval_command`` needs of argparse's subcommands object."""

    def add_parser(self, name: str, **options: Any) -> argparse.ArgumentParser: ...


def add_eval_command(commands: _Commands) -> None:
    """Add ``eval`` to the command line's subcommands."""
    command = commands.add_parser(
        "eval",
        help="run a dataset of cases against your agent and report how often it is right",
        description="Run every case of DATASET (YAML or JSON) --repeats times against the "
        "agent --agent names, check each run against the run invariants, judge it with the "
        "dataset's evaluators, and print pass rates with confidence intervals, tokens, cost, "
        "latency, turns and stop reasons. Exits 1 when a run broke a run invariant, the "
        "pass rate is below --at-least, or a rate regressed against --baseline.",
    )
    command.add_argument("dataset", metavar="DATASET", help="a .yaml/.yml or .json dataset")
    command.add_argument(
        "--agent",
        required=True,
        metavar="MODULE:ATTR",
        help="the agent: module:attr or path/file.py:attr (a function is called to build it)",
    )
    command.add_argument(
        "--repeats", type=int, default=1, metavar="N", help="runs per case (default 1)"
    )
    command.add_argument(
        "--concurrency", type=int, default=4, metavar="N", help="runs at once (default 4)"
    )
    command.add_argument(
        "--judge", metavar="MODULE:ATTR", help="the model LLM judges call (a Model, or a function)"
    )
    command.add_argument(
        "--max-judge-calls", type=int, metavar="N", help="the most judge calls the eval may make"
    )
    command.add_argument(
        "--price",
        nargs=2,
        type=float,
        metavar=("IN", "OUT"),
        help="price per million input and output tokens, for the cost columns",
    )
    command.add_argument(
        "--store",
        default=os.environ.get(STORE_VARIABLE) or DEFAULT_STORE,
        metavar="PATH",
        help="the SQLite file each finished run is recorded in (default: "
        f"${STORE_VARIABLE}, else {DEFAULT_STORE})",
    )
    command.add_argument(
        "--eval-id", metavar="ID", help="continue eval ID of the store (a new one by default)"
    )
    command.add_argument("--baseline", metavar="FILE", help="gate against this saved report")
    command.add_argument(
        "--json", metavar="FILE", help="write the report as JSON (a later --baseline)"
    )
    command.add_argument("--html", metavar="FILE", help="write the report as an HTML page")
    command.add_argument(
        "--at-least", type=float, metavar="RATE", help="fail below this overall pass rate"
    )
    command.add_argument(
        "--confidence", type=float, default=0.95, metavar="P", help="of the intervals (0.95)"
    )
    command.add_argument("--no-progress", action="store_true", help="no progress bar")
    command.set_defaults(handler=run_eval_command)


def _judge(reference: str) -> Model:
    found = load_object(reference, object)  # a Model protocol is no class to look for
    if not isinstance(found, Model) and callable(found):
        try:
            found = found()
        except Exception as exc:
            raise ConfigError(f"{reference!r}: building the judge raised {exc!r}") from exc
    if not isinstance(found, Model):
        raise ConfigError(f"{reference!r} is no Model (a name and an async request method)")
    return found


def run_eval_command(args: argparse.Namespace) -> int:
    """The ``eval`` command; returns the exit code."""
    if args.repeats < 1 or args.concurrency < 1:
        raise ConfigError("--repeats and --concurrency must be at least 1")
    dataset = Dataset.load(args.dataset)
    agent = load_agent(args.agent)
    judge = _judge(args.judge) if args.judge else None
    baseline = EvalReport.load(args.baseline) if args.baseline else None
    pricing = (
        Pricing(input_per_million=args.price[0], output_per_million=args.price[1])
        if args.price
        else None
    )
    eval_id = args.eval_id or uuid.uuid4().hex[:12]
    print(
        f"eval {eval_id}: recording into {args.store} (continue it: --eval-id {eval_id})",
        file=sys.stderr,
    )
    with EvalStore(args.store) as store:
        report = evaluate_sync(
            agent,
            dataset,
            repeats=args.repeats,
            concurrency=args.concurrency,
            judge=judge,
            max_judge_calls=args.max_judge_calls,
            pricing=pricing,
            store=store,
            eval_id=eval_id,
            agent_name=args.agent,
            confidence=args.confidence,
            on_trial=None if args.no_progress else ProgressBar(sys.stderr),
        )
    sys.stdout.write(report_text(report))
    if args.json:
        report.save(args.json)
    if args.html:
        Path(args.html).write_text(report_html(report), encoding="utf-8")
    code = 1 if report.broken else 0
    if args.at_least is not None and report.overall.rate < args.at_least:
        print(f"FAILED: pass rate {report.overall.rate:.2f} is below {args.at_least}")
        code = 1
    if baseline is not None:
        result = gate(report, baseline)
        print(f"gate: {result}")
        code = code or (0 if result.ok else 1)
    return code
