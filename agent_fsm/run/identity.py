"""The agent a run was made with: recorded when the run starts, checked when it resumes.

A checkpointed run can be resumed by any process, and a process builds its own ``Agent``.
Resumed by a different agent (other tools, another prompt, another table), a run goes wrong
quietly: an approved call is answered "Unknown tool" and the approval is used up, nothing
having run. So the run keeps an ``AgentRecord`` (digests of each tool's schema, the system
prompt and the table, and the tools that wait for approval), and ``check_same_agent``
refuses a resume by an agent whose record differs, saying what differs.

Approval rules are part of the run, not of whoever resumes it: ``keep_approvals`` gives a
resumed run an agent whose tools wait for approval wherever the run's did, so a resume that
forgets ``--require-approval`` cannot run the model's next call unapproved. Neither is a
change of the stores: the record is a field of the checkpointed ``RunState``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from agent_fsm.errors import ResumeError
from agent_fsm.messages import ToolSpec
from agent_fsm.run.context import RunConfig
from agent_fsm.state import AgentRecord, RunState
from agent_fsm.table import Row
from agent_fsm.tools.tool import Tool, ToolRegistry

__all__ = ["agent_record", "check_same_agent", "claim", "keep_approvals"]

_APPROVAL_GUARD = "approval_pending"


def _digest(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def agent_record(
    specs: Sequence[ToolSpec], system_prompt: str, rows: Sequence[Row], tools: Sequence[Tool]
) -> AgentRecord:
    """The record of an agent offering ``specs`` (its tools as the model sees them), with
    ``system_prompt`` and a table of ``rows``; ``tools`` say which wait for approval."""
    return AgentRecord(
        tools={spec.name: _digest([spec.description, spec.parameters]) for spec in specs},
        system_prompt=_digest(system_prompt),
        table=_digest(
            [[str(r.trigger), str(r.source), str(r.dest), r.guards, r.label] for r in rows]
        ),
        approval=tuple(item.name for item in tools if item.requires_approval is not False),
    )


def check_same_agent(state: RunState, current: AgentRecord) -> None:
    """Refuse to resume ``state`` with an agent whose record is ``current`` when the run's
    own record (if it has one) says it was made by a different agent.

    Raises:
        ResumeError: naming each difference (tools missing, added or changed; the system
            prompt; the table).
    """
    stored = state.agent
    if stored is None:
        return
    problems: list[str] = []
    missing = sorted(set(stored.tools) - set(current.tools))
    added = sorted(set(current.tools) - set(stored.tools))
    changed = sorted(
        name for name in set(stored.tools) & set(current.tools)
        if stored.tools[name] != current.tools[name]
    )  # fmt: skip
    if missing:
        problems.append(f"it has no tool {', '.join(map(repr, missing))}")
    if added:
        problems.append(f"it has tools the run did not: {', '.join(map(repr, added))}")
    if changed:
        problems.append(f"the description or schema of {', '.join(map(repr, changed))} changed")
    if stored.system_prompt != current.system_prompt:
        problems.append("its system prompt differs")
    if stored.table != current.table:
        problems.append("its table differs")
    if problems:
        raise ResumeError(
            f"run {state.run_id} was made by a different agent: {'; '.join(problems)}. "
            "Resume it with the agent that made it (on the command line: the same --agent, "
            "--system and model options)"
        )


def claim(state: RunState, current: AgentRecord) -> None:
    """The agent whose record is ``current`` takes ``state`` on (a resume, a worker taking
    the next run): a run that has taken no step (queued or started by a producer, which need
    not be the agent that does the work: nothing has been asked or run yet) becomes its run;
    a run that has is checked (``check_same_agent``).

    Raises:
        ResumeError: as ``check_same_agent``.
    """
    if not state.trace:
        state.agent = current
        return
    check_same_agent(state, current)


def keep_approvals(config: RunConfig, state: RunState) -> RunConfig:
    """``config`` for resuming ``state``: each tool the run's record says waits for approval
    waits for it (always, where this agent's tool does not ask), and the approval rows are
    tried. ``config`` itself when nothing is missing."""
    record = state.agent
    if record is None or not record.approval:
        return config
    registry = config.tools
    current = [registry.get(spec.name) for spec in registry.specs]
    tools = [item for item in current if item is not None]
    lacking = {
        item.name for item in tools
        if item.name in record.approval and item.requires_approval is False
    }  # fmt: skip
    if not lacking:
        return config
    kept = [
        dataclasses.replace(item, requires_approval=True) if item.name in lacking else item
        for item in tools
    ]
    return dataclasses.replace(
        config, tools=ToolRegistry(kept), dead_guards=config.dead_guards - {_APPROVAL_GUARD}
    )
