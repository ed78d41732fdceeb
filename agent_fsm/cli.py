"""``agent-fsm``: the command line.

Commands: ``demo`` (an offline run of the weather/calculator agent, printing every
transition, tool call and result), ``run`` (the same tools against a real OpenAI-compatible
server) and ``diagram`` (the machine as mermaid or DOT text).
Exit codes: 0 success, 1 the run failed, 2 bad usage. Errors go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TextIO

import structlog

from agent_fsm.agent import Agent
from agent_fsm.diagrams import FORMATS, render
from agent_fsm.errors import AgentFSMError
from agent_fsm.events import Event, ModelResponded, StateChanged, ToolFinished, ToolStarted
from agent_fsm.state import RunResult, RunStatus
from agent_fsm.table import TABLE

__all__ = ["main"]


def _configure_logging(verbose: bool) -> None:
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if verbose else logging.WARNING
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


class _Printer:
    """Prints a run's events as readable lines."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: Event) -> None:
        if isinstance(event, StateChanged):
            guards = " ∧ ".join(event.guards) or "else"
            print(
                f"[turn {event.turn}] {event.source.value:>7} → {event.dest.value:<7} "
                f"guard: {guards:<22} ({event.label})",
                file=self.out,
            )
        elif isinstance(event, ModelResponded) and event.text:
            print(f"          model says: {event.text}", file=self.out)
        elif isinstance(event, ToolStarted):
            print(f"          tool call:  {event.call.name}({event.call.arguments})", file=self.out)
        elif isinstance(event, ToolFinished):
            print(f"          result {event.status.value:<5} {event.output}", file=self.out)


def _summary(result: RunResult, out: TextIO) -> None:
    print("", file=out)
    label = "final answer" if result.status is not RunStatus.FAILED else "error"
    text = result.output if result.status is not RunStatus.FAILED else result.error
    print(f"{label}: {text}", file=out)
    print(f"status:       {result.status.value}", file=out)
    print(f"stop reason:  {result.stop_reason.value}", file=out)
    print(f"final state:  {result.final_state.value}", file=out)
    print(f"turns:        {result.turns}", file=out)
    usage = result.usage
    estimated = " (estimated)" if usage.estimated else ""
    print(
        f"tokens:       {usage.total_tokens} ({usage.input_tokens} in, "
        f"{usage.output_tokens} out){estimated}",
        file=out,
    )


def _run_agent(agent: Agent, question: str, out: TextIO) -> int:
    agent.subscribe(_Printer(out))
    bound = agent.bound
    print(f"question: {question}", file=out)
    print(
        f"bound:    at most {bound.model_calls} model calls and {bound.transitions} "
        f"transitions ({bound.formula})\n",
        file=out,
    )
    result = agent.run_sync(question)
    _summary(result, out)
    return 1 if result.status is RunStatus.FAILED else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from agent_fsm.demo import DEMO_QUESTION, demo_agent

    return _run_agent(demo_agent(), DEMO_QUESTION, sys.stdout)


def _cmd_run(args: argparse.Namespace) -> int:
    from agent_fsm.demo import calculator, get_weather
    from agent_fsm.limits import Limits
    from agent_fsm.models.openai_chat import OpenAIChatModel

    api_key = os.environ.get("OPENAI_API_KEY")
    if api_key is None and args.base_url:
        api_key = "unused"  # local OpenAI-compatible servers usually need no key
    model = OpenAIChatModel(args.model, base_url=args.base_url, api_key=api_key, stream=args.stream)
    agent = Agent(
        model=model,
        tools=[get_weather, calculator],
        system_prompt=args.system,
        limits=Limits(max_turns=args.max_turns, token_budget=args.token_budget),
    )
    return _run_agent(agent, args.question, sys.stdout)


def _cmd_diagram(args: argparse.Namespace) -> int:
    text = render(TABLE, args.format)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            handle.write(text)
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-fsm",
        description="Run LLM tool-calling agents as an explicit, verifiable state machine.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log every transition")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="run the offline weather/calculator demo agent")
    demo.set_defaults(handler=_cmd_demo)
    run = commands.add_parser(
        "run",
        help="run the example tools (weather, calculator) against a real model",
        description="Ask a question with the demo's tools against any OpenAI-compatible "
        "server. The API key is read from OPENAI_API_KEY, the server from --base-url or "
        "OPENAI_BASE_URL.",
    )
    run.add_argument("question")
    run.add_argument("--model", required=True, help="model name, e.g. gpt-4o-mini")
    run.add_argument(
        "--base-url", help="an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1"
    )
    run.add_argument("--stream", action="store_true", help="stream the model's replies")
    run.add_argument("--max-turns", type=int, default=10)
    run.add_argument("--token-budget", type=int, default=100_000)
    run.add_argument(
        "--system",
        default="Answer the user's question. Use the tools; do arithmetic with the calculator.",
    )
    run.set_defaults(handler=_cmd_run)
    diagram = commands.add_parser("diagram", help="print the agent state machine diagram")
    diagram.add_argument("--format", choices=FORMATS, default="mermaid")
    diagram.add_argument("-o", "--output", help="write to this file instead of stdout")
    diagram.set_defaults(handler=_cmd_diagram)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agent-fsm`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    _configure_logging(args.verbose)
    try:
        code: int = args.handler(args)
    except (OSError, AgentFSMError) as exc:
        print(f"agent-fsm: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
