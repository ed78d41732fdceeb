"""The agent ``agent-fsm run`` and ``resume`` drive, and the command that resumes its run.

Without ``--agent``, the demo's tools (weather, calculator) against the model the options
describe (``cli_model.build_model``). With ``--agent module:attr`` (or ``file.py:attr``;
``loading.load_agent``), *your* agent: its tools, prompt, table, limits and model, each
option given on the command line replacing the agent's own (``--model`` and the server
options its model, ``--system`` its prompt, ``--max-turns``/``--token-budget``/``--retries``
its limits, ``--store`` its store, ``--require-approval TOOL`` one of its tools).

``--mcp "CMD ARGS"`` (a server started over stdio) and ``--mcp-url URL`` (streamable HTTP) add
an MCP server's tools. A connection's tools work only on the event loop that opened it, so the
command drives its run and every resume of it on one loop (``Driver``).

A later process resumes a run only with the agent that made it (the run keeps its record,
``run.identity``), so the command this module prints to resume a run repeats every option
that builds the agent. It need not repeat ``--require-approval``: the run's approval rules
are stored with it and hold whoever resumes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import shlex
from collections.abc import Sequence
from types import TracebackType
from typing import Any

from agent_fsm.agent import Agent
from agent_fsm.cli_model import DEMO_MAX_TURNS, DEMO_SYSTEM, DEMO_TOKEN_BUDGET, build_model
from agent_fsm.durable.checkpoint import MemoryStore
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import ConfigError
from agent_fsm.extras import install_hint
from agent_fsm.limits import Limits
from agent_fsm.loading import load_agent
from agent_fsm.run.approvals import Decisions
from agent_fsm.state import RunResult, RunStatus
from agent_fsm.table import StopReason
from agent_fsm.tools.tool import Tool

__all__ = [
    "Driver",
    "add_mcp_options",
    "after_outage",
    "build_agent",
    "kept",
    "resume_command",
]

# The options that build the agent, as (dest, flag): a resume command repeats each one given.
_AGENT_OPTIONS = (
    ("agent", "--agent"),
    ("provider", "--provider"),
    ("model", "--model"),
    ("base_url", "--base-url"),
    ("api_key_env", "--api-key-env"),
    ("temperature", "--temperature"),
    ("max_tokens", "--max-tokens"),
    ("timeout", "--timeout"),
    ("max_turns", "--max-turns"),
    ("token_budget", "--token-budget"),
    ("retries", "--retries"),
    ("system", "--system"),
    ("store", "--store"),
)
# Options that only mean something for the model --model builds.
_MODEL_ONLY = ("base_url", "api_key_env", "temperature", "max_tokens", "timeout")


def add_mcp_options(parser: argparse.ArgumentParser) -> None:
    """``--mcp`` and ``--mcp-url``, for ``run`` and ``resume`` (a resume needs the tools the
    run was made with)."""
    parser.add_argument(
        "--mcp",
        metavar="CMD",
        action="append",
        default=[],
        help="add the tools of an MCP server started with this command line, over stdio "
        "(repeatable; the mcp extra)",
    )
    parser.add_argument(
        "--mcp-url",
        metavar="URL",
        action="append",
        default=[],
        help="add the tools of the MCP server at URL, over streamable HTTP (repeatable)",
    )


class Driver:
    """``with Driver(args) as driver:`` drives the command's runs on one event loop, the one
    the MCP connections were opened on (``tools``); leaving the block closes them and
    releases what the agent's model tied to the loop.

    Raises:
        ConfigError: ``--mcp`` without the ``mcp`` extra installed, or an empty command.
        MCPConnectionError: a server that cannot be started or connected to.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self._runner = asyncio.Runner()
        self._stack = contextlib.AsyncExitStack()
        self._args = args
        self.tools: tuple[Tool, ...] = ()
        self.agent: Agent | None = None
        """The agent whose model is released at the end (set by the caller)."""

    def __enter__(self) -> Driver:
        commands, urls = getattr(self._args, "mcp", []), getattr(self._args, "mcp_url", [])
        if commands or urls:
            try:
                self.tools = self._runner.run(self._connect(commands, urls))
            except BaseException:
                self._runner.close()
                raise
        return self

    async def _connect(self, commands: list[str], urls: list[str]) -> tuple[Tool, ...]:
        try:
            from agent_fsm.mcp import MCPConnection
        except ImportError as err:
            raise ConfigError(f"--mcp needs the MCP SDK ({err}): {install_hint('mcp')}") from None
        connections = []
        for command in commands:
            words = shlex.split(command)
            if not words:
                raise ConfigError("--mcp takes a command line, got an empty one")
            connections.append(MCPConnection.stdio(words[0], words[1:]))
        connections += [MCPConnection.http(url) for url in urls]
        tools: list[Tool] = []
        for connection in connections:
            await self._stack.enter_async_context(connection)
            tools.extend(connection.tools)
        return tuple(tools)

    def run(self, agent: Agent, question: str, continues: str | None = None) -> RunResult:
        return self._runner.run(agent.run(question, continues=continues))

    def resume(
        self,
        agent: Agent,
        run_id: str,
        reply: str | None,
        approvals: Decisions | None,
        pause: str | None,
    ) -> RunResult:
        return self._runner.run(agent.resume(run_id, reply, approvals=approvals, pause=pause))

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self._runner.run(self._close())
        finally:
            self._runner.close()

    async def _close(self) -> None:
        try:
            await self._stack.aclose()
        finally:
            model: Any = self.agent.run_config.model if self.agent is not None else None
            aclose = getattr(model, "aclose", None)
            if aclose is not None:
                await aclose()


def build_agent(args: argparse.Namespace, extra_tools: Sequence[Tool] = ()) -> Agent:
    """The agent the options describe (see the module docstring), offering ``extra_tools``
    too (an MCP server's: ``Driver.tools``).

    Raises:
        ConfigError: no ``--model`` for the demo, server options without ``--model`` for an
            ``--agent``, a reference that does not load, a ``--require-approval`` naming no
            tool of the agent, no API key where one is needed, a bad ``--set``, or a setting
            the model refuses (the command line exits 2).
    """
    if args.agent is None:
        if args.model is None:
            raise ConfigError("--model is required (or --agent, to run your own agent)")
        from agent_fsm.demo import calculator, get_weather

        agent = Agent(
            model=build_model(args),
            tools=[get_weather, calculator, *extra_tools],
            system_prompt=DEMO_SYSTEM if args.system is None else args.system,
            limits=_limits(Limits(max_turns=DEMO_MAX_TURNS, token_budget=DEMO_TOKEN_BUDGET), args),
        )
    else:
        agent = load_agent(args.agent)
        given = [name for name in _MODEL_ONLY if getattr(args, name) is not None]
        given += ["set"] if args.fields else []
        if args.model is None and given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise ConfigError(
                f"{flags} configure the model --model builds: give --model too, or leave "
                "them out to use the agent's own model"
            )
        changes: dict[str, object] = {"limits": _limits(agent.limits, args)}
        if extra_tools:
            changes["tools"] = [*agent.tools, *extra_tools]
        if args.model is not None:
            changes["model"] = build_model(args)
        if args.system is not None:
            changes["system_prompt"] = args.system
        agent = agent.replace(**changes)
    if args.require_approval:
        agent = agent.replace(tools=_requiring_approval(agent, args.require_approval))
    if args.store:
        agent = agent.replace(store=SQLiteStore(args.store))
    return agent


def _limits(limits: Limits, args: argparse.Namespace) -> Limits:
    """``limits`` with the budgets the command line gives."""
    changes: dict[str, int] = {}
    if args.max_turns is not None:
        changes["max_turns"] = args.max_turns
    if args.token_budget is not None:
        changes["token_budget"] = args.token_budget
    if args.retries is not None:
        changes["model_retries"] = args.retries
        changes["model_retries_per_run"] = max(args.retries * 3, args.retries)
    if not changes:
        return limits
    try:
        return Limits.model_validate({**limits.model_dump(), **changes})
    except ValueError as exc:  # pydantic's ValidationError, said in one line by the CLI
        raise ConfigError(f"bad limits on the command line: {exc}") from None


def _requiring_approval(agent: Agent, names: Sequence[str]) -> list[Tool]:
    tools = list(agent.tools)
    known = {tool.name for tool in tools}
    unknown = sorted(set(names) - known)
    if unknown:
        raise ConfigError(
            f"--require-approval: the agent has no tool {', '.join(map(repr, unknown))}; its "
            f"tools: {', '.join(sorted(known)) or 'none'}"
        )
    return [
        dataclasses.replace(tool, requires_approval=True) if tool.name in names else tool
        for tool in tools
    ]


def kept(agent: Agent, args: argparse.Namespace) -> bool:
    """A later process can find the agent's runs: a ``--store``, or the agent's own store
    when it is not the in-process one."""
    return bool(args.store) or (
        agent.store is not None and not isinstance(agent.store, MemoryStore)
    )


def resume_command(args: argparse.Namespace, run_id: str, *answer: str) -> str:
    """``agent-fsm resume RUN_ID ANSWER...`` with every option given that builds the agent,
    quoted for a POSIX shell: what a person pastes to resume the run later."""
    words = ["agent-fsm", "resume", run_id, *answer]
    for dest, flag in _AGENT_OPTIONS:
        value = getattr(args, dest, None)
        if value is not None and not (dest == "provider" and value == "openai"):
            words += [flag, str(value)]
    for pair in getattr(args, "fields", None) or ():
        words += ["--set", pair]
    for command in getattr(args, "mcp", None) or ():
        words += ["--mcp", command]
    for url in getattr(args, "mcp_url", None) or ():
        words += ["--mcp-url", url]
    if getattr(args, "stream", False):
        words.append("--stream")
    return shlex.join(words)


def after_outage(agent: Agent, args: argparse.Namespace, result: RunResult) -> str | None:
    """What to tell a person whose run an outage (or a timeout, an interruption, a full
    context window) stopped: its id and the command that resumes it. None for a run that did
    not fail, or whose stop no resume can leave (a permanent model error: the same request
    would fail again)."""
    if result.status is not RunStatus.FAILED:
        return None
    if result.stop_reason not in agent.run_config.machine.resumable:
        return None
    if not kept(agent, args):
        return (
            f"run {result.run_id} can be resumed, but only from a store: run with --store PATH "
            "to resume a run an outage stops"
        )
    if result.stop_reason is StopReason.MODEL_ERROR:
        failure = agent.checkpoints.load(result.run_id).model_failure
        if failure is not None and failure.permanent:
            return None
    return f"run {result.run_id} can go on: {resume_command(args, result.run_id)}"
