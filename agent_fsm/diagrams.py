"""Diagrams drawn from the same table that runs.

Rendering the rows directly (rather than asking ``transitions`` to draw itself) gives better
labels: each edge shows its trigger, its priority within its state, its guards, and its stop
reason; the fallback row is labelled ``else``; DONE and ERROR are drawn as final.
"""

from __future__ import annotations

from collections.abc import Sequence

from agent_fsm.table import INITIAL_STATE, TERMINAL_STATES, Row

__all__ = ["FORMATS", "render", "to_dot", "to_mermaid"]

FORMATS = ("mermaid", "dot")


def _edge_label(row: Row, priority: int) -> str:
    guards = " ∧ ".join(row.guards) if row.guards else "else"
    return f"{row.trigger} #{priority} [{guards}] {row.label}"


def _prioritised(rows: Sequence[Row]) -> list[tuple[Row, int]]:
    seen: dict[tuple[str, str], int] = {}
    numbered = []
    for row in rows:
        key = (row.trigger, row.source)
        seen[key] = seen.get(key, 0) + 1
        numbered.append((row, seen[key]))
    return numbered


def to_mermaid(rows: Sequence[Row]) -> str:
    """Mermaid ``stateDiagram-v2`` text: renders on GitHub, needs no system binary."""
    lines = ["stateDiagram-v2", f"    [*] --> {INITIAL_STATE}"]
    for row, priority in _prioritised(rows):
        label = _edge_label(row, priority).replace(":", "﹕")
        lines.append(f"    {row.source} --> {row.dest} : {label}")
    lines.extend(f"    {state} --> [*]" for state in sorted(TERMINAL_STATES))
    return "\n".join(lines) + "\n"


def to_dot(rows: Sequence[Row]) -> str:
    """Graphviz DOT text."""
    lines = [
        "digraph agent_fsm {",
        "    rankdir=LR;",
        '    node [shape=box, style=rounded, fontname="Helvetica"];',
        '    edge [fontname="Helvetica", fontsize=10];',
        '    __start [shape=point, label=""];',
        f"    __start -> {INITIAL_STATE};",
    ]
    lines.extend(f"    {state} [shape=doublecircle];" for state in sorted(TERMINAL_STATES))
    for row, priority in _prioritised(rows):
        label = _edge_label(row, priority).replace('"', r"\"")
        lines.append(f'    {row.source} -> {row.dest} [label="{label}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def render(rows: Sequence[Row], format: str = "mermaid") -> str:
    """The diagram of ``rows`` in ``format`` (one of FORMATS)."""
    if format == "mermaid":
        return to_mermaid(rows)
    if format == "dot":
        return to_dot(rows)
    raise ValueError(f"unknown diagram format {format!r}; choose one of {FORMATS}")
