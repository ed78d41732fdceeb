"""RunState's field declarations hold in the code: every field says how long it lives and who
writes it; the modules that assign a field are the ones it names; a resume resets fields by
their lifetime alone."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from agent_fsm.messages import Usage
from agent_fsm.state import (
    ControlKind,
    ControlRequest,
    Lifetime,
    ModelFailure,
    RunState,
    reopen_fields,
)
from agent_fsm.table import AgentState, StopReason

PACKAGE = Path(__file__).resolve().parent.parent / "agent_fsm"
FIELDS = {item.name: item for item in dataclasses.fields(RunState)}
MUTATORS = {"append", "extend", "pop", "clear", "insert", "remove"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_run_state(node: ast.expr) -> bool:
    """``state``, ``run_state``, ``ctx.state``, ``self._state``, ``handle.run_state``..."""
    if isinstance(node, ast.Name):
        return node.id in {"state", "run_state"}
    if isinstance(node, ast.Attribute):
        return node.attr in {"state", "_state", "run_state"}
    return False


def _written_fields(tree: ast.AST) -> set[str]:
    """RunState fields assigned (``state.f = ...``, ``state.f += ...``) or mutated in place
    (``state.f.append(...)``) in a module."""
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in MUTATORS
        ):
            targets = [node.func.value]
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and target.attr in FIELDS
                and _is_run_state(target.value)
            ):
                found.add(target.attr)
    return found


def test_every_field_declares_its_lifetime_and_writers() -> None:
    for name, item in FIELDS.items():
        assert isinstance(item.metadata.get("lifetime"), Lifetime), name
        assert isinstance(item.metadata.get("writers"), frozenset), name


def test_only_the_declared_modules_write_each_field() -> None:
    written: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if module.startswith("testing") or module == "state":
            continue  # the harness builds corrupted states on purpose; state.py declares
        for name in _written_fields(ast.parse(path.read_text())):
            written.setdefault(name, set()).add(module)
    undeclared = {
        name: sorted(modules - FIELDS[name].metadata["writers"])
        for name, modules in written.items()
        if modules - FIELDS[name].metadata["writers"]
    }
    assert not undeclared, f"fields written by modules state.py does not name: {undeclared}"
    # and the declaration names no module that does not write the field ("" = none)
    unused = {
        name: sorted(item.metadata["writers"] - written.get(name, set()))
        for name, item in FIELDS.items()
        if item.metadata["writers"] - written.get(name, set())
    }
    assert not unused, f"declared writers that never write: {unused}"


def test_a_field_without_a_declaration_is_refused() -> None:
    from agent_fsm.state import _check_declarations

    @dataclasses.dataclass
    class Careless:
        added_later: int = 0

    with pytest.raises(TypeError, match="added_later must be declared"):
        _check_declarations(Careless)


def _stopped() -> RunState:
    state = RunState(run_id="r", state=AgentState.ERROR, turns=3)
    state.usage = Usage(input_tokens=10, output_tokens=5, requests=3)
    state.consecutive_errors = 2
    state.model_failure = ModelFailure(message="503", permanent=False)
    state.control = ControlRequest(kind=ControlKind.ASK_USER, text="q?")
    state.abort_reason, state.output, state.error = "stop", "out", "err"
    state.stop_reason, state.timed_out, state.elapsed_s = StopReason.MODEL_ERROR, True, 9.0
    state.pending_input.append("answer")
    return state


def test_a_resume_resets_stop_and_activation_fields_and_keeps_the_run() -> None:
    state = _stopped()
    reopen_fields(state, stopped=True)
    fresh = RunState(run_id="r")
    for name, item in FIELDS.items():
        if item.metadata["lifetime"] is Lifetime.RUN:
            continue
        assert getattr(state, name) == getattr(fresh, name), name
    assert (state.turns, state.usage.requests, state.pending_input) == (3, 3, ["answer"])


def test_a_crash_resume_resets_only_activation_fields() -> None:
    state = _stopped()
    reopen_fields(state, stopped=False)
    assert (state.timed_out, state.elapsed_s) == (False, 0.0)
    assert (state.consecutive_errors, state.stop_reason) == (2, StopReason.MODEL_ERROR)
