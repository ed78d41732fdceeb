"""A tool call from definition to answer: ``@tool`` and ``Tool`` (schemas derived from
signatures), the registry that validates a call's arguments, execution with timeouts and
retries, and the scheduling of one turn's calls."""

from agent_fsm.tools.results import ToolResult
from agent_fsm.tools.tool import Tool, ToolRegistry, tool

__all__ = ["Tool", "ToolRegistry", "ToolResult", "tool"]
