"""``agent-fsm``: the command line.

Commands: ``demo`` (an offline run of the weather/calculator agent, printing every
transition, tool call and result), ``run`` and ``resume`` (the same tools against a real
OpenAI-compatible server, ``cli_model``), ``diagram`` (the machine as mermaid, DOT, SVG or
PNG, optionally overlaid with a recorded or checkpointed run), ``replay`` (alias ``trace``:
a recorded run, step by step), ``runs`` (the runs of a checkpoint store, SQLite or
PostgreSQL, with their leases and the stuck ones flagged; or one of them) and ``cancel``
(ask whoever drives a run of a store to stop it: ``durable.queue``).
Exit codes: 0 success, 1 the run failed (or, for replay, the recorded run failed or never
finished), 2 bad usage or unreadable input. Errors go to stderr, one line each, never a
traceback for what a user typed or pointed at (a file that is not Python, a module that
raises, a value nested too deep), and never a database password (``checkpoint.redacted``).
"""

from __future__ import annotations

import argparse
import importlib
import io
import logging
import os
import runpy
import shutil
import sys
from collections.abc import Callable, Sequence
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Protocol, TextIO

import structlog

from agent_fsm.agent import Agent, machine_for
from agent_fsm.cli_agent import Driver, add_mcp_options
from agent_fsm.cli_model import add_model_options
from agent_fsm.cli_stores import open_store
from agent_fsm.custom_table import Table
from agent_fsm.diagrams import FORMATS, StoredRunOverlay, render
from agent_fsm.durable.checkpoint import CheckpointStore, RunSummary
from agent_fsm.durable.leases import LeaseStore
from agent_fsm.durable.queue import RunCancels
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.durable.tracefile import (
    RecordedRun,
    TraceWriter,
    read_trace,
    recorded_runs,
    select_run,
)
from agent_fsm.errors import AgentFSMError, CheckpointError
from agent_fsm.evals.cli import add_eval_command
from agent_fsm.events import (
    Event,
    ModelRequested,
    ModelResponded,
    RunFinished,
    StateChanged,
    ToolFinished,
    ToolStarted,
)
from agent_fsm.extras import install_hint
from agent_fsm.messages import AssistantMessage, ToolMessage, Usage
from agent_fsm.run.approvals import Decisions
from agent_fsm.state import RunResult, RunState, RunStatus
from agent_fsm.table import TABLE, AgentState, Row, StopReason
from agent_fsm.ui.cli import add_ui_command
from agent_fsm.version import __version__

__all__ = ["main"]

_SUFFIX_FORMATS = {".mmd": "mermaid", ".mermaid": "mermaid", ".dot": "dot", ".gv": "dot"}
_SUFFIX_FORMATS.update({".svg": "svg", ".png": "png", ".html": "html", ".htm": "html"})
_CLEAR_LINE = "\r\x1b[2K"


class _UsageError(Exception):
    """Bad arguments found after parsing; exit code 2."""


def _configure_logging(verbose: bool) -> None:
    """Errors only by default: a warning (an ordinary tool error) is the run's business, and
    on a terminal it would break the progress line. ``-v`` shows everything, warnings and
    every transition."""
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.DEBUG if verbose else logging.ERROR
        ),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


class _Printer:
    """Prints a run's events as readable lines.

    With ``live`` (a terminal), it also keeps one compact progress line (turn, tokens, what
    the run is doing) under the output and rewrites it in place; piped output gets only the
    plain lines.
    """

    def __init__(
        self,
        out: TextIO,
        *,
        live: bool = False,
        max_turns: int | None = None,
        streamed: bool = False,
    ) -> None:
        self.out = out
        self.live = live
        self.streamed = streamed
        """The reply's text is printed as it arrives (``cli_model.StreamPrinter``)."""
        self.max_turns = max_turns
        self.turn = 0
        self.tokens = 0
        self.doing = "starting"
        self._shown = False

    def __call__(self, event: Event) -> None:
        line = self._line(event)
        self._track(event)
        if line is not None:
            self._clear()
            print(line, file=self.out)
        if self.live and not isinstance(event, RunFinished):
            self._draw()
        elif isinstance(event, RunFinished):
            self._clear()

    def _line(self, event: Event) -> str | None:
        if isinstance(event, StateChanged):
            guards = " ∧ ".join(event.guards) or "else"
            return (
                f"[turn {event.turn}] {event.source!s:>7} → {event.dest!s:<7} "
                f"guard: {guards:<22} ({event.label})"
            )
        if isinstance(event, ModelResponded) and event.text and not self.streamed:
            return f"          model says: {event.text}"
        if isinstance(event, ToolStarted):
            return f"          tool call:  {event.call.name}({event.call.arguments})"
        if isinstance(event, ToolFinished):
            return f"          result {event.status.value:<5} {event.output}"
        return None

    def _track(self, event: Event) -> None:
        if isinstance(event, StateChanged):
            self.turn, self.doing = event.turn, str(event.dest)
        elif isinstance(event, ModelRequested):
            self.turn, self.doing = event.turn, "THINK: waiting for the model"
        elif isinstance(event, ModelResponded):
            self.tokens += event.usage.total_tokens
            self.doing = "THINK"
        elif isinstance(event, ToolStarted):
            self.doing = f"ACT: running {event.call.name}"
        elif isinstance(event, ToolFinished):
            self.doing = "ACT"

    def _draw(self) -> None:
        limit = f"/{self.max_turns}" if self.max_turns is not None else ""
        status = f"… turn {self.turn}{limit} · {self.tokens:,} tokens · {self.doing}"
        width = shutil.get_terminal_size().columns - 1
        self.out.write(_CLEAR_LINE + status[:width])
        self.out.flush()
        self._shown = True

    def _clear(self) -> None:
        if self._shown:
            self.out.write(_CLEAR_LINE)
            self._shown = False


class _Outcome(Protocol):
    """What the summary reads: a live ``RunResult`` and a recorded ``RunFinished`` both have it."""

    @property
    def status(self) -> RunStatus: ...
    @property
    def stop_reason(self) -> StopReason: ...
    @property
    def final_state(self) -> AgentState: ...
    @property
    def turns(self) -> int: ...
    @property
    def usage(self) -> Usage: ...
    @property
    def output(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...


def _summary(out: TextIO, outcome: _Outcome) -> None:
    print("", file=out)
    if outcome.status is RunStatus.FAILED:
        print(f"error: {outcome.error}", file=out)
        if outcome.output is not None:  # the last answer a limit asked for
            cut = getattr(outcome, "output_incomplete", False)  # a recorded run may not say
            cut = " (cut off at its token limit)" if cut else ""
            print(f"last answer{cut}: {outcome.output}", file=out)
    elif outcome.stop_reason is StopReason.ASK_USER:
        print(f"question for you: {outcome.output}", file=out)
    elif outcome.status is RunStatus.NEEDS_INPUT:
        print(f"waiting for: {outcome.output}", file=out)
    elif outcome.status is RunStatus.INCOMPLETE:
        print(f"cut-off answer (the reply hit its token limit): {outcome.output}", file=out)
    else:
        print(f"final answer: {outcome.output}", file=out)
    print(f"status:       {outcome.status.value}", file=out)
    print(f"stop reason:  {outcome.stop_reason.value}", file=out)
    print(f"final state:  {outcome.final_state.value}", file=out)
    print(f"turns:        {outcome.turns}", file=out)
    usage = outcome.usage
    estimated = " (estimated)" if usage.estimated else ""
    print(
        f"tokens:       {usage.total_tokens} ({usage.input_tokens} in, "
        f"{usage.output_tokens} out){estimated}",
        file=out,
    )


def _run_agent(
    agent: Agent,
    question: str,
    out: TextIO,
    trace: str | None,
    *,
    streamed: bool = False,
    settle: Callable[[Agent, RunResult], RunResult] | None = None,
    start: Callable[[Agent], RunResult] | None = None,
) -> int:
    """Run ``agent`` on ``question``, printing as it goes (``start`` drives the run, as
    ``cli_agent.Driver`` does; ``run_sync`` when None); ``settle`` may answer its pauses
    (``cli_model.run_until_settled``), else the outcome is summarised once."""
    writer = TraceWriter(trace) if trace else None  # a bad path fails before the run
    printer = _Printer(out, live=out.isatty(), max_turns=agent.limits.max_turns, streamed=streamed)
    agent = agent.subscribe(printer)
    if streamed:
        from agent_fsm.cli_model import StreamPrinter

        agent = agent.subscribe(StreamPrinter(out))
    if writer is not None:
        agent = agent.subscribe(writer)
    bound = agent.bound
    print(f"question: {question}", file=out)
    print(
        f"bound:    at most {bound.model_calls} model calls and {bound.transitions} "
        f"transitions ({bound.formula})\n",
        file=out,
    )
    try:
        result = agent.run_sync(question) if start is None else start(agent)
        if settle is not None:
            result = settle(agent, result)
        else:
            _summary(out, result)
    finally:
        if writer is not None:
            writer.close()
    if writer is not None:
        print(f"trace written to {trace} (agent-fsm replay {trace})", file=sys.stderr)
    return 1 if result.status is RunStatus.FAILED else 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from agent_fsm.demo import DEMO_QUESTION, demo_agent

    agent = demo_agent()
    if args.store:
        agent = agent.replace(store=SQLiteStore(args.store))
    return _run_agent(agent, DEMO_QUESTION, sys.stdout, args.trace)


def _cmd_run(args: argparse.Namespace) -> int:
    from agent_fsm.cli_agent import Driver, build_agent, kept

    with Driver(args) as driver:
        agent = driver.agent = build_agent(args, driver.tools)
        if args.continues is not None and not kept(agent, args):
            raise _UsageError("--continues reads the run from a store: give --store PATH")
        return _run_agent(
            agent,
            args.question,
            sys.stdout,
            args.trace,
            streamed=args.stream,
            settle=lambda live, result: _settle(live, result, args, driver),
            start=lambda live: driver.run(live, args.question, args.continues),
        )


def _cmd_resume(args: argparse.Namespace) -> int:
    from agent_fsm.cli_agent import Driver

    with Driver(args) as driver:
        return _resume(args, driver)


def _resume(args: argparse.Namespace, driver: Driver) -> int:
    from agent_fsm.cli_agent import build_agent, kept
    from agent_fsm.cli_model import StreamPrinter

    agent = driver.agent = build_agent(args, driver.tools)
    if not kept(agent, args):
        raise _UsageError(
            "resume continues a run of a store: give --store PATH (the store `run` was given)"
        )
    agent = agent.subscribe(_Printer(sys.stdout, live=sys.stdout.isatty(), streamed=args.stream))
    if args.stream:
        agent = agent.subscribe(StreamPrinter(sys.stdout))
    approvals: Decisions | None = None
    if args.approve or args.deny:
        approvals = _decisions(args.approve, args.deny)
    result = driver.resume(agent, args.run_id, args.reply, approvals, args.pause)
    result = _settle(agent, result, args, driver)
    return 1 if result.status is RunStatus.FAILED else 0


def _decisions(approve: list[str], deny: list[str]) -> Decisions:
    """``--approve``/``--deny`` as decisions: ``all``, or call ids."""
    if "all" in approve or "all" in deny:
        if (approve and deny) or len(approve) + len(deny) > 1:
            raise _UsageError("--approve all / --deny all decide every call: give nothing else")
        return bool(approve)
    return {**dict.fromkeys(approve, True), **dict.fromkeys(deny, False)}


def _settle(agent: Agent, result: RunResult, args: argparse.Namespace, driver: Driver) -> RunResult:
    """Answer the run's pauses (``cli_model.run_until_settled``), summarise it with its id,
    and say how to resume a run an outage stopped (``cli_agent.after_outage``)."""
    from agent_fsm.cli_agent import after_outage, kept, resume_command
    from agent_fsm.cli_model import run_until_settled

    def summarise(outcome: RunResult) -> None:
        _summary(sys.stdout, outcome)
        print(f"run id:       {outcome.run_id}", file=sys.stdout)

    settled = run_until_settled(
        result,
        lambda reply, approvals, pause: driver.resume(
            agent, result.run_id, reply, approvals, pause
        ),
        interactive=args.interactive,
        out=sys.stdout,
        summarise=summarise,
        resume_command=(
            (lambda run_id, *answer: resume_command(args, run_id, *answer))
            if kept(agent, args)
            else None
        ),
    )
    advice = after_outage(agent, args, settled)
    if advice is not None:
        print(advice, file=sys.stdout)
    return settled


DEFAULT_STORE = "agent_fsm.sqlite3"
STORE_VARIABLE = "AGENT_FSM_STORE"
"""The environment variable ``--store`` defaults to: a URL's password stays off the command
line (and out of ``ps``)."""


def _open_store(location: str, schema: str) -> CheckpointStore:
    """An existing store (``cli_stores.open_store``)."""
    return open_store(location, schema)


def _table_rows(where: str) -> tuple[Row, ...]:
    """The rows of the table ``where`` names, ``FILE.py:NAME`` or ``MODULE:NAME``: a
    ``Table``, a tuple of rows, or an ``Agent``, verified as an agent would verify it."""
    source, _, name = where.rpartition(":")
    if not source or not name:
        raise _UsageError(f"--table wants FILE.py:NAME or MODULE:NAME, got {where!r}")
    try:
        if source.endswith(".py"):
            found = runpy.run_path(source, run_name="agent_fsm_table").get(name)
        else:
            found = getattr(importlib.import_module(source), name, None)
    except (Exception, SystemExit) as exc:  # the user's code: whatever it raises is theirs
        what = "exited" if isinstance(exc, SystemExit) else type(exc).__name__
        raise _UsageError(f"cannot load {source}: {what}: {exc}") from exc
    if isinstance(found, Agent):
        return found.machine.rows
    if isinstance(found, Table) or (
        isinstance(found, tuple) and found and all(isinstance(row, Row) for row in found)
    ):
        return machine_for(found).rows
    raise _UsageError(f"{where} is not a Table, a tuple of Rows or an Agent")


def _cmd_diagram(args: argparse.Namespace) -> int:
    format = args.format
    if format is None:
        suffix = Path(args.output).suffix.lower() if args.output else ""
        format = _SUFFIX_FORMATS.get(suffix, "mermaid")
    rows = _table_rows(args.table) if args.table else TABLE
    run: RecordedRun | StoredRunOverlay | None = None
    if args.trace:
        runs = recorded_runs(read_trace(args.trace))
        run = select_run(runs, args.run, args.trace, option="--run ID")
    elif args.run:
        with closing(_open_store(args.store, args.schema)) as store:
            run = StoredRunOverlay.of(store.load(args.run), rows)
    diagram = render(rows, format, run=run)
    if args.output:
        data = diagram.encode() if isinstance(diagram, str) else diagram
        Path(args.output).write_bytes(data)
        print(f"wrote {args.output}", file=sys.stderr)
    elif isinstance(diagram, str):
        sys.stdout.write(diagram)
    elif sys.stdout.isatty():
        raise _UsageError(f"{format} output is binary: write it to a file with -o FILE")
    else:
        sys.stdout.flush()
        sys.stdout.buffer.write(diagram)
        sys.stdout.flush()
    return 0


def _replay(run: RecordedRun, out: TextIO) -> int:
    print(f"run:      {run.run_id}", file=out)
    print(f"question: {run.input if run.input is not None else '(not recorded)'}\n", file=out)
    printer = _Printer(out)
    for event in run.events:
        printer(event)
    finished = run.finished
    if finished is None:
        print(
            f"\nthe run did not finish: the trace ends after {len(run.trace)} transitions, "
            f"in {run.final_state or 'no state'}",
            file=out,
        )
        return 1
    _summary(out, finished)
    return 1 if finished.status is RunStatus.FAILED else 0


def _cmd_replay(args: argparse.Namespace) -> int:
    runs = recorded_runs(read_trace(args.file))
    chosen = [select_run(runs, args.run, args.file)] if args.run else runs
    if not chosen:
        raise _UsageError(f"{args.file}: no events")
    codes = []
    for number, run in enumerate(chosen):
        if number:
            print("\n" + "─" * 72, file=sys.stdout)
        codes.append(_replay(run, sys.stdout))
    return max(codes)


def _when(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S") if timestamp else "-"


def _lease_of(run: RunSummary) -> str:
    """Who holds (or held) the run's lease, and until when."""
    if run.lease_holder is None or run.lease_expires_at is None:
        return "-"
    if run.lease_live:
        return f"{run.lease_holder} until {_when(run.lease_expires_at)[11:]}"
    if not run.lease_expires_at:
        return f"{run.lease_holder} released"
    return f"{run.lease_holder} expired {_when(run.lease_expires_at)}"


def _stop_of(summary_row: int | None) -> str:
    if summary_row is None or not 0 <= summary_row < len(TABLE):
        return "-"
    row = TABLE[summary_row]
    return row.stop_reason.value if row.stop_reason else "(running)"


def _list_runs(runs: list[RunSummary], out: TextIO) -> None:
    if not runs:
        print("no runs", file=out)
        return
    print(
        f"{'RUN':<34} {'STATE':<8} {'STOP':<18} {'TURNS':>5} {'TOKENS':>8}  {'UPDATED':<19}  LEASE",
        file=out,
    )
    for run in runs:
        flag = "  STUCK" if run.stuck else ""
        if run.cancel_requested is not None:
            flag += f"  CANCELLING: {run.cancel_requested}"
        if run.unreadable:
            flag = f"  UNREADABLE: {run.unreadable}"
        print(
            f"{run.run_id:<34} {run.state!s:<8} {_stop_of(run.last_row):<18} "
            f"{run.turns:>5} {run.total_tokens:>8}  {_when(run.updated_at):<19}  "
            f"{_lease_of(run)}{flag}",
            file=out,
        )
    stuck = sum(run.stuck for run in runs)
    if stuck:
        print(
            f"\n{stuck} stuck: not stopped, and no worker holds a live lease on them (their"
            " worker died or gave up); a worker's take_next() or resume(RUN_ID) takes each over",
            file=out,
        )


def _show_run(state: RunState, store: CheckpointStore, out: TextIO) -> None:
    last = state.trace[-1][0] if state.trace else None
    print(f"run:      {state.run_id}", file=out)
    print(f"state:    {state.state!s} ({_stop_of(last)})", file=out)
    print(f"turns:    {state.turns}, tokens {state.usage.total_tokens:,}", file=out)
    if isinstance(store, LeaseStore):
        lease = store.lease(state.run_id)
        held = f"{lease.owner} until {_when(lease.expires_at)}" if lease else "none live"
        print(f"lease:    {held}", file=out)
    if state.control is not None and state.state is AgentState.DONE:
        print(f"waiting:  {state.control.kind.value}: {state.control.text}", file=out)
        if state.control.pause:
            print(f"pause:    {state.control.pause}", file=out)
        for call in state.control.pending_calls:
            print(f"          {call.id}: {call.name}({call.arguments})", file=out)
    if state.error:
        print(f"error:    {state.error}", file=out)
    print("\ntranscript:", file=out)
    for message in state.messages:
        if isinstance(message, AssistantMessage):
            calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
            text = " · ".join(part for part in (message.content, calls) if part)
            print(f"  assistant: {text}", file=out)
        elif isinstance(message, ToolMessage):
            print(f"  tool {message.name} [{message.status.value}]: {message.content}", file=out)
        else:
            print(f"  {message.role}: {message.content}", file=out)


def _cmd_runs(args: argparse.Namespace) -> int:
    # the default loop's states in any case (done, Think), a custom state's name as it is
    states = [
        name.upper() if name.upper() in AgentState.__members__ else name for name in args.state
    ]
    with closing(_open_store(args.store, args.schema)) as store:
        if args.run_id is None:
            _list_runs(store.list_runs(args.limit, states=states or None), sys.stdout)
        else:
            _show_run(store.load(args.run_id), store, sys.stdout)
    return 0


def _cmd_cancel(args: argparse.Namespace) -> int:
    with closing(_open_store(args.store, args.schema)) as store:
        if not isinstance(store, RunCancels):
            raise _UsageError(f"{type(store).__name__} takes no cancel requests")
        try:
            asked = store.cancel(args.run_id, args.reason)
        except CheckpointError as exc:
            if store.exists(args.run_id):  # not "no such run" (raises if the store is away)
                raise
            if args.dbos is None:
                raise CheckpointError(
                    f"{exc}; a DBOSAgent's run is reached through DBOS: add --dbos URL (its"
                    " fleet's system database)"
                ) from None
            asked = False  # a DBOS run's first workflow keeps no checkpoint
        if not asked and args.dbos is not None:
            # A DBOS run keeps only its stops in the store: whether a workflow of it runs
            # (its first, or a resume of the stop the store shows) is DBOS's to say.
            asked = _cancel_in_dbos(store, args)
    if asked:
        print(
            f"cancel requested: run {args.run_id} stops at its next checkpoint, before another"
            " model or tool call (ERROR aborted, resumable), or at once when a worker takes it",
            file=sys.stdout,
        )
    else:
        print(f"run {args.run_id} has already stopped: nothing to cancel", file=sys.stdout)
    return 0


def _cancel_in_dbos(store: CheckpointStore, args: argparse.Namespace) -> bool:
    """The request for a DBOS run (``dbos.cancelling.cancel_outside``): the dbos extra is
    imported here, only when ``--dbos`` asks for it."""
    try:
        from agent_fsm.dbos.cancelling import cancel_outside
    except ImportError:
        raise _UsageError(f"--dbos needs the dbos extra: {install_hint('dbos')}") from None
    return cancel_outside(
        store,
        args.run_id,
        args.reason,
        system_database_url=args.dbos,
        dbos_schema=args.dbos_schema,
    )


_EPILOG = """\
examples:
  agent-fsm demo --trace run.jsonl           run offline, record every event
  agent-fsm replay run.jsonl                 the recorded run, transition by transition
  agent-fsm diagram                          the machine as mermaid text
  agent-fsm diagram --table loop.py:TABLE    a table of your own (a Table or an Agent)
  agent-fsm diagram --trace run.jsonl -o run.svg   the machine with the run's path (graphviz)
  agent-fsm runs --store runs.sqlite3        the checkpointed runs, newest first
  agent-fsm runs --store postgresql://HOST/DB --state THINK   a fleet's runs in THINK
  agent-fsm diagram --run ID --store runs.sqlite3  the path of one checkpointed run
  agent-fsm cancel ID --store postgresql://HOST/DB   stop a run wherever it is driven
  agent-fsm cancel ID --store postgresql://HOST/DB --dbos postgresql://HOST/SYSDB
                                             the same for a DBOSAgent's run
  agent-fsm ui --store runs.sqlite3 --agent app:agent   watch and steer runs in a browser

exit codes: 0 ok, 1 the run failed, 2 bad usage or unreadable input"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agent-fsm",
        description="Run LLM tool-calling agents as an explicit, verifiable state machine.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="log warnings (a failed tool call, a retried model call) and every transition",
    )
    parser.add_argument("--version", action="version", version=f"agent-fsm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    trace_help = "write every event of the run to FILE as JSON Lines (see `replay`)"
    store_help = (
        f"a checkpoint store: a SQLite file or a postgresql:// URL (default: ${STORE_VARIABLE},"
        f" else {DEFAULT_STORE})"
    )
    schema_help = "the schema of a PostgreSQL store (default: agent_fsm)"
    default_store = os.environ.get(STORE_VARIABLE) or DEFAULT_STORE

    demo = commands.add_parser("demo", help="run the offline weather/calculator demo agent")
    demo.add_argument("--trace", metavar="FILE", help=trace_help)
    demo.add_argument(
        "--store", metavar="PATH", help="checkpoint the run into a SQLite store (see `runs`)"
    )
    demo.set_defaults(handler=_cmd_demo)

    run = commands.add_parser(
        "run",
        help="run your agent (--agent module:attr), or the example tools, against a model",
        description="Ask a question of your agent (--agent module:attr or file.py:attr: its "
        "tools, prompt, table, limits and model; options given replace its own) or of the "
        "demo's tools, against any provider or OpenAI-compatible server (--base-url). A pause "
        "(ask_user, an approval) is answered at the terminal, or later with `agent-fsm "
        "resume` when the run has a store; so is a run an outage stopped. Exits 1 if the run "
        "fails, 2 for bad usage (no API key, a bad option or setting).",
    )
    run.add_argument("question")
    add_model_options(run, store_required=False)
    add_mcp_options(run)
    run.add_argument(
        "--continues",
        metavar="RUN_ID",
        help="a new run that goes on from the conversation of a stopped run of the store",
    )
    run.add_argument("--trace", metavar="FILE", help=trace_help)
    run.set_defaults(handler=_cmd_run)

    resume = commands.add_parser(
        "resume",
        help="answer a paused run (ask_user, approvals) of a checkpoint store and go on",
        description="Continue a run that `agent-fsm run --store PATH` left paused (or "
        "stopped by an outage) with the options that built its agent (the same --agent, "
        "model and prompt: a run refuses another agent). Exits 1 if the run fails, 2 if "
        "the answer does not fit the pause or the agent is not the run's.",
    )
    resume.add_argument("run_id", metavar="RUN_ID")
    resume.add_argument("reply", nargs="?", help="the answer to the run's question")
    resume.add_argument(
        "--approve",
        metavar="CALL_ID",
        action="append",
        default=[],
        help="approve this call (repeatable), or `all`",
    )
    resume.add_argument(
        "--deny",
        metavar="CALL_ID",
        action="append",
        default=[],
        help="refuse this call (repeatable), or `all`",
    )
    resume.add_argument(
        "--pause",
        metavar="PAUSE",
        help="the pause this answer is for, as `agent-fsm runs RUN_ID` shows it (needed with "
        "`--approve all` / `--deny all`: a repeated command must not approve a later pause)",
    )
    add_model_options(resume, store_required=True)
    add_mcp_options(resume)
    resume.set_defaults(handler=_cmd_resume)

    diagram = commands.add_parser(
        "diagram",
        help="print the agent state machine diagram",
        description="Draw the transition table: every edge shows its trigger, priority, "
        "guards and label. mermaid and dot need nothing; svg and png need the graphviz `dot` "
        "program. With --trace, the diagram also shows one recorded run: visited states, "
        "how many times each edge was taken (×N), and where and why the run stopped.",
    )
    diagram.add_argument(
        "--format",
        choices=FORMATS,
        help="output format (default: from the -o suffix .mmd/.dot/.svg/.png, else mermaid)",
    )
    diagram.add_argument(
        "--table",
        metavar="FILE.py:NAME",
        help="draw the Table (or Agent) NAME of a Python file or module (MODULE:NAME), not "
        "the default loop",
    )
    diagram.add_argument("--trace", metavar="FILE", help="overlay the run recorded in FILE")
    diagram.add_argument(
        "--run",
        metavar="ID",
        help="overlay run ID: with --trace, which run of the file (when it holds several); "
        "without, the run checkpointed in --store",
    )
    diagram.add_argument("--store", default=default_store, help=store_help)
    diagram.add_argument("--schema", default="agent_fsm", help=schema_help)
    diagram.add_argument("-o", "--output", metavar="FILE", help="write to FILE, not stdout")
    diagram.set_defaults(handler=_cmd_diagram)

    replay = commands.add_parser(
        "replay",
        aliases=["trace"],
        help="print a recorded run step by step",
        description="Print a run recorded with --trace (or agent_fsm.durable.TraceWriter): "
        "every transition (turn, from, to, guards, label) with the model's text and tool "
        "calls, then the outcome. Exits 1 if the recorded run failed or never finished.",
    )
    replay.add_argument("file", metavar="FILE", help="a JSON Lines trace file")
    replay.add_argument("--run", metavar="ID", help="replay only run ID of the file")
    replay.set_defaults(handler=_cmd_replay)

    runs = commands.add_parser(
        "runs",
        help="list the runs of a checkpoint store, or show one",
        description="Without RUN_ID: one line per checkpointed run (state, stop reason, turns, "
        "tokens, last update, lease holder and expiry), newest first; STUCK marks a run that "
        "has not stopped and whose lease is no longer live, UNREADABLE one this agent_fsm "
        "cannot read. With RUN_ID: that run's state, lease, what it waits for (a question or "
        "calls to approve) and its transcript.",
    )
    runs.add_argument("run_id", nargs="?", metavar="RUN_ID", help="show this run")
    runs.add_argument("--store", default=default_store, help=store_help)
    runs.add_argument("--schema", default="agent_fsm", help=schema_help)
    runs.add_argument("--limit", type=int, default=None, help="list at most N runs")
    runs.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE",
        help="list only the runs in STATE (repeatable): DONE, ERROR, THINK, ... or a custom "
        "state's name",
    )
    runs.set_defaults(handler=_cmd_runs)

    cancel = commands.add_parser(
        "cancel",
        help="stop a run of a checkpoint store, wherever a worker drives it",
        description="Ask whoever drives RUN_ID (a worker with lease_s, on any machine) to "
        "stop it at its next checkpoint, before another model or tool call starts: it ends in "
        "ERROR aborted, with REASON as its error, "
        "and can be resumed. A run no worker drives now stops at once when one takes it. A "
        "run that has stopped is left as it is (exit 0, saying so). Exits 2 for an unknown "
        "run. A DBOSAgent's run (a DBOS workflow, whose store keeps only its stops) is "
        "reached with --dbos: it stops before its next model or tool call.",
    )
    cancel.add_argument("run_id", metavar="RUN_ID", help="the run to stop")
    cancel.add_argument("--reason", default="cancelled", help="why (the run's error)")
    cancel.add_argument("--store", default=default_store, help=store_help)
    cancel.add_argument("--schema", default="agent_fsm", help=schema_help)
    cancel.add_argument(
        "--dbos",
        metavar="URL",
        help="DBOS's system database of a fleet of DBOSAgents (its DBOSConfig"
        " system_database_url): also reach runs that are DBOS workflows, their first"
        " workflow or a resume under way (needs the dbos extra)",
    )
    cancel.add_argument(
        "--dbos-schema",
        default="dbos",
        metavar="SCHEMA",
        help="the schema of DBOS's tables (its DBOSConfig dbos_system_schema)",
    )
    cancel.set_defaults(handler=_cmd_cancel)
    add_eval_command(commands)
    add_ui_command(commands, store_default=default_store, store_help=store_help)
    for command in commands.choices.values():
        command.set_defaults(command_parser=command)  # for errors in its own words
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``agent-fsm`` command; returns the exit code."""
    for stream in (sys.stdout, sys.stderr):
        # Text that is not UTF-8 (a file name argv decoded with surrogates) is printed
        # escaped, never a UnicodeEncodeError halfway through the output.
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")
    args, unknown = _parser().parse_known_args(argv)
    if unknown:  # said with the command's own usage, not the top level's
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    _configure_logging(args.verbose)
    try:
        code: int = args.handler(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (``agent-fsm runs | head``): stop quietly, as Unix tools do,
        # and keep Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (OSError, AgentFSMError, _UsageError) as exc:
        print(f"agent-fsm: {' '.join(str(exc).split())}", file=sys.stderr)  # one line
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
