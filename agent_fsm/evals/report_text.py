"""The report as a terminal table: one row per case, then overall, stop reasons and the
reasons runs failed.

    case      pass   rate  95% CI        broken  turns p50/p90  tokens p50/p90  ...
    france    5/5    1.00  [0.57, 1.00]  0       2 / 2          310 / 318
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_fsm.evals.report import EvalReport, Summary
from agent_fsm.evals.stats import Spread

__all__ = ["report_text"]


def _number(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _pair(spread: Spread | None, digits: int = 0) -> str:
    if spread is None or not spread.count:
        return "-"
    return f"{_number(spread.median, digits)} / {_number(spread.p90, digits)}"


def _row(summary: Summary) -> list[str]:
    return [
        summary.name,
        f"{summary.passed}/{summary.runs}",
        f"{summary.rate:.2f}",
        str(summary.interval),
        str(summary.broken),
        _pair(summary.turns),
        _pair(summary.tokens),
        _pair(summary.latency_s, 2),
        _pair(summary.cost, 4),
    ]


_HEADER = ["case", "pass", "rate", "CI", "broken", "turns p50/p90", "tokens p50/p90"]
_HEADER += ["latency s p50/p90", "cost p50/p90"]


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for number, row in enumerate(rows):
        cells = [
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if number == 0 or number == len(rows) - 2:
            lines.append("  ".join("-" * width for width in widths))
    return lines


def report_text(report: EvalReport) -> str:
    """The report for a terminal (plain text, no colour)."""
    header = [*_HEADER]
    header[3] = f"{round(report.confidence * 100):d}% CI"
    rows = [header, *(_row(s) for s in report.cases), _row(report.overall)]
    overall = report.overall
    lines = [
        f"eval {report.eval_id}: dataset {report.dataset!r}, {len(report.cases)} case(s) x "
        f"{report.repeats} repeat(s), agent {report.agent}",
        "",
        *_table(rows),
        "",
        "stop reasons: "
        + ", ".join(f"{reason} {count}" for reason, count in overall.stop_reasons.items()),
    ]
    if overall.cost is not None:
        lines.append(f"cost: {overall.cost.total:,.4f} in all")
    if report.judge_calls:
        lines.append(f"judge: {report.judge_calls} call(s), {report.judge_tokens:,} tokens")
    if overall.broken:
        lines.append(
            f"BROKEN: {overall.broken} run(s) broke a run invariant (each fails whatever its score)"
        )
    failing = [s for s in report.cases if s.failures]
    if failing:
        lines += ["", "why runs failed:"]
        for summary in failing:
            lines += [f"  {summary.name}: {line}" for line in summary.failures]
    return "\n".join(lines) + "\n"
