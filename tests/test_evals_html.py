"""The HTML report (issue 38) in a real browser: Debian's headless Chromium opens the page
from disk, with no network, and lays out the inline SVG plots. The page has no script of its
own; the test adds one to a copy, which measures what the browser drew (each bar's box) and
writes it into the page for ``--dump-dom`` to return."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from agent_fsm.evals import Pricing, report_html
from agent_fsm.evals.records import TrialRecord
from agent_fsm.evals.report import EvalReport, summarise
from agent_fsm.evals.report_html import LABEL_W, PLOT_W
from tests.test_diagram_html import _browser, _drawn

pytestmark = pytest.mark.slow  # a browser per test: make check leaves it out

PROBE = """
<script>
const boxes = (selector) => [...document.querySelectorAll(selector)].map((element) => {
  const box = element.getBBox();
  return {case: element.dataset.case || null, cls: element.getAttribute("class"),
          x: box.x, width: box.width};
});
const probe = document.createElement("pre");
probe.id = "probe";
probe.textContent = JSON.stringify({
  rates: boxes("rect.rate"), intervals: boxes("line.ci"), costs: boxes("rect.cost"),
  svgs: document.querySelectorAll("svg").length,
  headline: document.getElementById("headline").textContent,
});
document.body.appendChild(probe);
</script>
"""


def _report() -> EvalReport:
    trials = []
    outcomes = {"always": [True] * 4, 'half <&> "quoted"': [True, False] * 2, "never": [False] * 4}
    pricing = Pricing(input_per_million=1.0, output_per_million=1.0)
    for name, passes in outcomes.items():
        for repeat, passed in enumerate(passes):
            tokens = 1000 * (1 + len(name) % 3) * (repeat + 1)
            trials.append(
                TrialRecord(
                    case=name,
                    repeat=repeat,
                    passed=passed,
                    input_tokens=tokens,
                    cost=tokens / 1e6 * pricing.input_per_million,
                    stop_reason="final_answer",
                    violation="left unanswered" if name == "never" and repeat == 0 else None,
                )
            )
    return summarise(
        trials, eval_id="html", dataset="plots", agent="a", cases=list(outcomes), repeats=4
    )


def test_the_page_is_self_contained_and_escapes_what_it_shows() -> None:
    page = report_html(_report())
    assert "<script" not in page.lower()
    assert re.findall(r"https?://[^\"' ]+", page) == ["http://www.w3.org/2000/svg"] * 2
    assert "half &lt;&amp;&gt; &quot;quoted&quot;" in page
    assert '<rect class="rate broken" data-case="never"' in page


def test_the_browser_draws_each_rate_with_its_interval_and_each_cost(tmp_path: Path) -> None:
    _browser()
    report = _report()
    page = report_html(report).replace("</body>", PROBE + "</body>")
    dom = _drawn(page, tmp_path)
    shown = dom.split('<pre id="probe">', 1)[1].split("</pre>", 1)[0]
    probe = json.loads(html.unescape(shown))
    assert probe["svgs"] == 2
    assert probe["headline"].startswith("6/12 runs passed (50%")
    summaries = [*report.cases, report.overall]
    drawn = {box["case"]: box for box in probe["rates"]}
    assert list(drawn) == [s.name for s in summaries]
    for summary in summaries:
        box = drawn[summary.name]
        assert box["x"] == pytest.approx(LABEL_W)
        assert box["width"] == pytest.approx(summary.rate * PLOT_W, abs=0.2)
    assert drawn["never"]["cls"] == "rate broken"
    lines = {box["case"]: box for box in probe["intervals"]}
    for summary in summaries:
        low, high = summary.interval.low, summary.interval.high
        assert lines[summary.name]["x"] == pytest.approx(LABEL_W + low * PLOT_W, abs=0.2)
        assert lines[summary.name]["width"] == pytest.approx((high - low) * PLOT_W, abs=0.2)
    costs = {box["case"]: box["width"] for box in probe["costs"]}
    medians = {s.name: s.cost.median for s in summaries if s.cost is not None}
    widest = max(s.cost.p90 for s in summaries if s.cost is not None and s.cost.p90)
    for name, median in medians.items():
        assert costs[name] == pytest.approx(median / widest * PLOT_W, abs=0.2)
