"""What outlives a process: checkpoint stores (in memory, SQLite), run leases that let several
workers share a store, the tool journal that keeps a side effect from happening twice across
a crash, and JSON Lines trace files. ``PostgresStore`` is imported from
``agent_fsm.durable.postgres`` (it needs the extra ``agent-fsm[postgres]``)."""

from agent_fsm.durable.checkpoint import CheckpointStore, MemoryStore, RunSummary
from agent_fsm.durable.leases import Lease, LeaseStore
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.durable.tracefile import RecordedRun, TraceWriter, read_run, read_trace

__all__ = [
    "CheckpointStore",
    "Lease",
    "LeaseStore",
    "MemoryStore",
    "RecordedRun",
    "RunSummary",
    "SQLiteStore",
    "TraceWriter",
    "read_run",
    "read_trace",
]
