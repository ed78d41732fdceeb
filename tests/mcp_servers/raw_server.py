"""A misbehaving MCP server for tests/test_mcp.py: it speaks JSON-RPC by hand over stdio, so it
can send what the ``mcp`` package's own server never would.

Its tool listing holds names and schemas agent_fsm cannot offer, and its tools answer with
noise, malformed results or nothing at all.

    python raw_server.py [--scalar]   --scalar: one more tool, whose arguments are not an
                                      object (which MCP forbids)
"""

from __future__ import annotations

import json
import sys
from typing import Any

OBJECT = {"type": "object", "properties": {"text": {"type": "string"}}}

TOOLS: list[dict[str, Any]] = [
    {"name": "files.read", "description": "A dotted name.", "inputSchema": OBJECT},
    {"name": "files_read", "description": "Collides with files.read.", "inputSchema": OBJECT},
    {"name": "x" * 70, "description": "A name too long.", "inputSchema": OBJECT},
    {
        "name": "dangling",
        "description": "A $ref to nothing.",
        "inputSchema": {"type": "object", "properties": {"x": {"$ref": "#/$defs/missing"}}},
    },
    {"name": "noisy", "description": "Prints noise, then answers.", "inputSchema": OBJECT},
    {"name": "malformed", "description": "Answers with a broken result.", "inputSchema": OBJECT},
    {"name": "silent", "description": "Never answers.", "inputSchema": OBJECT},
]


SCALAR = {"name": "scalar", "description": "Not an object.", "inputSchema": {"type": "string"}}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request: dict[str, Any]) -> None:
    method, ident = request.get("method"), request.get("id")
    if method == "initialize":
        version = request["params"]["protocolVersion"]
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "raw", "version": "0"},
        }})  # fmt: skip
    elif method == "tools/list":
        tools = [*TOOLS, SCALAR] if "--scalar" in sys.argv else TOOLS
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": tools}})
    elif method == "tools/call":
        call_tool(ident, request["params"]["name"])
    elif ident is not None:
        send(
            {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no such method"}}
        )


def call_tool(ident: Any, name: str) -> None:
    text = {"content": [{"type": "text", "text": f"{name} answered"}], "isError": False}
    if name == "noisy":
        sys.stdout.buffer.write(b"progress: 50%\n\xff\xfe\x00 binary noise\n[1, 2, 3]\n")
        sys.stdout.flush()
        send({"jsonrpc": "2.0", "id": ident, "result": text})
    elif name == "malformed":
        send({"jsonrpc": "2.0", "id": ident, "result": {"content": "not a list of blocks"}})
    elif name == "silent":
        return
    else:
        send({"jsonrpc": "2.0", "id": ident, "result": text})


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            answer(json.loads(line))


if __name__ == "__main__":
    main()
