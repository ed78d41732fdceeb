"""agent_fsm: LLM tool-calling agents run as an explicit, verifiable finite-state machine.

The names people write every day, grouped. The rest is imported from where it lives: events
from ``agent_fsm.events``, the transcript from ``agent_fsm.messages``, model adapters from
``agent_fsm.models``, trace files and run summaries from ``agent_fsm.durable``, the test
harness from ``agent_fsm.testing``.
"""

from agent_fsm.agent import Agent
from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import AgentFSMError, CheckpointError, ConfigError, ResumeError, RunError
from agent_fsm.limits import Limits
from agent_fsm.loop.verify import TerminationBound
from agent_fsm.run.engine import Run
from agent_fsm.state import Approval, RunResult, RunStatus, TraceEntry
from agent_fsm.table import AgentState, StopReason
from agent_fsm.tools import Tool, ToolResult, tool
from agent_fsm.version import __version__ as __version__

__all__ = [
    # building and running agents
    "Agent",
    "Limits",
    "Tool",
    "ToolResult",
    "tool",
    "Run",
    "Approval",
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
    "CheckpointError",
]
