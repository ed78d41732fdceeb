"""Evals: how often the capitals agent is right, with uncertainty, and whether any run broke a
promise. Needs the evals extra (pip install -e '.[evals]'), for YAML.

python examples/evals_capitals.py [--repeats 5] [--html capitals.html]
python examples/evals_capitals.py --model qwen2.5-7b-instruct --base-url http://127.0.0.1:8080/v1
agent-fsm eval examples/evals/capitals.yaml --agent examples/evals_capitals.py:offline_agent \
    --judge examples/evals_capitals.py:offline_judge --repeats 3 --html capitals.html

The dataset (``examples/evals/capitals.yaml``) has four cases: a lookup, a trap (Sydney is
not Australia's capital) graded by an LLM judge as well, arithmetic that must not call the
tool, and a two-message conversation. Offline, a ``FunctionModel`` plays a careful agent and
another one the judge; with ``--model``, the same dataset runs against a real
OpenAI-compatible server, which also judges.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from agent_fsm import Agent, Limits, tool
from agent_fsm.evals import Dataset, evaluate_sync, report_html, report_text
from agent_fsm.messages import ModelRequest, ModelResponse, ToolMessage
from agent_fsm.models import Model
from agent_fsm.testing import FunctionModel, call, reply

DATASET = Path(__file__).parent / "evals" / "capitals.yaml"
CAPITALS = {"france": "Paris", "australia": "Canberra", "italy": "Rome", "spain": "Madrid"}
SYSTEM_PROMPT = "Answer in one sentence. Look capitals up with lookup_capital; never guess."


@tool
def lookup_capital(country: str) -> str:
    """The capital city of a country."""
    return CAPITALS.get(country.strip().lower(), "unknown")


def _careful(request: ModelRequest) -> ModelResponse:
    """The offline agent: it looks up every capital it is asked for, answers sums itself."""
    last = request.messages[-1]
    if isinstance(last, ToolMessage):
        return reply(f"The capital is {last.content}.", usage=(120, 12))
    asked = re.search(r"capital of (\w+)", last.content)
    if asked:
        return reply("", call("lookup_capital", country=asked.group(1)), usage=(100, 15))
    return reply("42", usage=(90, 2))


def _fair_judge(request: ModelRequest) -> ModelResponse:
    """The offline judge: the expected answer must be in the assistant's answer."""
    prompt = request.messages[-1].content
    expected = re.search(r'Expected answer: "(.*)"', prompt)
    answer = prompt.rsplit("Assistant's answer: ", 1)[-1]
    passed = expected is None or expected.group(1) in answer
    verdict = {"pass": passed, "score": float(passed), "reason": "checked the city"}
    return reply(json.dumps(verdict), usage=(150, 20))


def build_agent(model: Model) -> Agent:
    return Agent(
        model=model,
        tools=[lookup_capital],
        system_prompt=SYSTEM_PROMPT,
        limits=Limits(max_turns=6, token_budget=20_000),
    )


def offline_agent() -> Agent:
    return build_agent(FunctionModel(_careful, name="careful"))


def offline_judge() -> Model:
    return FunctionModel(_fair_judge, name="judge")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="a real model name; omit for the offline models")
    parser.add_argument("--base-url", help="an OpenAI-compatible server")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--html", metavar="FILE", help="also write the report as an HTML page")
    args = parser.parse_args()
    if args.model is None:
        agent, judge = offline_agent(), offline_judge()
    else:
        from agent_fsm.models import OpenAIChatModel

        judge = OpenAIChatModel(args.model, base_url=args.base_url)
        agent = build_agent(judge)
    report = evaluate_sync(
        agent, Dataset.load(DATASET), repeats=args.repeats, judge=judge, max_judge_calls=50
    )
    print(report_text(report))
    if args.html:
        Path(args.html).write_text(report_html(report), encoding="utf-8")
        print(f"HTML report: {args.html}")
    if args.model is None:
        assert report.overall.passed == report.overall.runs == 4 * args.repeats, report
        assert report.broken == 0
        assert report.judge_calls == args.repeats


if __name__ == "__main__":
    main()
