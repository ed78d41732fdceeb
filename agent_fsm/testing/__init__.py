"""The test harness: fake models, run invariants, generated and enumerated misbehaviour,
record and replay. ``docs/testing.md`` walks through it.

    from agent_fsm.testing import ScriptedModel, FunctionModel, call, reply
    from agent_fsm.testing import assert_terminates, check_exhaustively, assert_replays

Everything here works without hypothesis except ``assert_terminates`` and
``agent_fsm.testing.strategies``, which need the ``testing`` extra
(``pip install 'agent-fsm[testing]'``); ``assert_terminates`` is imported on first use.
"""

from typing import TYPE_CHECKING, Any

from agent_fsm.testing.behaviour import (
    Behaviour,
    BehaviourModel,
    FakeClock,
    ToolOutcome,
    tool_double,
    with_tool_doubles,
)
from agent_fsm.testing.exhaustive import ExhaustiveReport, check_exhaustively
from agent_fsm.testing.harness import CaseResult, HarnessFailure, Stage
from agent_fsm.testing.invariants import InvariantViolation, check_invariants
from agent_fsm.testing.models import (
    FunctionModel,
    ScriptedModel,
    ScriptItem,
    call,
    raw_call,
    reply,
)
from agent_fsm.testing.recording import (
    Recording,
    ReplayMismatch,
    assert_replays,
    load_recording,
    record_run,
    replay,
)

if TYPE_CHECKING:
    from agent_fsm.testing.assertions import assert_terminates

__all__ = [
    # fake models
    "FunctionModel",
    "ScriptItem",
    "ScriptedModel",
    "call",
    "raw_call",
    "reply",
    # invariants and the harness
    "InvariantViolation",
    "check_invariants",
    "assert_terminates",
    "HarnessFailure",
    "CaseResult",
    "Stage",
    # what the harness plays
    "Behaviour",
    "BehaviourModel",
    "FakeClock",
    "ToolOutcome",
    "tool_double",
    "with_tool_doubles",
    # exhaustive checking
    "ExhaustiveReport",
    "check_exhaustively",
    # record and replay
    "Recording",
    "ReplayMismatch",
    "assert_replays",
    "load_recording",
    "record_run",
    "replay",
]


def __getattr__(name: str) -> Any:
    """``assert_terminates`` needs hypothesis: import it only when it is asked for."""
    if name == "assert_terminates":
        from agent_fsm.testing.assertions import assert_terminates

        return assert_terminates
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
