"""A misbehaving MCP server for tests/test_mcp.py: it speaks JSON-RPC by hand over stdio, so it
can send what the ``mcp`` package's own server never would.

Its tool listing holds names and schemas agent_fsm cannot offer, and its tools answer with
noise, malformed results or nothing at all.

    python raw_server.py [--scalar] [--hostile] [--broken-listing]
        --scalar: one more tool, whose arguments are not an object (which MCP forbids)
        --hostile: more tools that cannot be offered (control-flow names, a schema too deep,
            a pattern no linear-time engine takes, a $ref loop), and two whose patterns would
            backtrack (one in its input schema, one in its output schema)
        --broken-listing: a listing whose "tools" is not a list (no tool can be read)
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

BACKTRACKS = "(a+)+$"
"""A pattern Python's re takes seconds to fail on "a" * 26 + "!", and 4x longer per 2 more."""


def nested(levels: int) -> dict[str, Any]:
    """An object schema nested ``levels`` objects deep."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


HOSTILE: list[dict[str, Any]] = [
    {"name": "ask_user", "description": "Takes the control tool's name.", "inputSchema": OBJECT},
    {"name": "finish_task", "description": "Takes another.", "inputSchema": OBJECT},
    {"name": "final_result", "description": "The output tool's.", "inputSchema": OBJECT},
    SCALAR,
    {"name": "deep", "description": "Nested 40 objects deep.", "inputSchema": nested(40)},
    {
        "name": "lookahead",
        "description": "A pattern with look-ahead.",
        "inputSchema": {"type": "object", "properties": {"text": {"pattern": "^(?=a)"}}},
    },
    {
        "name": "looping",
        "description": "A $ref loop that never reaches into the value.",
        "inputSchema": {
            "type": "object",
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "properties": {"text": {"$ref": "#/$defs/a"}},
        },
    },
    {
        "name": "backtracking",
        "description": "Its pattern would backtrack.",
        "inputSchema": {"type": "object", "properties": {"text": {"pattern": BACKTRACKS}}},
    },
    {
        "name": "structured",
        "description": "Answers with structured content its output schema's pattern refuses.",
        "inputSchema": OBJECT,
        "outputSchema": {"type": "object", "properties": {"text": {"pattern": BACKTRACKS}}},
    },
]


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
        tools = list(TOOLS)
        if "--scalar" in sys.argv:
            tools.append(SCALAR)
        if "--hostile" in sys.argv:
            tools.extend(HOSTILE)
        listing = "not a list" if "--broken-listing" in sys.argv else tools
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": listing}})
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
    elif name == "structured":
        content = {"text": "a" * 28 + "!"}
        block = {"type": "text", "text": json.dumps(content)}
        result = {"content": [block], "structuredContent": content, "isError": False}
        send({"jsonrpc": "2.0", "id": ident, "result": result})
    else:
        send({"jsonrpc": "2.0", "id": ident, "result": text})


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            answer(json.loads(line))


if __name__ == "__main__":
    main()
