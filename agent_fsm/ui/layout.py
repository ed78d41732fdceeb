"""A run's path drawn as SVG in Python: no graphviz, no script, no network.

Only the states the run visited and the edges it took are drawn, each edge with its guards
and how often it was taken (``diagrams.edge_counts`` matches the trace to the rows). The
layout is an arc diagram, which needs no graph-layout engine and is the same for the same
run every time: the states stand in one line in the table's order (the loop reads left to
right, OBSERVE → THINK → ACT → REFLECT, the terminals last); an edge forward arcs above the
line, an edge back arcs below it, higher the further it reaches, so arcs of different spans
never share a label's place; an edge from a state to itself is a small loop over it.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from agent_fsm.table import INITIAL_STATE, TERMINAL_STATES, AgentState, Row

__all__ = ["PathDrawing", "draw_path", "tone_of"]

_GAP = 190
_BOX_W = 118
_BOX_H = 34
_MARGIN = 70
_STEP = 22
"""How much higher an arc reaches for each state it spans, and for each arc beside it."""


@dataclass(frozen=True, slots=True)
class PathDrawing:
    """What ``draw_path`` draws: an edge per taken row (its index in the table)."""

    svg: str
    edges: tuple[int, ...]
    states: tuple[str, ...]


def _label(row: Row, count: int) -> tuple[str, str]:
    guards = " ∧ ".join(row.guards) if row.guards else "else"
    return f"{row.label} ×{count}", f"[{guards}]"


def _states(rows: Sequence[Row], counts: Sequence[int], stopped: str | None) -> list[str]:
    taken = {s for row, n in zip(rows, counts, strict=True) if n for s in (row.source, row.dest)}
    taken.add(INITIAL_STATE)
    if stopped is not None:
        taken.add(stopped)
    order = list(dict.fromkeys([INITIAL_STATE, *(s for r in rows for s in (r.source, r.dest))]))
    ends = sorted(s for s in order if s in TERMINAL_STATES)
    return [s for s in order if s in taken and s not in TERMINAL_STATES] + [
        s for s in ends if s in taken
    ]


def draw_path(
    rows: Sequence[Row],
    counts: Sequence[int],
    *,
    stopped: str | None,
    tone: str,
    current_row: int | None = None,
    current_state: str | None = None,
) -> PathDrawing:
    """The SVG of the rows taken (``counts[i]`` times row ``i``), the run's last state
    ``stopped`` coloured by ``tone`` (``ok``, ``error``, ``paused``, ``running``), and, for a
    step-through, the row of the chosen step and the state it led to drawn as current."""
    states = _states(rows, counts, stopped)
    x = {state: _MARGIN + i * _GAP for i, state in enumerate(states)}
    taken = [i for i, count in enumerate(counts) if count]
    above: dict[int, int] = {}
    below: dict[int, int] = {}
    loops: dict[str, int] = {}
    arcs: list[str] = []
    labels: list[str] = []
    reach_up, reach_down = 40, 40
    for index in taken:
        row = rows[index]
        x0, x1 = x[str(row.source)], x[str(row.dest)]
        span = abs(x1 - x0) // _GAP
        current = " current" if index == current_row else ""
        resumes = " resume" if row.resumes else ""
        first, second = _label(row, counts[index])
        if x0 == x1:
            level = loops.get(str(row.source), 0)
            loops[str(row.source)] = level + 1
            lift = 44 + level * 26
            top = -_BOX_H // 2
            path = (
                f"M {x0 - 14} {top} C {x0 - 40} {top - lift}, {x0 + 40} {top - lift}, "
                f"{x0 + 14} {top}"
            )
            lx, ly = x0, top - lift * 3 // 4 - 6
            reach_up = max(reach_up, lift + 40)
        else:
            forward = x1 > x0
            side = above if forward else below
            pair = min(x0, x1) * 10_000 + max(x0, x1)  # parallel arcs of one pair stack up
            level = side.get(pair, 0)
            side[pair] = level + 1
            lift = 22 + span * _STEP + level * 28
            edge_y = -_BOX_H // 2 if forward else _BOX_H // 2
            control = edge_y - 2 * lift if forward else edge_y + 2 * lift
            shift = 10 if forward else -10
            path = f"M {x0 + shift} {edge_y} Q {(x0 + x1) // 2} {control} {x1 - shift} {edge_y}"
            lx = (x0 + x1) // 2
            ly = edge_y - lift - 6 if forward else edge_y + lift + 14
            if forward:
                reach_up = max(reach_up, lift + 40)
            else:
                reach_down = max(reach_down, lift + 40)
        arcs.append(
            f'<path class="edge{current}{resumes}" data-row="{index}" d="{path}" '
            'marker-end="url(#arrow)"/>'
        )
        labels.append(
            f'<text class="edge-label{current}" data-row="{index}" x="{lx}" y="{ly}">'
            f'<tspan x="{lx}">{html.escape(first)}</tspan>'
            f'<tspan class="guards" x="{lx}" dy="13">{html.escape(second)}</tspan></text>'
        )
    nodes = []
    for state in states:
        kind = "state"
        if state == stopped:
            kind += f" stopped {tone}"
        if state == current_state:
            kind += " current"
        if state in TERMINAL_STATES:
            kind += " terminal"
        nodes.append(
            f'<g class="{kind}" data-state="{html.escape(state)}">'
            f'<rect x="{x[state] - _BOX_W // 2}" y="{-_BOX_H // 2}" width="{_BOX_W}" '
            f'height="{_BOX_H}" rx="{_BOX_H // 2 if state in TERMINAL_STATES else 8}"/>'
            f'<text x="{x[state]}" y="5">{html.escape(state)}</text></g>'
        )
    width = _MARGIN * 2 + max(len(states) - 1, 0) * _GAP
    height = reach_up + reach_down + _BOX_H
    start = x[INITIAL_STATE] - _BOX_W // 2
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="path" width="{width}" '
        f'height="{height}" viewBox="0 {-reach_up - _BOX_H // 2} {width} {height}" role="img" '
        f'aria-label="the path of this run">'
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z"/>'
        "</marker></defs>"
        f'<path class="start" d="M {start - 34} 0 L {start - 2} 0" marker-end="url(#arrow)"/>'
        f"{''.join(arcs)}{''.join(nodes)}{''.join(labels)}</svg>"
    )
    return PathDrawing(svg=svg, edges=tuple(taken), states=tuple(states))


def tone_of(state: str, stop_paused: bool) -> str:
    """The colour of a run's last state: ``paused``, ``error``, ``ok`` or ``running``."""
    if state not in TERMINAL_STATES:
        return "running"
    if stop_paused:
        return "paused"
    return "error" if state == AgentState.ERROR else "ok"
