"""agent_fsm: LLM tool-calling agents run as an explicit, verifiable finite-state machine.

The names people write every day, grouped. The rest is imported from where it lives: events
from ``agent_fsm.events``, the transcript from ``agent_fsm.messages``, model adapters from
``agent_fsm.models``, trace files and run summaries from ``agent_fsm.durable``, the test
harness from ``agent_fsm.testing``.
"""

import importlib
import logging
from typing import TYPE_CHECKING, Any

from agent_fsm.version import __version__ as __version__

# A library is silent until the application configures logging (``agent_fsm.logs``): without
# this, Python's last-resort handler prints every warning on stderr.
logging.getLogger(__name__).addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from agent_fsm.agent import Agent
    from agent_fsm.compaction import ClearToolResults, ContextPolicy, KeepLastTurns, Summarize
    from agent_fsm.content import FilePart, ImagePart
    from agent_fsm.custom_table import CustomState, Table
    from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
    from agent_fsm.durable.sqlite import SQLiteStore
    from agent_fsm.errors import (
        AgentFSMError,
        CheckpointError,
        ConfigError,
        ResumeError,
        RunError,
        RunLeased,
    )
    from agent_fsm.hooks import StepHooks
    from agent_fsm.limits import Limits
    from agent_fsm.loop.verify import TerminationBound
    from agent_fsm.pricing import Pricing
    from agent_fsm.run.custom import StepContext
    from agent_fsm.run.engine import Run
    from agent_fsm.state import Approval, RunResult, RunStatus, TraceEntry
    from agent_fsm.table import AgentState, Row, StopReason
    from agent_fsm.tools import Tool, ToolResult, tool

_WHERE: dict[str, str] = {
    "Agent": "agent_fsm.agent",
    "ClearToolResults": "agent_fsm.compaction",
    "ContextPolicy": "agent_fsm.compaction",
    "KeepLastTurns": "agent_fsm.compaction",
    "Summarize": "agent_fsm.compaction",
    "FilePart": "agent_fsm.content",
    "ImagePart": "agent_fsm.content",
    "CheckpointStore": "agent_fsm.durable.checkpoint",
    "MemoryStore": "agent_fsm.durable.checkpoint",
    "SQLiteStore": "agent_fsm.durable.sqlite",
    "AgentFSMError": "agent_fsm.errors",
    "CheckpointError": "agent_fsm.errors",
    "ConfigError": "agent_fsm.errors",
    "ResumeError": "agent_fsm.errors",
    "RunError": "agent_fsm.errors",
    "RunLeased": "agent_fsm.errors",
    "StepHooks": "agent_fsm.hooks",
    "Limits": "agent_fsm.limits",
    "Pricing": "agent_fsm.pricing",
    "TerminationBound": "agent_fsm.loop.verify",
    "StepContext": "agent_fsm.run.custom",
    "Run": "agent_fsm.run.engine",
    "Approval": "agent_fsm.state",
    "RunResult": "agent_fsm.state",
    "RunStatus": "agent_fsm.state",
    "TraceEntry": "agent_fsm.state",
    "AgentState": "agent_fsm.table",
    "StopReason": "agent_fsm.table",
    "Table": "agent_fsm.custom_table",
    "Row": "agent_fsm.table",
    "CustomState": "agent_fsm.custom_table",
    "Tool": "agent_fsm.tools",
    "ToolResult": "agent_fsm.tools",
    "tool": "agent_fsm.tools",
}
"""Where each public name lives. They are imported on first use, so that importing a part of
the package (the pytest plugin, say, which every pytest run of a user loads) does not pay for
all of it."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    # building and running agents
    "Agent",
    "Limits",
    "Pricing",
    "Tool",
    "ToolResult",
    "tool",
    "Run",
    "Approval",
    "StepHooks",
    # images and files
    "ImagePart",
    "FilePart",
    # your own loop
    "Table",
    "Row",
    "CustomState",
    "StepContext",
    # context windows
    "ContextPolicy",
    "KeepLastTurns",
    "ClearToolResults",
    "Summarize",
    # results
    "RunResult",
    "RunStatus",
    "StopReason",
    "AgentState",
    "TraceEntry",
    "TerminationBound",
    # checkpoints
    "CheckpointStore",
    "MemoryStore",
    "SQLiteStore",
    # errors
    "AgentFSMError",
    "ConfigError",
    "RunError",
    "ResumeError",
    "RunLeased",
    "CheckpointError",
]
