"""``agent-fsm ui``: the command that serves the ui (``agent_fsm.ui.app``).

The command line registers it (``add_ui_command``) without importing the ``ui`` extra:
Starlette and uvicorn are imported when the command runs, and their absence is a usage
error that says how to install them. Safe by default: it binds 127.0.0.1; any other address
needs a token (``--token``, or ``$AGENT_FSM_UI_TOKEN``), which the printed address carries.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import secrets
import sys
from contextlib import closing
from pathlib import Path
from typing import Any, Protocol

from agent_fsm.errors import ConfigError
from agent_fsm.extras import install_hint

__all__ = ["TOKEN_VARIABLE", "add_ui_command", "is_loopback", "run_ui_command"]

TOKEN_VARIABLE = "AGENT_FSM_UI_TOKEN"


class _Commands(Protocol):
    def add_parser(self, name: str, **options: Any) -> argparse.ArgumentParser: ...


def add_ui_command(commands: _Commands, *, store_default: str, store_help: str) -> None:
    """Add ``ui`` to the command line's subcommands."""
    command = commands.add_parser(
        "ui",
        help="watch and steer the runs of a store in a browser (the ui extra)",
        description="Serve a local web app over a checkpoint store: the runs list, each "
        "run's path on the table with a step-through and its transcript, running runs live "
        "(AG-UI events over SSE), and, with --agent, answers to ask_user and approvals. "
        "Binds 127.0.0.1; another --host needs a token.",
    )
    command.add_argument("--store", default=store_default, help=store_help)
    command.add_argument(
        "--trace",
        metavar="FILE",
        help="show the runs recorded in a trace file (--trace of run/demo) instead of a store: "
        "read only, followed as it grows, with each model call's usage",
    )
    command.add_argument("--schema", default="agent_fsm", help="the schema of a PostgreSQL store")
    command.add_argument("--port", type=int, default=8765, metavar="N", help="(default 8765)")
    command.add_argument(
        "--host", default="127.0.0.1", help="the address to bind (default 127.0.0.1)"
    )
    command.add_argument(
        "--agent",
        metavar="MODULE:ATTR",
        help="the agent the runs were made with: its table draws them, and it answers them",
    )
    command.add_argument(
        "--token",
        help=f"required of every request (default ${TOKEN_VARIABLE}; a random one for a "
        "bind that is not loopback)",
    )
    command.set_defaults(handler=run_ui_command)


def is_loopback(host: str) -> bool:
    """``host`` is a loopback address (or ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_ui_command(args: argparse.Namespace) -> int:
    """The ``ui`` command: serve until interrupted; returns the exit code."""
    try:
        import uvicorn

        from agent_fsm.ui.app import create_app
    except ImportError as exc:
        raise ConfigError(
            f"agent-fsm ui needs the ui extra ({exc.name} is missing): {install_hint('ui')}"
        ) from None
    from agent_fsm.cli_stores import open_store
    from agent_fsm.durable.checkpoint import redacted
    from agent_fsm.loading import load_agent
    from agent_fsm.table import TABLE
    from agent_fsm.ui.recorded import TraceRuns
    from agent_fsm.ui.runs import RunSource

    loopback = is_loopback(args.host)
    token = args.token or os.environ.get(TOKEN_VARIABLE) or None
    if not loopback and token is None:
        token = secrets.token_urlsafe(24)
    agent = load_agent(args.agent) if args.agent else None
    source: RunSource
    if args.trace:
        if not Path(args.trace).is_file():
            raise ConfigError(f"no trace file at {args.trace}")
        source = TraceRuns(args.trace, agent.machine.rows if agent is not None else TABLE)
    else:
        source = open_store(args.store, args.schema)
    with closing(source) as store:
        app = create_app(
            store,
            store_name=redacted(args.trace or args.store),
            agent=agent,
            token=token,
            hosts=("127.0.0.1", "localhost", "::1", args.host) if loopback else None,
        )
        shown = f"[{args.host}]" if ":" in args.host else args.host
        address = f"http://{shown}:{args.port}/" + (f"?token={token}" if token else "")
        print(f"agent-fsm ui: {address}  (Ctrl-C stops it)", file=sys.stderr)
        # no websockets: the ui speaks HTTP and Server-Sent Events only
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning", ws="none")
    return 0
