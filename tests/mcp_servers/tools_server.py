"""An MCP server for tests/test_mcp.py, written with the ``mcp`` package's own server API.

python tools_server.py stdio [--banner]   serve over stdin/stdout; --banner first prints
                                          bytes that are not MCP (and not even UTF-8)
python tools_server.py http               serve streamable HTTP on 127.0.0.1, on a port
                                          the system picks; its number is the first line
                                          printed to stdout
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent
from pydantic import BaseModel

server = MCPServer("test-tools", log_level="WARNING")

PNG = bytes.fromhex("89504e470d0a1a0a")
"""The first bytes of a PNG file: enough to stand for an image."""


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Return the text unchanged."""
    return text


class Forecast(BaseModel):
    city: str
    celsius: float
    summary: str


@server.tool()
def forecast(city: str) -> Forecast:
    """Tomorrow's weather for a city, as structured content."""
    return Forecast(city=city, celsius=21.5, summary=f"Sunny in {city}")


@server.tool()
def snapshot(label: str) -> CallToolResult:
    """A caption and an image."""
    image = Image(data=PNG, format="png").to_image_content()
    return CallToolResult(content=[TextContent(type="text", text=f"Snapshot {label}"), image])


@server.tool()
def tally(word: str) -> CallToolResult:
    """Counts in structured content only, with no text for the model."""
    return CallToolResult(content=[], structured_content={"word": word, "letters": len(word)})


@server.tool()
def flagged(text: str) -> CallToolResult:
    """An isError result, built by the tool itself."""
    return CallToolResult(
        content=[TextContent(type="text", text=f"cannot use {text!r}")], is_error=True
    )


@server.tool()
def refuse(reason: str) -> str:
    """Fails with a message meant for the model (ToolError)."""
    raise ToolError(f"refused: {reason}")


@server.tool()
def crash() -> str:
    """Fails with an exception the server did not anticipate."""
    raise RuntimeError("the disk caught fire")


RECORDS: list[str] = []


@server.tool()
def record(entry: str) -> int:
    """Keep an entry; the number kept so far."""
    RECORDS.append(entry)
    return len(RECORDS)


@server.tool()
def records() -> list[str]:
    """Every entry kept."""
    return RECORDS


@server.tool()
async def stall(marker: str) -> str:
    """Never answers. Writes "started" to the file ``marker`` when called, and "cancelled"
    when the call is cancelled."""
    Path(marker).write_text("started")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        Path(marker).write_text("cancelled")
        raise
    return "woke up"


@server.tool()
def die() -> str:
    """Kills its own server process in the middle of the call."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@server.tool()
def header(name: str, ctx: Context) -> str:
    """The value of an HTTP header of this request ("(none)" without one, and on stdio)."""
    return (ctx.headers or {}).get(name.lower(), "(none)")


@server.tool(name="pid")
def process_id() -> int:
    """The server's process id."""
    return os.getpid()


def serve_http() -> None:
    """Serve streamable HTTP on a socket bound here, so the port is known before serving."""
    import uvicorn

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    print(listener.getsockname()[1], flush=True)
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        serve_http()
    else:
        if "--banner" in sys.argv:
            sys.stdout.buffer.write(b"Welcome to test-tools!\n\xff\xfe not JSON at all\n{}\n")
            sys.stdout.buffer.flush()
        server.run("stdio")
