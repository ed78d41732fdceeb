"""What outlives a process: checkpoint stores (in memory, SQLite), the tool journal that keeps a
side effect from happening twice across a crash, and JSON Lines trace files."""

from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore, RunSummary
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.durable.tracefile import RecordedRun, TraceWriter, read_run, read_trace

__all__ = [
    "CheckpointStore",
    "MemoryStore",
    "RecordedRun",
    "RunSummary",
    "SQLiteStore",
    "TraceWriter",
    "read_run",
    "read_trace",
]
