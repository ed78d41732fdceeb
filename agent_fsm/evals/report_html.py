"""The report as one self-contained HTML page: a plot of each case's pass rate with its
interval, a plot of what each case cost (money when the eval was priced, else tokens), and
the tables of the text report.

The plots are SVG drawn here, inline in the page: no script, no library, nothing fetched,
so the page opens from disk, offline, in any browser, and can be attached to a CI run as it
is. Every text from the dataset or the runs is escaped.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from agent_fsm.evals.report import EvalReport, Summary
from agent_fsm.evals.report_text import report_text

__all__ = ["report_html"]

LABEL_W = 200
"""Width of the case names left of a plot."""
PLOT_W = 440
ROW_H = 26
TOP = 28
"""Room above the first bar for the axis labels."""

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
.axis { stroke: #999; stroke-width: 1; } .grid { stroke: #ddd; stroke-width: 1; }
.rate { fill: #4c8bf5; } .rate.low { fill: #e8a33d; } .rate.broken { fill: #d93025; }
.ci { stroke: #222; stroke-width: 2; } .cost { fill: #34a853; } .p90 { fill: #0b6e2a; }
pre { background: #f6f6f6; padding: 1em; overflow-x: auto; }
.verdict-broken { color: #d93025; font-weight: bold; }
.note { color: #555; font-size: 0.9em; }
"""


def _x(fraction: float) -> float:
    return LABEL_W + max(0.0, min(1.0, fraction)) * PLOT_W


def _frame(rows: int, ticks: Sequence[tuple[float, str]], title: str) -> list[str]:
    height = TOP + rows * ROW_H + 8
    width = LABEL_W + PLOT_W + 60
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
    ]
    for fraction, label in ticks:
        x = _x(fraction)
        parts.append(
            f'<line class="grid" x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{height - 8}"/>'
        )
        parts.append(
            f'<text x="{x:.1f}" y="{TOP - 10}" text-anchor="middle">{escape(label)}</text>'
        )
    parts.append(
        f'<line class="axis" x1="{LABEL_W}" y1="{TOP - 6}" x2="{LABEL_W}" y2="{height - 8}"/>'
    )
    return parts


def _label(index: int, name: str) -> str:
    y = TOP + index * ROW_H + ROW_H / 2 + 4
    shown = name if len(name) <= 28 else name[:27] + "…"
    return f'<text x="{LABEL_W - 8}" y="{y:.1f}" text-anchor="end">{escape(shown)}</text>'


def rate_plot(summaries: Sequence[Summary]) -> str:
    """Each pass rate as a bar, its interval as a line across it; a case with a broken run
    is red, one whose interval stays below one half is amber."""
    parts = _frame(len(summaries), [(i / 4, f"{i * 25}%") for i in range(5)], "pass rates")
    for index, summary in enumerate(summaries):
        top = TOP + index * ROW_H + 4
        middle = top + (ROW_H - 8) / 2
        kind = "broken" if summary.broken else "low" if summary.interval.high < 0.5 else ""
        width = _x(summary.rate) - LABEL_W
        tip = f"{summary.name}: {summary.passed}/{summary.runs} passed, {summary.interval}"
        if summary.broken:
            tip += f", {summary.broken} broken"
        parts.append(_label(index, summary.name))
        classes = f"rate {kind}".strip()
        parts.append(
            f'<rect class="{classes}" data-case="{escape(summary.name)}" '
            f'x="{LABEL_W}" y="{top}" width="{width:.1f}" height="{ROW_H - 8}">'
            f"<title>{escape(tip)}</title></rect>"
        )
        low, high = _x(summary.interval.low), _x(summary.interval.high)
        parts.append(
            f'<line class="ci" data-case="{escape(summary.name)}" x1="{low:.1f}" '
            f'y1="{middle:.1f}" x2="{high:.1f}" y2="{middle:.1f}"/>'
        )
        parts.append(
            f'<text x="{LABEL_W + PLOT_W + 8}" y="{middle + 4:.1f}">{summary.rate:.0%}</text>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def cost_plot(summaries: Sequence[Summary]) -> str:
    """Each case's median cost per run as a bar, with a tick at its p90; tokens when the
    eval was not priced."""
    priced = any(s.cost is not None for s in summaries)

    def measure(summary: Summary) -> tuple[float, float]:
        spread = summary.cost if priced else summary.tokens
        if spread is None or spread.median is None or spread.p90 is None:
            return 0.0, 0.0
        return spread.median, spread.p90

    values = [measure(s) for s in summaries]
    top_value = max((p90 for _, p90 in values), default=0.0) or 1.0
    unit = "cost per run" if priced else "tokens per run"
    digits = 4 if priced else 0
    ticks = [(i / 4, f"{top_value * i / 4:,.{digits}f}") for i in range(5)]
    parts = _frame(len(summaries), ticks, unit)
    for index, (summary, (median, p90)) in enumerate(zip(summaries, values, strict=True)):
        top = TOP + index * ROW_H + 4
        parts.append(_label(index, summary.name))
        tip = f"{summary.name}: median {median:,.{digits}f}, p90 {p90:,.{digits}f} ({unit})"
        parts.append(
            f'<rect class="cost" data-case="{escape(summary.name)}" x="{LABEL_W}" y="{top}" '
            f'width="{_x(median / top_value) - LABEL_W:.1f}" height="{ROW_H - 8}">'
            f"<title>{escape(tip)}</title></rect>"
        )
        parts.append(
            f'<rect class="p90" x="{_x(p90 / top_value) - 1.5:.1f}" y="{top - 2}" width="3" '
            f'height="{ROW_H - 4}"/>'
        )
        parts.append(
            f'<text x="{LABEL_W + PLOT_W + 8}" y="{top + ROW_H / 2:.1f}">'
            f"{median:,.{digits}f}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def _trial_rows(report: EvalReport) -> str:
    rows = []
    for trial in report.trials:
        verdict = "broken" if trial.broken else "pass" if trial.passed else "fail"
        why = "; ".join(trial.failures)
        rows.append(
            f"<tr><td>{escape(trial.case)}</td><td>{trial.repeat}</td>"
            f'<td class="verdict-{verdict}">{verdict}</td>'
            f"<td>{escape(trial.stop_reason or '-')}</td><td>{trial.turns}</td>"
            f"<td>{trial.tokens}</td><td>{trial.latency_s:.2f}</td>"
            f"<td>{escape(why[:300])}</td></tr>"
        )
    head = "<tr><th>case</th><th>repeat</th><th>verdict</th><th>stop</th><th>turns</th>"
    head += "<th>tokens</th><th>latency s</th><th>why it failed</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def report_html(report: EvalReport) -> str:
    """The whole page, as a string to write to a ``.html`` file."""
    summaries = [*report.cases, report.overall]
    title = f"eval {report.eval_id}: {report.dataset}"
    overall = report.overall
    headline = (
        f"{overall.passed}/{overall.runs} runs passed ({overall.rate:.0%}, "
        f"{round(report.confidence * 100)}% CI {overall.interval}); {overall.broken} broke a "
        "run invariant"
    )
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en"><head><meta charset="utf-8">',
            f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
            f"<h1>{escape(title)}</h1>",
            f'<p id="headline">{escape(headline)}</p>',
            "<h2>Pass rate per case</h2>",
            rate_plot(summaries),
            '<p class="note">Each bar: the share of runs that passed; the line across it: its '
            f"{round(report.confidence * 100)}% interval (Wilson). Red: a run broke a run "
            "invariant; amber: the whole interval is below one half.</p>",
            "<h2>Cost per case</h2>" if overall.cost is not None else "<h2>Tokens per case</h2>",
            cost_plot(summaries),
            '<p class="note">Each bar: the median per run; the dark tick: the p90.</p>',
            "<h2>Summary</h2>",
            f"<pre>{escape(report_text(report))}</pre>",
            "<h2>Every run</h2>",
            _trial_rows(report),
            "</body></html>",
        ]
    )
