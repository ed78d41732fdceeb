"""Tables of the tests' own: the default loop with one custom state, visited once per run."""

from __future__ import annotations

from typing import Any

from agent_fsm import CustomState, Limits, Row, Table


def once(name: str, work: Any, *, mark: str, abortable: bool = False) -> Table:
    """The default loop with state ``name`` between OBSERVE and THINK, entered while the
    run's notes lack ``mark`` (the work is expected to set it); its trigger is
    ``name.lower() + "_done"``. With ``abortable``, its first row out ends the run ``aborted``
    when an abort is asked."""
    trigger = f"{name.lower()}_done"
    guard = f"{name.lower()}_wanted"

    def wanted(state: Any, limits: Limits) -> bool:
        return mark not in state.notes

    out = [Row(trigger, name, "ERROR", ("abort_requested",), "aborted")] if abortable else []
    return (
        Table.default()
        .with_states(CustomState(name, trigger=trigger, work=work))
        .with_guards(**{guard: wanted})
        .insert(
            [Row("observed", "OBSERVE", name, (guard,), name.lower())],
            before=("OBSERVE", "think"),
        )
        .insert([*out, Row(trigger, name, "THINK", (), "think")], before=("OBSERVE", "aborted"))
    )
