"""``agent-fsm run`` and ``agent-fsm resume``: the demo's tools against a real model.

``--provider`` picks the adapter (``models.registry.PROVIDERS``, the package's own table):
OpenAI Chat Completions (the default, and
any OpenAI-compatible server), the OpenAI Responses API, Anthropic Messages or Google Gemini.
Everything a local OpenAI-compatible server (llama.cpp, vLLM, Ollama) needs is an option:
the sampling settings, a timeout, retries, a key read from an environment variable the user
names, and ``--set key=value`` for any other request field (a field the SDK does not know goes
to the server in ``extra_body``). A pause (ask_user, an approval) is answered at the terminal
when stdin is one (or with ``--interactive``), or later with ``agent-fsm resume RUN_ID``,
which needs the run checkpointed (``--store``).

Exit codes follow ``cli``: 0 done or paused, 1 the run failed, 2 bad usage (no key, a bad
option or setting, an answer that does not fit the pause).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from agent_fsm.agent import Agent
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import ConfigError
from agent_fsm.events import Event, MessageUpdated, ModelResponded
from agent_fsm.limits import Limits
from agent_fsm.messages import clean_json, clean_text
from agent_fsm.models.base import Model
from agent_fsm.models.registry import PROVIDERS, Provider
from agent_fsm.run.approvals import Decisions
from agent_fsm.state import ControlKind, RunResult, RunStatus

__all__ = [
    "PROVIDERS",
    "Provider",
    "add_model_options",
    "build_agent",
    "build_model",
    "run_until_settled",
]

_TOOLS = ("get_weather", "calculator")


def add_model_options(parser: argparse.ArgumentParser, *, store_required: bool) -> None:
    """The options that build the agent, shared by ``run`` and ``resume`` (a resumed run
    needs the same model and tools it started with)."""
    model = parser.add_argument_group("model")
    model.add_argument(
        "--provider",
        choices=sorted(PROVIDERS),
        default="openai",
        help="the API the model speaks (default: openai, Chat Completions, which any "
        "OpenAI-compatible server speaks too)",
    )
    model.add_argument("--model", required=True, help="model name, e.g. gpt-4o-mini")
    model.add_argument(
        "--base-url",
        help="the API root: an OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1, or a "
        "proxy in front of the provider",
    )
    model.add_argument(
        "--api-key-env",
        metavar="NAME",
        default=None,
        help="the environment variable holding the API key (default: the provider's own: "
        + ", ".join(f"{p.key_variable} for {name}" for name, p in sorted(PROVIDERS.items()))
        + "); a --base-url server may need none",
    )
    model.add_argument("--temperature", type=float, help="sampling temperature")
    model.add_argument("--max-tokens", type=int, help="cap on each reply's tokens")
    model.add_argument("--timeout", type=float, help="seconds allowed for one model request")
    model.add_argument(
        "--set",
        dest="fields",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="any other request field, VALUE as JSON if it parses (--set top_k=40 "
        "--set stop='[\"END\"]'); fields the SDK does not know go to the server in extra_body",
    )
    model.add_argument("--stream", action="store_true", help="print the reply as it arrives")
    run = parser.add_argument_group("run")
    run.add_argument(
        "--max-turns",
        type=int,
        default=10,
        help="model calls the run may make, retries aside (Limits.max_turns; default 10)",
    )
    run.add_argument(
        "--token-budget",
        type=int,
        default=100_000,
        help="tokens the run may spend, prompts and replies (Limits.token_budget; default 100000)",
    )
    run.add_argument(
        "--retries",
        type=int,
        default=Limits().model_retries,
        help="retries of a failed model call before the run stops (Limits.model_retries; "
        f"default {Limits().model_retries})",
    )
    run.add_argument(
        "--system",
        default="Answer the user's question. Use the tools; do arithmetic with the calculator.",
        help="the system prompt (default: the demo's, which names its tools)",
    )
    run.add_argument(
        "--require-approval",
        metavar="TOOL",
        action="append",
        default=[],
        choices=_TOOLS,
        help="a person approves every call of TOOL before it runs",
    )
    run.add_argument(
        "--store",
        metavar="PATH",
        required=store_required,
        help="checkpoint the run into this SQLite store, so that `agent-fsm resume` can "
        "continue it later" + ("" if store_required else " (required for that)"),
    )
    run.add_argument(
        "--interactive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="answer a pause at the terminal (default: when stdin is a terminal)",
    )


def build_agent(args: argparse.Namespace) -> Agent:
    """The agent the options describe.

    Raises:
        ConfigError: no API key where one is needed, a bad ``--set``, or a setting the
            model refuses (the CLI exits 2).
    """
    from agent_fsm.demo import calculator, get_weather
    from agent_fsm.limits import Limits
    from agent_fsm.tools.tool import Tool

    model = build_model(args)
    tools: list[Tool] = [get_weather, calculator]
    tools = [
        dataclasses.replace(tool, requires_approval=True)
        if tool.name in args.require_approval
        else tool
        for tool in tools
    ]
    return Agent(
        model=model,
        tools=tools,
        system_prompt=args.system,
        limits=Limits(
            max_turns=args.max_turns,
            token_budget=args.token_budget,
            model_retries=args.retries,
            model_retries_per_run=max(args.retries * 3, args.retries),
        ),
        store=SQLiteStore(args.store) if args.store else None,
    )


def build_model(args: argparse.Namespace) -> Model:
    """The model adapter the options describe (``--provider``, ``--model``, the key, ...).

    Raises:
        ConfigError: no API key where one is needed, a provider whose SDK is not installed,
            a bad ``--set``, or a setting the adapter refuses.
    """
    provider = PROVIDERS[args.provider]
    variable = args.api_key_env or provider.key_variable
    api_key = os.environ.get(variable)
    if api_key is None:
        if args.base_url is None:
            raise ConfigError(
                f"no API key: set {variable}, or name the variable that holds it with "
                "--api-key-env (a local server given with --base-url may need none)"
            )
        api_key = "unused"  # local OpenAI-compatible servers usually need no key
    adapter = provider.adapter()
    requested = _fields(args.fields)
    if args.temperature is not None:  # a request field: where the SDK has none, extra_body
        requested["temperature"] = args.temperature
    fields = provider.settings(requested)
    for name in ("max_tokens", "timeout"):
        value = getattr(args, name)
        if value is not None:
            fields[name] = value
    return adapter(
        args.model, base_url=args.base_url, api_key=api_key, stream=args.stream, **fields
    )


MAX_SET_DEPTH = 64
"""How deep a ``--set`` value may nest: far more than any request field needs, and far less
than what breaks the JSON encoders between here and the server (Python's recursion limit)."""


def _fields(pairs: list[str]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs: VALUE as JSON if it parses, else as text; text that is not
    UTF-8 (argv decoded with surrogates) cleaned, as a run's text is.

    Raises:
        ConfigError: a pair without ``=``, or a value nested deeper than ``MAX_SET_DEPTH``.
    """
    fields: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = clean_text(key.strip())
        if not sep or not key:
            raise ConfigError(f"--set takes KEY=VALUE, got {pair[:80]!r}")
        try:
            value: Any = json.loads(text)
        except RecursionError:
            value = None  # nested too deep for the parser: refused below
            depth = MAX_SET_DEPTH + 1
        except ValueError:
            value, depth = text, 0
        else:
            depth = _depth(value)
        if depth > MAX_SET_DEPTH:
            raise ConfigError(
                f"--set {key}: the value nests deeper than {MAX_SET_DEPTH} levels (it is"
                f" {len(text):,} characters long); no request field needs that"
            )
        fields[key] = clean_json(value)
    return fields


def _depth(value: Any, limit: int = MAX_SET_DEPTH) -> int:
    """How deep ``value`` nests, counting no further than ``limit + 1``."""
    if not isinstance(value, list | dict) or limit < 0:
        return 0
    items = value.values() if isinstance(value, dict) else value
    return 1 + max((_depth(item, limit - 1) for item in items), default=0)


class StreamPrinter:
    """Prints a streamed reply's text as it arrives, then ends the line."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._open = False

    def __call__(self, event: Event) -> None:
        if isinstance(event, MessageUpdated) and event.delta.text:
            if not self._open:
                self.out.write("          model says: ")
                self._open = True
            self.out.write(event.delta.text)
            self.out.flush()
        elif isinstance(event, ModelResponded) and self._open:
            self.out.write("\n")
            self._open = False


Resume = Callable[[str | None, Decisions | None, str | None], RunResult]
"""Answers the run's pause: ``resume(reply, approvals, pause)``."""


def run_until_settled(
    result: RunResult,
    resume: Resume,
    *,
    interactive: bool | None,
    out: TextIO,
    summarise: Callable[[RunResult], None],
    store: str | None,
) -> RunResult:
    """Answer the run's pauses at the terminal while it is interactive; otherwise say how to
    answer later. Returns the last result."""
    if interactive is None:
        interactive = sys.stdin.isatty()
    summarise(result)
    while result.status is RunStatus.NEEDS_INPUT:
        answer = _ask(result, out) if interactive else None
        if answer is None:
            _how_to_resume(result, out, store)
            break
        reply, approvals = answer
        result = resume(reply, approvals, result.pending.pause if result.pending else None)
        summarise(result)
    return result


def _ask(result: RunResult, out: TextIO) -> tuple[str | None, Decisions | None] | None:
    """The person's answer to the pause, read from stdin; None at end of input."""
    pending = result.pending
    assert pending is not None  # a run that needs input says what it waits for
    if pending.kind is ControlKind.ASK_USER:
        reply = _read_line("your answer> ", out)
        if not reply:
            return None
        return reply, None
    decisions: dict[str, bool] = {}
    for call in pending.pending_calls:
        line = _read_line(f"approve {call.name}({call.arguments})? [y/N] ", out)
        if line is None:
            return None
        decisions[call.id] = line.lower() in ("y", "yes")
    return None, decisions


def _read_line(prompt: str, out: TextIO) -> str | None:
    out.write(prompt)
    out.flush()
    line = sys.stdin.readline()
    if not line:
        out.write("\n")
        return None
    return line.strip()


def _how_to_resume(result: RunResult, out: TextIO, store: str | None) -> None:
    pending = result.pending
    if store is None:
        print(
            "the run waits for an answer; run with --store PATH to answer it later with "
            "`agent-fsm resume`",
            file=out,
        )
        return
    answer = "'your answer'" if pending and pending.kind is ControlKind.ASK_USER else ""
    approve = " --approve all (or --deny all)" if not answer else ""
    pause = f" --pause {pending.pause}" if pending and pending.pause else ""
    print(
        f"answer later: agent-fsm resume {result.run_id} {answer}{approve}{pause} --store "
        f"{store} (with the same --model and server options)".replace("  ", " "),
        file=out,
    )
