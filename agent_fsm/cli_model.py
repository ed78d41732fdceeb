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
import json
import os
import sys
from collections.abc import Callable
from typing import Any, TextIO

from agent_fsm.errors import ConfigError
from agent_fsm.events import Event, MessageUpdated, ModelResponded
from agent_fsm.limits import Limits
from agent_fsm.messages import clean_json, clean_text
from agent_fsm.models.base import Model
from agent_fsm.models.registry import PROVIDERS, Provider
from agent_fsm.run.approvals import Decisions
from agent_fsm.state import ControlKind, RunResult, RunStatus

__all__ = [
    "DEMO_MAX_TURNS",
    "DEMO_SYSTEM",
    "DEMO_TOKEN_BUDGET",
    "PROVIDERS",
    "Provider",
    "add_model_options",
    "build_model",
    "run_until_settled",
]


DEMO_SYSTEM = "Answer the user's question. Use the tools; do arithmetic with the calculator."
"""The demo's system prompt, which names its tools."""
DEMO_MAX_TURNS = 10
DEMO_TOKEN_BUDGET = 100_000


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
    parser.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="your agent, module:attr or path/file.py:attr (a function is called to build "
        "it): its tools, prompt, table, limits and model; the options given replace its own "
        "(default: the demo's weather and calculator tools)",
    )
    model.add_argument(
        "--model",
        help="model name, e.g. gpt-4o-mini (required without --agent; with it, replaces the "
        "agent's model)",
    )
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
        help="model calls the run may make, retries aside (Limits.max_turns; default "
        f"{DEMO_MAX_TURNS}, or the --agent's own)",
    )
    run.add_argument(
        "--token-budget",
        type=int,
        help="tokens the run may spend, prompts and replies (Limits.token_budget; default "
        f"{DEMO_TOKEN_BUDGET}, or the --agent's own)",
    )
    run.add_argument(
        "--retries",
        type=int,
        help="retries of a failed model call before the run stops (Limits.model_retries; "
        f"default {Limits().model_retries}, or the --agent's own)",
    )
    run.add_argument(
        "--system",
        help="the system prompt (default: the demo's, which names its tools, or the --agent's)",
    )
    run.add_argument(
        "--require-approval",
        metavar="TOOL",
        action="append",
        default=[],
        help="a person approves every call of TOOL before it runs (the run keeps the rule: "
        "a resume need not repeat it)",
    )
    run.add_argument(
        "--store",
        metavar="PATH",
        help="the SQLite store of the run"
        + (
            " (required unless the --agent has a store of its own)"
            if store_required
            else ", so that `agent-fsm resume` can continue it later (required for that, "
            "unless the --agent has a store of its own)"
        ),
    )
    run.add_argument(
        "--interactive",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="answer a pause at the terminal (default: when stdin is a terminal)",
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
    resume_command: Callable[..., str] | None,
) -> RunResult:
    """Answer the run's pauses at the terminal while it is interactive; otherwise say how to
    answer later: ``resume_command(run_id, *answer)`` is the command that does (None: the
    run is kept nowhere a later process finds it). Returns the last result."""
    if interactive is None:
        interactive = sys.stdin.isatty()
    summarise(result)
    while result.status is RunStatus.NEEDS_INPUT:
        answer = _ask(result, out) if interactive else None
        if answer is None:
            _how_to_resume(result, out, resume_command)
            break
        reply, approvals = answer
        result = resume(reply, approvals, result.pending.pause if result.pending else None)
        summarise(result)
    return result


def _ask(result: RunResult, out: TextIO) -> tuple[str | None, Decisions | None] | None:
    """The person's answer to the pause, read from stdin; None at end of input."""
    pending = result.pending
    assert pending is not None  # a run that needs input says what it waits for
    if pending.waits_for is ControlKind.ASK_USER:
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


def _how_to_resume(
    result: RunResult, out: TextIO, resume_command: Callable[..., str] | None
) -> None:
    pending = result.pending
    if resume_command is None:
        print(
            "the run waits for an answer; run with --store PATH to answer it later with "
            "`agent-fsm resume`",
            file=out,
        )
        return
    asks = pending is not None and pending.waits_for is ControlKind.ASK_USER
    answer = ["your answer"] if asks else ["--approve", "all"]
    if pending is not None and pending.pause:
        answer += ["--pause", pending.pause]
    alternative = "" if asks else " (or --deny all)"
    print(f"answer later: {resume_command(result.run_id, *answer)}{alternative}", file=out)
