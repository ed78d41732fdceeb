"""Durable agent runs on DBOS (``pip install -e '.[dbos]'``): each run a workflow, each
model and tool call journalled (a step when the journal cannot stand for one), runs started
from a queue with concurrency and rate limits,
and a dead worker's runs carried on by a live one.

The only package of agent_fsm that imports ``dbos``; the core never imports it.

- ``DBOSAgent`` (``agent_fsm.dbos.agent``): the runs and their resumes, and the contract
  user code must keep;
- ``StepModel`` (``agent_fsm.dbos.steps``): the model calls, their outcomes kept in the
  journal (``agent_fsm.dbos.model_calls``, ``agent_fsm.dbos.replies``) or by steps; the tool
  stand-ins (``agent_fsm.dbos.tool_calls``): tool calls made without a step or as one, and
  the tool journal kept around them;
- ``agent_fsm.dbos.replay``: what makes the engine's clock, deadline and random numbers the
  same on every replay;
- ``agent_fsm.dbos.pausing``: where a paused run is kept, and how ``DBOSAgent.resume``
  continues it (once, however often it is called);
- ``agent_fsm.dbos.cancelling``: cancelling a run from outside (``DBOSAgent.cancel``), read
  by its steps as they are recorded;
- ``WorkerLiveness`` (``agent_fsm.dbos.liveness``): the lease that tells the fleet a process
  lives, the fleet's clock, and the fence of every run's steps;
- ``agent_fsm.dbos.recovery``: which executors are gone, and recovering their runs;
- ``DBOSWorker`` (``agent_fsm.dbos.worker``): one process of a fleet, launched with its
  connection pool sized and its liveness held from launch;
- ``agent_fsm.dbos.private``: the private DBOS names relied on, in one place.
"""

from agent_fsm.dbos.agent import DBOSAgent, RateLimit, RunHandle, RunQueue
from agent_fsm.dbos.liveness import WorkerLiveness
from agent_fsm.dbos.steps import StepModel
from agent_fsm.dbos.worker import DBOSWorker

__all__ = [
    "DBOSAgent",
    "DBOSWorker",
    "RateLimit",
    "RunHandle",
    "RunQueue",
    "StepModel",
    "WorkerLiveness",
]
