"""Tools served by Model Context Protocol servers, offered to the model as ordinary tools.

::

    async with MCPConnection.stdio("python", ["server.py"]) as server:  # or .http(url)
        agent = Agent(model=..., tools=[*server.tools, my_own_tool])
        result = await agent.run("...")

``pip install -e '.[mcp]'``; this module and ``mcp_client`` (what it makes of what the
server sends) are the only ones that import ``mcp``. The contracts:

* **Lifetime.** The connection is the ``async with`` block: entering it starts the server
  (stdio) or opens the session (HTTP), completes the handshake and lists the tools; leaving it
  closes the session and stops the server. The tools work inside the block, on its event loop;
  a call after the block ended is answered with an error at once.
* **Tools.** A server tool becomes a ``Tool`` whose parameters are its ``inputSchema``, so
  agent_fsm validates every call before sending it. Names get ``prefix`` in front, and the
  characters providers refuse (MCP allows ``.``) become ``_``. A tool that cannot be offered
  is left out with a ``SkippedToolWarning``: the server is at fault, not the developer, and
  its other tools work. That is a name over 64 characters or already taken, a name agent_fsm
  gives its own tools (``ask_user``, ``finish_task``, ``final_result``: ``Agent`` would refuse
  the list, and a prefix offers it), a listing entry MCP does not allow (an ``inputSchema``
  that is not an object: the SDK would refuse the whole listing), or an input or output schema
  that ``Tool``'s checks refuse (too deep, a ``$ref`` loop, a pattern no linear-time engine
  takes).
* **Results.** Text is what the model reads, with PNG, JPEG and WebP images and PDF
  resources shown after it (``ToolResult.parts``); structured content and what the model
  cannot read (audio, other images and binary resources) go to ``details``, with a one-line
  note for the model. Structured content with no text is shown to the model as JSON.
  ``isError`` results are tool errors, and so is structured content its ``outputSchema``
  refuses (validated with patterns in linear time: the server writes both, and may be
  hostile).
* **Failures are results.** A server that refuses a call, dies, hangs, answers with garbage or
  drops the connection makes an error result that says so, never an exception in the run. A
  dead connection stays dead: later calls say the server is unavailable, at once. Exceptions
  are for the developer: ``ConfigError`` for bad options, ``MCPConnectionError`` on entering
  the block when the server cannot start or handshake within ``connect_timeout_s``.
* **Time.** A call is bounded by the tool timeout (``timeout_s``, else
  ``Limits.tool_timeout_s``); a timeout or an abort cancels it on the server too (the SDK
  sends ``notifications/cancelled``) and the session stays usable.

Why a task of its own holds the connection: the SDK's transports and session are anyio
contexts, entered and left in one task, and when an HTTP server goes away the transport's task
group fails and cancels the task that entered it. Held by the caller's task, that would cancel
the agent's run and raise an ``ExceptionGroup`` out of the ``async with``. The owner task holds
the contexts until told to close and records a failure as the reason the server is
unavailable; tool calls use the session from their own tasks, which the SDK allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import re
import shlex
import warnings
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from types import TracebackType
from typing import Any, Self, TextIO

import httpx2
import mcp.types as mcp_types
from mcp import MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from pydantic import JsonValue, ValidationError

from agent_fsm.errors import AgentFSMError, ConfigError
from agent_fsm.failures import describe
from agent_fsm.logs import get_logger
from agent_fsm.mcp_client import (
    Inbound,
    LinearSession,
    Listing,
    ListingScreen,
    handshake,
    reason,
    server_stderr,
    to_tool_result,
)
from agent_fsm.output import DEFAULT_TOOL_NAME
from agent_fsm.tools.patterns import schema_validator
from agent_fsm.tools.results import ToolResult
from agent_fsm.tools.schema_checks import schema_problem
from agent_fsm.tools.tool import ASK_USER, FINISH_TASK, NAME_PATTERN, Tool

__all__ = ["MCPConnection", "MCPConnectionError", "SkippedToolWarning", "offer_listed"]

_SETTLE_S = 1.0
"""How long a call whose connection closed waits for the owner task to learn why (a failed
HTTP transport is reported by its task group a moment after the calls in flight fail)."""
_CLOSE_GRACE_S = 10.0
"""How long leaving the block waits for the session and the server to shut down in order,
before cancelling the owner task (the SDK bounds its own steps: a stdio server is killed)."""
_UNSAFE_NAME_CHARACTERS = re.compile(r"[^a-zA-Z0-9_-]")
_PREFIX = re.compile(r"^[a-zA-Z0-9_-]{0,63}$")
_RESERVED = frozenset({ASK_USER.name, FINISH_TASK.name, DEFAULT_TOOL_NAME})
"""Names an agent gives its own tools: a server's tool named so would make ``Agent(...)``
refuse the whole list (two tools with one name), or pass for the runtime's own."""


class MCPConnectionError(AgentFSMError):
    """An MCP server cannot be connected to: it cannot be started, does not complete the
    handshake in time, or the connection is misused (entered twice, tools read before it
    was entered). Raised only when the ``async with`` block is entered, never by a tool call:
    a server that fails later makes error results."""


class SkippedToolWarning(UserWarning):
    """A server's tool is not offered to the model (see ``MCPConnection.skipped``)."""


_Transport = Callable[[contextlib.AsyncExitStack], Awaitable[tuple[Any, Any]]]
"""Opens the read and write streams of one connection, inside the stack that closes them."""


def _check_seconds(option: str, value: float | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{option} must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{option} must be a finite number of seconds > 0, got {value!r}")


def offer_listed(
    remote: str,
    description: str,
    input_schema: Any,
    output_schema: Any,
    *,
    prefix: str = "",
    taken: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> tuple[str, Tool | str]:
    """How one tool a server lists is offered to the model: the name it gets, and the
    ``Tool`` (whose function the connection fills in) or why it cannot be offered (then it
    is skipped, and costs only itself). Never raises, whatever the listing holds.

    Args:
        taken: names offered already, each with the server's name for its tool.
    """
    name = prefix + _UNSAFE_NAME_CHARACTERS.sub("_", remote)
    first = (taken or {}).get(name)
    if first is not None:
        return name, f"its name would be {name!r}, which {first!r} has already"
    if not NAME_PATTERN.match(name):
        return name, f"its name {name!r} is not 1 to 64 characters long"
    if name in _RESERVED:
        return name, (
            f"its name {name!r} is one agent_fsm gives its own tools "
            f"({', '.join(sorted(_RESERVED))}); a prefix= on the connection offers it"
        )
    problem = None if output_schema is None else schema_problem(output_schema)
    if problem is not None:
        return name, f"its output schema cannot be used: {problem}"
    try:
        made = Tool(name, description, input_schema, _not_connected, timeout_s=timeout_s)
    except ConfigError as exc:
        return name, str(exc).removeprefix(f"tool {name!r}: ")
    return name, made


async def _not_connected(**arguments: Any) -> ToolResult:
    """A listed tool's function before its connection gives it one."""
    raise RuntimeError("this tool is not connected to its server")


class MCPConnection:
    """A connection to one MCP server, whose tools the model may call (see the module
    docstring for the contracts). Make one with ``MCPConnection.stdio`` or
    ``MCPConnection.http`` and enter it with ``async with``; ``tools`` is then ready.

    Named after what it is, a client's connection: ``mcp.server.mcpserver.MCPServer`` is the
    SDK's class for writing a server, and the two meet in one program (tests, examples).
    """

    def __init__(
        self,
        transport: _Transport,
        *,
        label: str,
        name: str | None = None,
        prefix: str = "",
        timeout_s: float | None = None,
        connect_timeout_s: float = 30.0,
    ) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise ConfigError(f"name must be a non-empty str, got {name!r}")
        if not isinstance(prefix, str) or not _PREFIX.match(prefix):
            raise ConfigError(
                f"prefix {prefix!r} is invalid: use letters, digits, '_' and '-' only "
                "(at most 63 characters), e.g. 'fs_'"
            )
        _check_seconds("timeout_s", timeout_s)
        _check_seconds("connect_timeout_s", connect_timeout_s)
        self._transport = transport
        self._label = name or label
        self._named = name is not None
        self._prefix = prefix
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._session: LinearSession | None = None
        self._screen = ListingScreen()
        self._owner: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = asyncio.Event()
        self._closed = False
        self._failure: str | None = None
        self._tools: tuple[Tool, ...] | None = None
        self._skipped: dict[str, str] = {}

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        stderr: TextIO | None = None,
        name: str | None = None,
        prefix: str = "",
        timeout_s: float | None = None,
        connect_timeout_s: float = 30.0,
    ) -> MCPConnection:
        """A server started as a subprocess, speaking MCP over its stdin and stdout.

        Args:
            command, args: the program and its arguments.
            env: variables set for the server, over the SDK's safe defaults (``PATH``,
                ``HOME``...); the rest of our environment is not passed on.
            cwd: the server's working directory.
            stderr: where the server's stderr goes; ours when None (or nowhere, when ours
                is not a real file).
            name: the server's name in messages; the one it reports when None.
            prefix: put in front of every tool name, e.g. ``"fs_"``.
            timeout_s: each tool's ``Tool.timeout_s`` (``Limits.tool_timeout_s`` when None).
            connect_timeout_s: how long start-up, the handshake and the listing may take.

        Bytes on the server's stdout that are not MCP messages are skipped (undecodable
        ones replaced first), so a stray print or banner does not break the connection.
        """
        if not isinstance(command, str) or not command:
            raise ConfigError(f"command must be a non-empty str, got {command!r}")
        parameters = StdioServerParameters(
            command=command,
            args=[str(arg) for arg in args],
            env=dict(env) if env is not None else None,
            cwd=os.fspath(cwd) if cwd is not None else None,
            encoding_error_handler="replace",
        )

        async def transport(stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
            errlog = server_stderr(stderr, stack)
            return await stack.enter_async_context(stdio_client(parameters, errlog=errlog))

        return cls(
            transport,
            label=shlex.join([command, *parameters.args]),
            name=name,
            prefix=prefix,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        prefix: str = "",
        timeout_s: float | None = None,
        connect_timeout_s: float = 30.0,
    ) -> MCPConnection:
        """A server at ``url`` (``http://`` or ``https://``), over streamable HTTP.

        Args:
            headers: sent with every request (an ``Authorization`` header, say).
            name, prefix, timeout_s, connect_timeout_s: as for ``stdio``.
        """
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {url!r}")
        extra = dict(headers) if headers is not None else None

        async def transport(stack: contextlib.AsyncExitStack) -> tuple[Any, Any]:
            client = None
            if extra is not None:  # the SDK's own timeouts: 30 s, and 300 s to read a stream
                timeout = httpx2.Timeout(30.0, read=300.0)
                client = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=extra, timeout=timeout)
                )
            return await stack.enter_async_context(streamable_http_client(url, http_client=client))

        return cls(
            transport,
            label=url,
            name=name,
            prefix=prefix,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
        )

    def __repr__(self) -> str:
        if self._owner is None:
            state = "not entered"
        elif self._closed:
            state = "closed"
        else:
            state = "failed" if self._failure is not None else "open"
        return f"<MCPConnection {self._label!r} {state}>"

    @property
    def name(self) -> str:
        """The server's name in messages: the ``name`` given, else the one it reported."""
        return self._label

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The server's tools, as listed when the block was entered.

        Raises:
            MCPConnectionError: before the ``async with`` block was entered.
        """
        if self._tools is None:
            raise MCPConnectionError(
                f"the tools of MCP server {self._label!r} are listed when its connection "
                "opens: use them inside `async with MCPConnection...(...) as server:`"
            )
        return self._tools

    @property
    def skipped(self) -> Mapping[str, str]:
        """The server's tools that are not offered, by the server's name: why not."""
        return dict(self._skipped)

    # -- the connection's lifetime ------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._owner is not None:
            raise MCPConnectionError(
                f"the connection to MCP server {self._label!r} was already entered; make a "
                "new MCPConnection for a new connection"
            )
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future[Listing] = self._loop.create_future()
        self._owner = owner = asyncio.create_task(self._own(ready), name=f"mcp {self._label}")
        try:
            await asyncio.wait(
                (ready, owner), timeout=self._connect_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:  # the caller was cancelled: so is the connection, unawaited
            self._closed = True
            self._stop.set()
            owner.cancel()
            raise
        if not ready.done():
            ready.cancel()
            self._closed = True
            reason = self._failure or f"no answer within {self._connect_timeout_s:g} s"
            await self._shut_down(cancel=True)
            raise MCPConnectionError(f"cannot connect to MCP server {self._label!r}: {reason}")
        listing = ready.result()
        if not self._named:
            self._label = listing.server_name or self._label
        self._tools = self._offer(listing.tools)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._closed = True
        await self._shut_down(cancel=False)

    async def _own(self, ready: asyncio.Future[Listing]) -> None:
        """The owner task: enters the transport and the session, lists the tools, then holds
        the connection until told to stop. Never raises: a failure becomes ``_failure``."""
        try:
            async with contextlib.AsyncExitStack() as stack:
                read, write = await self._transport(stack)
                watched = Inbound(read, self._server_left, self._screen)
                session = await stack.enter_async_context(LinearSession(watched, write))
                listing = await handshake(session)
                self._session = session
                if not ready.done():
                    ready.set_result(listing)
                await self._stop.wait()
        except asyncio.CancelledError:  # by _shut_down, or the event loop's own shutdown
            raise
        except BaseException as exc:  # an ExceptionGroup from a transport's task group, too
            if self._failure is None:  # the server may have been seen to leave first
                self._failure = reason(exc)
            if self._session is not None and not self._closed:
                get_logger(__name__).warning(
                    "mcp_connection_lost", server=self._label, reason=self._failure
                )
            if isinstance(exc, KeyboardInterrupt | SystemExit):
                raise

    def _server_left(self) -> None:
        """The server closed the connection: no call can succeed any more."""
        if not self._closed and self._failure is None:
            self._failure = "it closed the connection: it exited or crashed"
            get_logger(__name__).warning(
                "mcp_connection_lost", server=self._label, reason=self._failure
            )
        self._stop.set()

    async def _shut_down(self, *, cancel: bool) -> None:
        """Stop the owner task: ask it (it closes the session and stops the server in
        order), and cancel it if it has not finished within ``_CLOSE_GRACE_S`` (or at once
        with ``cancel``, when it may be stuck in the handshake)."""
        owner = self._owner
        assert owner is not None
        self._stop.set()
        if not cancel:
            await asyncio.wait((owner,), timeout=_CLOSE_GRACE_S)
        if not owner.done():
            owner.cancel()
            await asyncio.wait((owner,), timeout=_CLOSE_GRACE_S)

    # -- the tools -----------------------------------------------------------------------------

    def _offer(self, listed: list[mcp_types.Tool]) -> tuple[Tool, ...]:
        """Each listed tool as a ``Tool``; the ones that cannot be are skipped, with a
        warning that names them: those the listing screen took out first, then those whose
        name or schemas do not fit. Each costs only itself."""
        for remote_name, why in self._screen.refused.items():
            self._skip(remote_name, why)
        session = self._session
        assert session is not None
        offered: dict[str, tuple[str, Tool]] = {}
        for remote in listed:
            description = (
                remote.description or remote.title or f"{remote.name}, of MCP server {self._label}"
            )
            name, made = offer_listed(
                remote.name,
                description,
                remote.input_schema,
                remote.output_schema,
                prefix=self._prefix,
                taken={taken: first for taken, (first, _) in offered.items()},
                timeout_s=self._timeout_s,
            )
            if isinstance(made, str):
                self._skip(remote.name, made)
                continue
            made = dataclasses.replace(made, fn=partial(self._call, name, remote.name))
            offered[name] = (remote.name, made)
            if remote.output_schema is not None:
                session.output_validators[remote.name] = schema_validator(remote.output_schema)
        return tuple(made for _, made in offered.values())

    def _skip(self, remote: str, why: str) -> None:
        self._skipped[remote] = why
        warnings.warn(
            f"MCP server {self._label!r}: tool {remote!r} is not offered to the model: {why}",
            SkippedToolWarning,
            stacklevel=4,
        )

    async def _call(self, name: str, remote: str, /, **arguments: Any) -> ToolResult:
        """Call tool ``remote`` (offered as ``name``) on the server. Must not raise, except
        the caller's cancellation: every failure is an error result that says what happened."""
        unusable = self._usable()
        if unusable is not None:
            return self._error(name, remote, unusable)
        session = self._session
        assert session is not None
        try:
            result = await session.call_tool(
                remote, arguments, read_timeout_seconds=self._timeout_s
            )
        except MCPError as exc:
            if exc.code == mcp_types.CONNECTION_CLOSED and self._owner is not None:
                await asyncio.wait((self._owner,), timeout=_SETTLE_S)
            return self._error(name, remote, self._explain(exc), code=exc.code)
        except ValidationError as exc:
            return self._error(name, remote, reason(exc))
        except Exception as exc:
            return self._error(name, remote, f"the MCP client failed ({describe(exc)})")
        try:
            return to_tool_result(self._label, remote, result)
        except Exception as exc:  # details that are not JSON, say
            return self._error(name, remote, f"its result cannot be read ({describe(exc)})")

    def _usable(self) -> str | None:
        """Why no call can be made now, or None."""
        if self._closed:
            return "the connection is closed (its `async with` block has ended)"
        if self._failure is not None:
            return f"the server is unavailable ({self._failure})"
        if self._session is None:
            return "the connection is not open"
        if asyncio.get_running_loop() is not self._loop:
            return "the call came from another event loop than the one that opened the connection"
        return None

    def _explain(self, exc: MCPError) -> str:
        """An ``MCPError`` from a call, in words: the connection or the server's refusal."""
        if exc.code == mcp_types.CONNECTION_CLOSED:
            return self._usable() or (
                f"the connection closed ({exc.message}): the server may have exited or crashed"
            )
        if exc.code == mcp_types.REQUEST_TIMEOUT and self._timeout_s is not None:
            return f"no answer within {self._timeout_s:g} s"
        return f"the server refused the call: {exc.message} (MCP error {exc.code})"

    def _error(self, name: str, remote: str, why: str, *, code: int | None = None) -> ToolResult:
        """An error result for a call of tool ``name`` (``remote`` on the server)."""
        details: dict[str, JsonValue] = {"server": self._label, "tool": remote}
        if code is not None:
            details["error_code"] = code
        return ToolResult(
            f"Tool {name!r} of MCP server {self._label!r} failed: {why}.", details, True
        )
