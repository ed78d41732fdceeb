"""Durable agent runs on DBOS (``pip install 'agent-fsm[dbos]'``): each run a workflow, each
model call and tool call a step, runs started from a queue with concurrency and rate limits,
and a dead worker's runs carried on by a live one.

The only package of agent_fsm that imports ``dbos``; the core never imports it.

- ``DBOSAgent`` (``agent_fsm.dbos.agent``): the runs and their resumes, and the contract
  user code must keep;
- ``StepModel``, the tool stand-ins (``agent_fsm.dbos.steps``): the steps, and the tool
  journal kept inside them;
- ``agent_fsm.dbos.replay``: what makes the engine's clock, deadline and random numbers the
  same on every replay;
- ``agent_fsm.dbos.pausing``: where a paused run is kept, and how ``DBOSAgent.resume``
  continues it (once, however often it is called);
- ``WorkerLiveness`` (``agent_fsm.dbos.recovery``): recovering the runs of a worker that died.
"""

from agent_fsm.dbos.agent import DBOSAgent, RateLimit, RunHandle, RunQueue
from agent_fsm.dbos.recovery import WorkerLiveness
from agent_fsm.dbos.steps import StepModel

__all__ = ["DBOSAgent", "RateLimit", "RunHandle", "RunQueue", "StepModel", "WorkerLiveness"]
