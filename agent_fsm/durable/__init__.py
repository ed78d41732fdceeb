"""What outlives a process: checkpoint stores (in memory, SQLite), run leases that let several
workers share a store, the tool journal that keeps a side effect from happening twice across
a crash, and JSON Lines trace files. ``PostgresStore`` is imported from
``agent_fsm.durable.postgres`` (it needs the extra ``agent-fsm[postgres]``).

A store's interface is split by who calls it (``durable.checkpoint``, ``durable.leases``):
``RunSaver`` (a running run), ``RunOpener`` (starting, reopening, discarding runs),
``RunLister`` (listing them), joined in ``CheckpointStore``; ``LeasedWrites`` and
``RunLeases`` (leased runs), joined in ``LeaseStore``; ``RunQueue`` and ``RunCancels`` (a
fleet's queue of runs and cancels from outside: ``durable.queue``). ``agent_fsm.testing``'s
``CheckpointStoreContract`` checks a store of your own against all of them.
"""

from agent_fsm.durable.checkpoint import (
    CheckpointStore,
    MemoryStore,
    RunLister,
    RunOpener,
    RunSaver,
)
from agent_fsm.durable.encoding import RunSummary
from agent_fsm.durable.leases import Lease, LeasedWrites, LeaseStore, RunLeases
from agent_fsm.durable.queue import RunCancels, RunQueue
from agent_fsm.durable.sqlite import SQLiteStore
from agent_fsm.durable.tracefile import RecordedRun, TraceWriter, read_run, read_trace

__all__ = [
    # stores
    "CheckpointStore",
    "MemoryStore",
    "SQLiteStore",
    "RunSummary",
    # a store's interface, by who calls it
    "RunSaver",
    "RunOpener",
    "RunLister",
    # leases
    "Lease",
    "LeaseStore",
    "LeasedWrites",
    "RunLeases",
    # a fleet's queue, and cancels from outside
    "RunQueue",
    "RunCancels",
    # trace files
    "RecordedRun",
    "TraceWriter",
    "read_run",
    "read_trace",
]
