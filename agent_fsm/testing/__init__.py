"""The test harness: fake models, run invariants, generated and enumerated misbehaviour,
record and replay. ``docs/testing.md`` walks through it. And the contracts a checkpoint store
and a model adapter of your own must keep, as pytest suites (``docs/stores.md``, and the
README's "The adapter contract").

    from agent_fsm.testing import ScriptedModel, FunctionModel, call, reply
    from agent_fsm.testing import assert_terminates, check_exhaustively, assert_replays
    from agent_fsm.testing import assert_stateful, agent_state_machine, AgentStateMachine
    from agent_fsm.testing import CheckpointStoreContract
    from agent_fsm.testing import ModelAdapterContract, WireKit, WireReply, WireServer

Everything here works without hypothesis except ``assert_terminates``, the stateful machine
(``assert_stateful``, ``agent_state_machine``, ``AgentStateMachine``) and
``agent_fsm.testing.strategies``, which need the ``testing`` extra
(``pip install -e '.[testing]'``), and the store and adapter contracts, which need
pytest; those names are imported on first use.
"""

import importlib
from typing import TYPE_CHECKING, Any

from agent_fsm.extras import install_hint

if TYPE_CHECKING:
    from agent_fsm.testing.adapter_contract import CONTRACT_KEY, ModelAdapterContract
    from agent_fsm.testing.assertions import assert_terminates
    from agent_fsm.testing.behaviour import (
        Behaviour,
        BehaviourModel,
        FakeClock,
        ToolOutcome,
        UnreadableError,
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
    from agent_fsm.testing.stateful import (
        AgentStateMachine,
        agent_state_machine,
        assert_stateful,
    )
    from agent_fsm.testing.store_contract import CheckpointStoreContract
    from agent_fsm.testing.store_kit import ContractClock, sample_state
    from agent_fsm.testing.wire import SeenRequest, WireKit, WireReply, WireServer

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
    # stateful testing: runs interleaved with steering, aborts, crashes and resumes
    "AgentStateMachine",
    "agent_state_machine",
    "assert_stateful",
    "CaseResult",
    "Stage",
    # what the harness plays
    "Behaviour",
    "BehaviourModel",
    "FakeClock",
    "ToolOutcome",
    "UnreadableError",
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
    # the contract of checkpoint stores
    "CheckpointStoreContract",
    "ContractClock",
    "sample_state",
    # the model-adapter contract: a pytest class an adapter's tests subclass, with its kit
    "CONTRACT_KEY",
    "ModelAdapterContract",
    "SeenRequest",
    "WireKit",
    "WireReply",
    "WireServer",
]


_WHERE: dict[str, str] = {
    "CONTRACT_KEY": "agent_fsm.testing.adapter_contract",
    "ModelAdapterContract": "agent_fsm.testing.adapter_contract",
    "SeenRequest": "agent_fsm.testing.wire",
    "WireKit": "agent_fsm.testing.wire",
    "WireReply": "agent_fsm.testing.wire",
    "WireServer": "agent_fsm.testing.wire",
    "Behaviour": "agent_fsm.testing.behaviour",
    "BehaviourModel": "agent_fsm.testing.behaviour",
    "FakeClock": "agent_fsm.testing.behaviour",
    "ToolOutcome": "agent_fsm.testing.behaviour",
    "UnreadableError": "agent_fsm.testing.behaviour",
    "tool_double": "agent_fsm.testing.behaviour",
    "with_tool_doubles": "agent_fsm.testing.behaviour",
    "ExhaustiveReport": "agent_fsm.testing.exhaustive",
    "check_exhaustively": "agent_fsm.testing.exhaustive",
    "CaseResult": "agent_fsm.testing.harness",
    "HarnessFailure": "agent_fsm.testing.harness",
    "Stage": "agent_fsm.testing.harness",
    "InvariantViolation": "agent_fsm.testing.invariants",
    "check_invariants": "agent_fsm.testing.invariants",
    "FunctionModel": "agent_fsm.testing.models",
    "ScriptedModel": "agent_fsm.testing.models",
    "ScriptItem": "agent_fsm.testing.models",
    "call": "agent_fsm.testing.models",
    "raw_call": "agent_fsm.testing.models",
    "reply": "agent_fsm.testing.models",
    "Recording": "agent_fsm.testing.recording",
    "ReplayMismatch": "agent_fsm.testing.recording",
    "assert_replays": "agent_fsm.testing.recording",
    "load_recording": "agent_fsm.testing.recording",
    "record_run": "agent_fsm.testing.recording",
    "replay": "agent_fsm.testing.recording",
    "assert_terminates": "agent_fsm.testing.assertions",
    "AgentStateMachine": "agent_fsm.testing.stateful",
    "agent_state_machine": "agent_fsm.testing.stateful",
    "assert_stateful": "agent_fsm.testing.stateful",
    "CheckpointStoreContract": "agent_fsm.testing.store_contract",
    "ContractClock": "agent_fsm.testing.store_kit",
    "sample_state": "agent_fsm.testing.store_kit",
}
"""Where each name lives. Everything is imported on first use: the pytest plugin (loaded by
every pytest run where agent_fsm is installed) lives in this package, and the names that need
hypothesis must not be imported where the ``testing`` extra is missing."""


def __getattr__(name: str) -> Any:
    """The names that need hypothesis are imported only when they are asked for."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        imported = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name not in ("hypothesis", "hypothesis_jsonschema", "pytest"):
            raise
        where = (
            "pip install pytest"
            if exc.name == "pytest"
            else f"which comes with the testing extra: {install_hint('testing')}"
        )
        raise ModuleNotFoundError(
            f"agent_fsm.testing.{name} needs {exc.name}, {where}", name=exc.name
        ) from exc
    value = getattr(imported, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
