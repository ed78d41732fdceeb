"""Tools from MCP servers (issue 17), against real servers: ``tests/mcp_servers/tools_server.py``
(written with the ``mcp`` package's own server API) started as a subprocess over stdio and over
streamable HTTP on 127.0.0.1, and ``raw_server.py``, which misbehaves on purpose.

Timeouts here are upper bounds (``PATIENCE_S``) against hangs, never measurements, except
where a short tool timeout is the thing under test."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import select
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent_fsm import (
    Agent,
    ConfigError,
    ImagePart,
    Limits,
    RunResult,
    RunStatus,
    StopReason,
    Tool,
    ToolResult,
    tool,
)
from agent_fsm.events import Event
from agent_fsm.mcp import MCPConnection, MCPConnectionError, SkippedToolWarning
from agent_fsm.messages import ToolMessage, ToolStatus
from agent_fsm.testing import ScriptedModel, ScriptItem, call, check_invariants, reply

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
TOOLS_SERVER = str(SERVERS / "tools_server.py")
RAW_SERVER = str(SERVERS / "raw_server.py")
PATIENCE_S = 60.0
"""The most any wait here may take: an upper bound against hangs, never a measurement."""
PNG = bytes.fromhex("89504e470d0a1a0a")  # what tools_server.py's snapshot tool sends


# -- servers -----------------------------------------------------------------------------------


class HTTPServer:
    """tools_server.py serving streamable HTTP on 127.0.0.1, on a port the system picked."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, TOOLS_SERVER, "http"], stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        readable, _, _ = select.select([self.process.stdout], [], [], PATIENCE_S)
        line = self.process.stdout.readline() if readable else ""
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the HTTP MCP server did not start (it printed {line!r})")
        self.port = int(line)
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self._wait_until_accepting()

    def _wait_until_accepting(self) -> None:
        deadline = time.monotonic() + PATIENCE_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1.0).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=PATIENCE_S)
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture(scope="module")
def http_server() -> Iterator[HTTPServer]:
    """One HTTP server for the module's tests (each opens its own session)."""
    server = HTTPServer()
    yield server
    server.stop()


@pytest.fixture
def own_http_server() -> Iterator[HTTPServer]:
    """An HTTP server for one test, which may kill it."""
    server = HTTPServer()
    yield server
    server.stop()


def connection(transport: str, request: pytest.FixtureRequest, **options: Any) -> MCPConnection:
    """A connection to tools_server.py over ``transport`` (the HTTP server, the module's)."""
    if transport == "stdio":
        return MCPConnection.stdio(sys.executable, [TOOLS_SERVER, "stdio"], **options)
    server: HTTPServer = request.getfixturevalue("http_server")
    return MCPConnection.http(server.url, **options)


@pytest.fixture(params=["stdio", "http"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[MCPConnection]:
    """tools_server.py, connected over each transport in turn."""
    async with connection(request.param, request) as connected:
        yield connected


@asynccontextmanager
async def raw_server(*args: str, skipped: int = 3, **options: Any) -> AsyncIterator[MCPConnection]:
    """raw_server.py, connected over stdio (its listing always has tools to skip: ``skipped``
    of them, each with a warning)."""
    connected = MCPConnection.stdio(sys.executable, [RAW_SERVER, *args], **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await connected.__aenter__()
    assert [warning.category for warning in caught] == [SkippedToolWarning] * skipped
    try:
        yield connected
    finally:
        await connected.__aexit__(None, None, None)


# -- running agents ----------------------------------------------------------------------------


async def run(
    tools: Sequence[Tool],
    script: Sequence[ScriptItem],
    *,
    limits: Limits | None = None,
    handlers: Sequence[Any] = (),
) -> RunResult:
    """One run of an agent with ``tools`` on a scripted model; its invariants checked."""
    limits = limits or Limits(max_consecutive_errors=10)
    agent = Agent(model=ScriptedModel(script), tools=tools, limits=limits, handlers=list(handlers))
    result = await asyncio.wait_for(agent.run("Use the tools."), PATIENCE_S)
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    return result


def answers(result: RunResult) -> list[ToolMessage]:
    return [message for message in result.messages if isinstance(message, ToolMessage)]


def named(tools: Sequence[Tool], name: str) -> Tool:
    return next(tool for tool in tools if tool.name == name)


async def call_directly(tools: Sequence[Tool], name: str, /, **arguments: Any) -> ToolResult:
    """Call a tool's function as the runtime would, with no timeout but ``PATIENCE_S``."""
    fn = named(tools, name).fn
    assert fn is not None
    result = await asyncio.wait_for(fn(**arguments), PATIENCE_S)
    assert isinstance(result, ToolResult)
    return result


async def wait_for_text(path: Path, text: str) -> None:
    """Until the file at ``path`` holds ``text`` (the servers write markers there)."""
    deadline = time.monotonic() + PATIENCE_S
    while not (path.exists() and path.read_text() == text):
        assert time.monotonic() < deadline, f"{path} never held {text!r}"
        await asyncio.sleep(0.05)


# -- listing and validation --------------------------------------------------------------------


async def test_the_servers_tools_are_offered_with_their_schemas(server: MCPConnection) -> None:
    assert server.name == "test-tools"
    assert {"add", "forecast", "snapshot", "stall", "record"} <= {t.name for t in server.tools}
    add = named(server.tools, "add")
    assert add.description == "Add two integers."
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"]["type"] == "integer"
    assert server.skipped == {}
    assert "open" in repr(server)


async def test_the_model_is_given_the_tools_schemas(server: MCPConnection) -> None:
    model = ScriptedModel(["Nothing to do."])
    await Agent(model=model, tools=server.tools).run("Hello")
    offered = {spec.name: spec for spec in model.requests[0].tools}
    assert offered["forecast"].parameters == dict(named(server.tools, "forecast").parameters)
    assert offered["forecast"].description.startswith("Tomorrow's weather")


async def test_a_call_with_bad_arguments_never_reaches_the_server(server: MCPConnection) -> None:
    result = await run(
        server.tools,
        [
            reply("", call("records")),
            reply("", call("record", entry=7), call("record")),
            reply("", call("records")),
            "Done.",
        ],
    )
    before, wrong_type, missing, after = answers(result)
    for refused in (wrong_type, missing):
        assert refused.status is ToolStatus.ERROR
        assert refused.content.startswith("Invalid arguments for tool 'record'")
        assert refused.details is None  # answered by agent_fsm's validator, not the server
    assert "7 is not of type 'string'" in wrong_type.content
    assert "'entry' is a required property" in missing.content
    assert isinstance(before.details, dict)
    assert isinstance(after.details, dict)
    assert after.details["structured_content"] == before.details["structured_content"]


# -- results -----------------------------------------------------------------------------------


async def test_text_goes_to_the_model_and_the_rest_to_details(server: MCPConnection) -> None:
    result = await run(
        server.tools,
        [
            reply(
                "",
                call("add", a=2, b=3),
                call("forecast", city="Oslo"),
                call("snapshot", label="x"),
                call("tally", word="hey"),
            ),
            "Done.",
        ],
    )
    assert result.stop_reason is StopReason.FINAL_ANSWER
    add, forecast, snapshot, tally = answers(result)
    assert all(answer.status is ToolStatus.OK for answer in (add, forecast, snapshot, tally))
    assert add.content == "5"
    assert add.details == {
        "server": "test-tools",
        "tool": "add",
        "structured_content": {"result": 5},
    }
    weather = {"city": "Oslo", "celsius": 21.5, "summary": "Sunny in Oslo"}
    assert json.loads(forecast.content) == weather  # the server's text, a JSON copy
    assert isinstance(forecast.details, dict)
    assert forecast.details["structured_content"] == weather
    # An image: shown to the model after the text (issue 35: images in tool results).
    assert snapshot.content == "Snapshot x"
    assert snapshot.parts == (ImagePart(data=PNG, media_type="image/png"),)
    assert snapshot.details == {"server": "test-tools", "tool": "snapshot"}
    # Structured content alone: the model reads it as JSON.
    assert json.loads(tally.content) == {"word": "hey", "letters": 3}


async def test_errors_from_the_server_are_tool_errors(server: MCPConnection) -> None:
    result = await run(
        server.tools,
        [
            reply("", call("flagged", text="q"), call("refuse", reason="no"), call("crash")),
            "I could not do it.",
        ],
    )
    assert result.status is RunStatus.COMPLETED
    flagged, refused, crashed = answers(result)
    assert all(a.status is ToolStatus.ERROR for a in (flagged, refused, crashed))
    assert flagged.content == "cannot use 'q'"  # an isError result the tool built
    assert refused.content.endswith("refused: no")  # ToolError: its message reaches the model
    # A crash: the server's own words (mcp 2.3 no longer adds the exception's message).
    assert crashed.content.startswith("Error executing tool crash")
    assert crashed.details == {"server": "test-tools", "tool": "crash"}


# -- time: timeouts and aborts -----------------------------------------------------------------


async def test_a_hanging_tool_is_bounded_by_the_timeout_and_the_session_still_works(
    server: MCPConnection, tmp_path: Path
) -> None:
    marker = tmp_path / "stall"
    result = await run(
        server.tools,
        [reply("", call("stall", marker=str(marker))), "It timed out."],
        limits=Limits(tool_timeout_s=1.0),
    )
    (stalled,) = answers(result)
    assert stalled.status is ToolStatus.ERROR
    assert stalled.content == "Tool 'stall' timed out after 1 s."
    await wait_for_text(marker, "cancelled")  # the cancellation reached the server
    after = await run(server.tools, [reply("", call("add", a=1, b=1)), "2."])
    assert answers(after)[0].content == "2"


async def test_the_connections_own_timeout_bounds_a_call_too(tmp_path: Path) -> None:
    async with MCPConnection.stdio(sys.executable, [TOOLS_SERVER, "stdio"], timeout_s=1) as server:
        assert named(server.tools, "stall").timeout_s == 1
        stalled = await call_directly(server.tools, "stall", marker=str(tmp_path / "m"))
        assert stalled.is_error
        assert (
            stalled.output
            == "Tool 'stall' of MCP server 'test-tools' failed: no answer within 1 s."
        )
        assert (await call_directly(server.tools, "add", a=1, b=2)).output == "3"


async def test_an_abort_cancels_the_call_on_the_server(
    server: MCPConnection, tmp_path: Path
) -> None:
    marker = tmp_path / "stall"
    agent = Agent(
        model=ScriptedModel([reply("", call("stall", marker=str(marker)))]), tools=server.tools
    )
    started = agent.start("Wait.")
    running = asyncio.create_task(started.run())
    await wait_for_text(marker, "started")
    started.abort("the user pressed stop")
    result = await asyncio.wait_for(running, PATIENCE_S)
    assert result.stop_reason is StopReason.ABORTED
    check_invariants(result, limits=agent.limits, bound=agent.bound)
    (stalled,) = answers(result)
    assert stalled.content == "Tool 'stall' was cancelled because the run was stopped."
    await wait_for_text(marker, "cancelled")
    after = await run(server.tools, [reply("", call("add", a=2, b=2)), "4."])
    assert answers(after)[0].content == "4"


# -- servers that die, hang or send garbage ----------------------------------------------------


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_server_that_dies_mid_call_gives_error_results_and_the_run_ends_normally(
    transport: str, request: pytest.FixtureRequest
) -> None:
    if transport == "http":
        url = request.getfixturevalue("own_http_server").url
        dying = MCPConnection.http(url)
    else:
        dying = MCPConnection.stdio(sys.executable, [TOOLS_SERVER, "stdio"])
    async with dying as server:
        result = await run(
            server.tools,
            [
                reply("", call("pid")),
                reply("", call("die")),
                reply("", call("add", a=1, b=2)),
                reply("", call("add", a=1, b=2)),
                "The server is gone.",
            ],
        )
    assert result.status is RunStatus.COMPLETED
    assert result.stop_reason is StopReason.FINAL_ANSWER
    pid, died, *later = answers(result)
    for answer in (died, *later):
        assert answer.status is ToolStatus.ERROR
        assert answer.content.startswith(f"Tool {answer.name!r} of MCP server 'test-tools' failed")
    # Over HTTP the dying call may only see its stream end; by the last call the server is
    # known to be gone, and the call is not even tried.
    assert "failed: the server is unavailable (" in later[-1].content
    assert isinstance(later[-1].details, dict)
    assert "error_code" not in later[-1].details
    if transport == "stdio":
        with pytest.raises(ProcessLookupError):  # gone, and reaped when the block ended
            os.kill(int(pid.content), 0)


async def test_a_killed_http_server_gives_error_results_and_no_exception_escapes(
    own_http_server: HTTPServer,
) -> None:
    def kill_after_the_first_call(event: Event) -> None:
        if event.kind == "tool_finished":
            own_http_server.process.kill()

    async with MCPConnection.http(own_http_server.url) as server:
        result = await run(
            server.tools,
            [
                reply("", call("add", a=1, b=2)),
                *[reply("", call("echo", text=f"hi {n}")) for n in range(2)],
                "Bye.",
            ],
            handlers=[kill_after_the_first_call],
        )
        first, *later = answers(result)
        assert first.content == "3"
        for answer in later:
            assert answer.status is ToolStatus.ERROR
            assert answer.content.startswith("Tool 'echo' of MCP server 'test-tools' failed: ")
        # The transport's task group failed; its ExceptionGroup stayed in the owner task.
        assert "failed" in repr(server)
        assert "failed: the server is unavailable (" in later[-1].content
    assert result.stop_reason is StopReason.FINAL_ANSWER


async def test_noise_on_stdout_is_skipped() -> None:
    banner = MCPConnection.stdio(sys.executable, [TOOLS_SERVER, "stdio", "--banner"])
    async with banner as server:  # the banner came before the handshake
        assert (await call_directly(server.tools, "echo", text="hi")).output == "hi"
    async with raw_server() as server:  # noise, some of it not UTF-8, before an answer
        noisy = await call_directly(server.tools, "noisy", text="a")
        assert noisy.output == "noisy answered"


async def test_a_malformed_answer_or_none_at_all_is_an_error_result() -> None:
    async with raw_server(timeout_s=1) as server:
        result = await run(
            server.tools,
            [
                reply("", call("malformed", text="a")),
                reply("", call("silent", text="a")),
                reply("", call("noisy", text="a")),
                "Done.",
            ],
        )
    malformed, silent, noisy = answers(result)
    assert malformed.status is ToolStatus.ERROR
    assert malformed.content.startswith(
        "Tool 'malformed' of MCP server 'raw' failed: the server sent what is not valid MCP "
        "(content: "
    )
    assert silent.status is ToolStatus.ERROR
    assert "1 s" in silent.content  # whichever bound came first, the runtime's or the call's
    assert noisy.content == "noisy answered"  # the session survived both


# -- names and schemas the runtime cannot take -------------------------------------------------


async def test_tools_that_cannot_be_offered_are_skipped_with_a_warning_naming_them() -> None:
    async with raw_server(prefix="raw_") as server:
        assert [t.name for t in server.tools] == [
            "raw_files_read",  # files.read, renamed: providers refuse the dot
            "raw_noisy",
            "raw_malformed",
            "raw_silent",
        ]
        renamed = await call_directly(server.tools, "raw_files_read", text="a")
        assert renamed.details == {"server": "raw", "tool": "files.read"}
    assert set(server.skipped) == {"files_read", "x" * 70, "dangling"}
    assert "'raw_files_read', which 'files.read' has already" in server.skipped["files_read"]
    assert "not 1 to 64 characters long" in server.skipped["x" * 70]
    assert "#/$defs/missing" in server.skipped["dangling"]


async def test_the_warning_names_the_tool_and_points_at_the_async_with() -> None:
    server = MCPConnection.stdio(sys.executable, [RAW_SERVER])
    with pytest.warns(SkippedToolWarning) as caught:
        await server.__aenter__()
    await server.__aexit__(None, None, None)
    dangling = (
        "MCP server 'raw': tool 'dangling' is not offered to the model: the schema's $refs "
        "refer to what they do not define: #/$defs/missing"
    )
    assert any(str(warning.message).startswith(dangling) for warning in caught)
    assert {warning.filename for warning in caught} == {__file__}


async def test_a_tool_the_sdk_refuses_costs_only_itself() -> None:
    # MCP requires an object schema; the SDK validates the whole listing at once, so before
    # the listing was screened entry by entry this one tool failed the connection
    async with raw_server("--scalar", skipped=4) as server:
        assert [t.name for t in server.tools] == ["files_read", "noisy", "malformed", "silent"]
        answered = await call_directly(server.tools, "noisy", text="a")
        assert answered.output == "noisy answered"
    assert server.skipped["scalar"] == (
        "its listing is not valid MCP (inputSchema.type: Input should be 'object')"
    )


async def test_a_listing_the_sdk_refuses_as_a_whole_fails_the_connection_clearly() -> None:
    with pytest.raises(MCPConnectionError, match=r"not valid MCP \(tools: Input should be"):
        async with MCPConnection.stdio(sys.executable, [RAW_SERVER, "--broken-listing"]):
            pass


async def test_prefixes_keep_two_servers_tools_apart(request: pytest.FixtureRequest) -> None:
    async with (
        connection("stdio", request, prefix="a_") as first,
        connection("http", request, prefix="b_") as second,
    ):
        result = await run(
            [*first.tools, *second.tools],
            [reply("", call("a_add", a=1, b=2), call("b_add", a=3, b=4)), "Done."],
        )
        via_first, via_second = answers(result)
        assert (via_first.content, via_second.content) == ("3", "7")
        assert isinstance(via_second.details, dict)
        assert via_second.details["tool"] == "add"
        with pytest.raises(ConfigError, match="two tools are named 'a_add'"):
            Agent(model=ScriptedModel([]), tools=[*first.tools, *first.tools])


async def test_headers_go_with_every_http_request(http_server: HTTPServer) -> None:
    secret = {"X-Agent-Token": "s3cret"}
    async with MCPConnection.http(http_server.url, headers=secret) as server:
        sent = await call_directly(server.tools, "header", name="X-Agent-Token")
    assert sent.output == "s3cret"


async def test_a_tool_name_taken_by_another_tool_is_refused_by_the_agent(
    server: MCPConnection,
) -> None:
    @tool
    def echo(text: str) -> str:
        """Our own echo."""
        return text

    with pytest.raises(ConfigError, match="two tools are named 'echo'"):
        Agent(model=ScriptedModel([]), tools=[echo, *server.tools])


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: MCPConnection.stdio("python", prefix="fs."), "prefix 'fs.' is invalid"),
        (lambda: MCPConnection.stdio(""), "command must be a non-empty str"),
        (lambda: MCPConnection.stdio("python", timeout_s=0), "timeout_s must be a finite"),
        (lambda: MCPConnection.http("ftp://host/mcp"), "url must start with http"),
        (lambda: MCPConnection.http("http://h", connect_timeout_s=-1), "connect_timeout_s"),
    ],
)
def test_bad_options_are_refused_at_construction(make: Any, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        make()


# -- the connection's lifetime -----------------------------------------------------------------


async def test_tools_used_after_the_block_ended_answer_with_an_error_at_once() -> None:
    async with MCPConnection.stdio(sys.executable, [TOOLS_SERVER, "stdio"]) as server:
        tools = server.tools
    assert "closed" in repr(server)
    late = await call_directly(tools, "add", a=1, b=2)
    assert late.is_error
    assert late.output == (
        "Tool 'add' of MCP server 'test-tools' failed: the connection is closed (its "
        "`async with` block has ended)."
    )
    result = await run(tools, [reply("", call("add", a=1, b=2)), "It is closed."])
    assert answers(result)[0].status is ToolStatus.ERROR
    with pytest.raises(MCPConnectionError, match="already entered"):
        async with server:
            pass


def test_the_tools_exist_only_once_the_connection_is_open() -> None:
    server = MCPConnection.stdio(sys.executable, [TOOLS_SERVER, "stdio"])
    assert "not entered" in repr(server)
    with pytest.raises(MCPConnectionError, match="listed when its connection opens"):
        _ = server.tools


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        (["/nonexistent/mcp-server"], "No such file or directory"),
        ([sys.executable, "-c", "pass"], "Connection closed|it exited or crashed"),
    ],
)
async def test_a_server_that_cannot_start_fails_the_block(command: list[str], problem: str) -> None:
    with pytest.raises(MCPConnectionError, match=problem):
        async with MCPConnection.stdio(command[0], command[1:]):
            pass


async def test_a_server_that_never_answers_the_handshake_fails_the_block_in_time() -> None:
    silent = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    started = time.monotonic()
    with pytest.raises(MCPConnectionError, match="no answer within 1 s"):
        async with MCPConnection.stdio(silent[0], silent[1:], connect_timeout_s=1):
            pass
    assert time.monotonic() - started < PATIENCE_S


async def test_cancelling_the_entry_leaves_no_server_behind(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    silent = (
        f"import os, sys; open({str(pid_file)!r}, 'w').write(str(os.getpid())); sys.stdin.read()"
    )
    entering = asyncio.create_task(MCPConnection.stdio(sys.executable, ["-c", silent]).__aenter__())
    deadline = time.monotonic() + PATIENCE_S
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the server never started"
        await asyncio.sleep(0.05)
    entering.cancel()
    with pytest.raises(asyncio.CancelledError):
        await entering
    pid = int(pid_file.read_text())
    while True:  # stopped and reaped by the connection's owner task, in the background
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() < deadline, f"server {pid} is still running"
        await asyncio.sleep(0.05)


async def test_an_http_url_where_nothing_listens_fails_the_block() -> None:
    with socket.socket() as probe:  # a port that was free a moment ago, now closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(MCPConnectionError, match="ConnectError"):
        async with MCPConnection.http(f"http://127.0.0.1:{port}/mcp"):
            pass


def test_images_and_pdfs_are_shown_and_the_rest_noted() -> None:
    import mcp.types as mcp_types

    from agent_fsm.content import FilePart
    from agent_fsm.mcp_client import to_tool_result

    pdf = b"%PDF-1.7 ..."
    result = mcp_types.CallToolResult(
        content=[
            mcp_types.TextContent(type="text", text="Here:"),
            mcp_types.ImageContent(
                type="image", data=base64.b64encode(PNG).decode(), mimeType="image/png"
            ),
            mcp_types.ImageContent(type="image", data="R0lGOD", mimeType="image/gif"),
            mcp_types.ImageContent(type="image", data="not base64!", mimeType="image/jpeg"),
            mcp_types.EmbeddedResource(
                type="resource",
                resource=mcp_types.BlobResourceContents(
                    uri="file:///tmp/report.pdf",
                    mimeType="application/pdf",
                    blob=base64.b64encode(pdf).decode(),
                ),
            ),
        ]
    )
    answer = to_tool_result("srv", "look", result)
    assert answer.parts == (
        ImagePart(data=PNG, media_type="image/png"),
        FilePart(data=pdf, media_type="application/pdf", name="report.pdf"),
    )
    # a GIF (Gemini reads none) and an image that is no base64 stay notes, kept in details
    assert answer.output == (
        "Here:\n[image image/gif, 4 bytes: not shown to you]\n"
        "[image image/jpeg, 8 bytes: not shown to you]"
    )
    assert isinstance(answer.details, dict)
    assert [block["mimeType"] for block in answer.details["content"]] == ["image/gif", "image/jpeg"]
    only = mcp_types.CallToolResult(
        content=[
            mcp_types.ImageContent(
                type="image", data=base64.b64encode(PNG).decode(), mimeType="image/webp"
            )
        ]
    )
    assert to_tool_result("srv", "look", only).output == "(the tool returned 1 image(s) or file(s))"
