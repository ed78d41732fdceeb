"""agent_fsm: LLM tool-calling agents run as an explicit, verifiable finite-state machine.

The public face, grouped. Adapters are imported by path (``agent_fsm.models``) and the test
support from ``agent_fsm.testing``.
"""

from agent_fsm.agent import Agent
from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore, RunSummary
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.errors import (
    AgentFSMError,
    CheckpointError,
    ConfigError,
    ResumeError,
    RunError,
)
from agent_fsm.events import (
    AbortRequested,
    Event,
    FollowUpQueued,
    GuardTripped,
    MessageUpdated,
    ModelFailed,
    ModelRequested,
    ModelResponded,
    RunFinished,
    RunPaused,
    RunResumed,
    RunStarted,
    StateChanged,
    SteeringQueued,
    ToolFinished,
    ToolRetried,
    ToolStarted,
)
from agent_fsm.limits import Limits
from agent_fsm.loop.verify import TerminationBound
from agent_fsm.messages import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)
from agent_fsm.run.engine import Run
from agent_fsm.state import Approval, RunResult, RunState, RunStatus, TraceEntry
from agent_fsm.table import AgentState, StopReason
from agent_fsm.tools.results import ToolResult
from agent_fsm.tools.tool import Tool, tool

__all__ = [
    # running agents
    "Agent",
    "Approval",
    "Limits",
    "Run",
    "Tool",
    "ToolResult",
    "tool",
    # results
    "AgentState",
    "RunResult",
    "RunState",
    "RunStatus",
    "StopReason",
    "TerminationBound",
    "TraceEntry",
    # checkpoints
    "CheckpointStore",
    "MemoryStore",
    "RunSummary",
    "SQLiteStore",
    # transcript
    "AssistantMessage",
    "Message",
    "SystemMessage",
    "ToolCall",
    "ToolMessage",
    "Usage",
    "UserMessage",
    # events
    "Event",
    "AbortRequested",
    "FollowUpQueued",
    "GuardTripped",
    "MessageUpdated",
    "ModelFailed",
    "ModelRequested",
    "ModelResponded",
    "RunFinished",
    "RunPaused",
    "RunResumed",
    "RunStarted",
    "SteeringQueued",
    "StateChanged",
    "ToolFinished",
    "ToolRetried",
    "ToolStarted",
    # errors
    "AgentFSMError",
    "CheckpointError",
    "ConfigError",
    "ResumeError",
    "RunError",
]
