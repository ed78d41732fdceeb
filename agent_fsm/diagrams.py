"""Diagrams drawn from the same table that runs, optionally overlaid with one run.

Rendering the rows directly (rather than asking ``transitions`` to draw itself) gives better
labels: each edge shows its trigger, its priority within its state, its guards, and its stop
reason; the fallback row is labelled ``else``; DONE and ERROR are drawn as final. Resume rows,
which a person's answer takes out of a stop, are dashed (DOT, SVG, PNG) or marked ``⟲``
(mermaid, which cannot dash a single edge).

Formats: ``mermaid`` (``stateDiagram-v2`` text, renders on GitHub, needs nothing) and ``dot``
(Graphviz text) are pure Python; ``html`` is a page that draws the mermaid text in the
browser with the mermaid.js it carries (``agent_fsm/assets``: no network, no graphviz);
``svg`` and ``png`` pipe the DOT text through the graphviz ``dot`` program, which must be on
PATH.

An overlay (``run=`` a ``RunResult`` or a ``tracefile.RecordedRun``) highlights the states the
run visited, labels every edge it took with how many times (``×3``), and marks the state it
stopped in with its stop reason. Trace entries are matched to table rows by (trigger, source,
dest, guards, label), so the count is per row, not per pair of states.
"""

from __future__ import annotations

import hashlib
import html
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.resources import files
from typing import Literal, Protocol, overload

from agent_fsm.errors import DiagramError
from agent_fsm.state import RunState, TraceEntry
from agent_fsm.table import INITIAL_STATE, TERMINAL_STATES, AgentState, Row, StopReason

__all__ = [
    "FORMATS",
    "DiagramError",
    "Format",
    "RunOverlay",
    "StoredRunOverlay",
    "edge_counts",
    "render",
    "to_dot",
    "to_html",
    "to_mermaid",
    "to_png",
    "to_svg",
]

Format = Literal["mermaid", "dot", "html", "svg", "png"]
FORMATS: tuple[Format, ...] = ("mermaid", "dot", "html", "svg", "png")

INSTALL_GRAPHVIZ = (
    "install graphviz (Debian/Ubuntu: `apt-get install graphviz`, Fedora: `dnf install "
    "graphviz`, macOS: `brew install graphviz`, Windows: `winget install graphviz`), or use "
    "format 'mermaid' or 'dot', which need no system program"
)

# Overlay colours: visited (blue), stopped in DONE (green), ERROR (red), unfinished (amber).
_VISITED = ("#dbeafe", "#1d4ed8")
_STOPPED = {"ok": ("#dcfce7", "#15803d"), "error": ("#fee2e2", "#b91c1c")}
_UNFINISHED = ("#fef9c3", "#a16207")
_UNTAKEN = ("#9ca3af", "#6b7280")


class RunOverlay(Protocol):
    """What an overlay reads from a run: ``RunResult`` and ``RecordedRun`` both provide it."""

    @property
    def run_id(self) -> str: ...
    @property
    def trace(self) -> Sequence[TraceEntry]: ...
    @property
    def final_state(self) -> AgentState | str | None: ...
    @property
    def stop_reason(self) -> StopReason | None: ...
    @property
    def turns(self) -> int: ...


@dataclass(frozen=True, slots=True)
class StoredRunOverlay:
    """A checkpointed run as an overlay; it may not have ended (a crashed run)."""

    run_id: str
    trace: Sequence[TraceEntry]
    final_state: AgentState | str | None
    stop_reason: StopReason | None
    turns: int

    @classmethod
    def of(cls, state: RunState, rows: Sequence[Row]) -> StoredRunOverlay:
        """The overlay of a checkpointed ``state`` (from ``CheckpointStore.load``)."""
        trace = [TraceEntry.from_row(rows[i], turn) for i, turn in state.trace]
        ended = state.state in TERMINAL_STATES and bool(trace)
        stop_reason = rows[state.trace[-1][0]].stop_reason if ended else None
        return cls(state.run_id, trace, state.state, stop_reason, state.turns)


RESUME_MARK = "⟲ "
"""Starts the label of a resume row in mermaid, which cannot dash one edge (DOT dashes it)."""


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


def edge_counts(rows: Sequence[Row], trace: Sequence[TraceEntry]) -> list[int]:
    """How many times each row of ``rows`` was taken in ``trace`` (same order as ``rows``).

    Raises:
        DiagramError: when an entry matches no row (the run was made with another table).
    """
    index = {(r.trigger, r.source, r.dest, r.guards, r.label): i for i, r in enumerate(rows)}
    counts = [0] * len(rows)
    for entry in trace:
        key = (entry.trigger, entry.source, entry.dest, tuple(entry.guards), entry.label)
        found = index.get(key)
        if found is None:
            guards = " ∧ ".join(entry.guards) or "else"
            raise DiagramError(
                f"the run's transition {entry.source} → {entry.dest} [{guards}] {entry.label} "
                f"(turn {entry.turn}) matches no row of this table; was it made with another?"
            )
        counts[found] += 1
    return counts


@dataclass(frozen=True, slots=True)
class _Overlay:
    counts: list[int]
    visited: list[AgentState | str]
    """Visited states, in table order of first appearance, the stopping state excluded."""
    stopped: AgentState | str | None
    tone: Literal["ok", "error", "open"]
    caption: str

    @classmethod
    def of(cls, rows: Sequence[Row], run: RunOverlay) -> _Overlay:
        counts = edge_counts(rows, run.trace)
        stopped = run.final_state
        seen = {INITIAL_STATE} | {s for e in run.trace for s in (e.source, e.dest)}
        in_table = (s for r in rows for s in (r.source, r.dest))
        states = list(dict.fromkeys([INITIAL_STATE, *in_table]))
        visited = [s for s in states if s in seen and s != stopped]
        turns = f"{run.turns} turn{'s' if run.turns != 1 else ''}"
        if run.stop_reason is None or stopped not in TERMINAL_STATES:
            tone: Literal["ok", "error", "open"] = "open"
            caption = f"run did not finish: last state {stopped}, {turns}"
        else:
            tone = "error" if stopped is AgentState.ERROR else "ok"
            caption = f"stopped: {run.stop_reason.value}, {turns}"
        return cls(counts, visited, stopped, tone, f"{caption} (run {run.run_id[:12]})")

    def colours(self) -> tuple[str, str]:
        return _UNFINISHED if self.tone == "open" else _STOPPED[self.tone]


def _times(count: int) -> str:
    return f" ×{count}" if count else ""


def _path_only(path_only: bool, overlay: _Overlay | None) -> bool:
    if path_only and overlay is None:
        raise DiagramError("path_only draws a run's path: pass the run too")
    return path_only


def to_mermaid(
    rows: Sequence[Row], run: RunOverlay | None = None, *, path_only: bool = False
) -> str:
    """Mermaid ``stateDiagram-v2`` text: renders on GitHub, needs no system binary.

    With ``run``, taken edges end in ``×N``, visited states get class ``visited``, the state
    the run stopped in gets ``stopped_ok`` / ``stopped_error`` / ``stopped_open`` and a note
    with the stop reason. With ``path_only`` too, only the edges the run took are drawn (each
    keeps its priority number in the whole table): the run's path, not the 80 rows it might
    have taken.
    """
    overlay = _Overlay.of(rows, run) if run is not None else None
    only = _path_only(path_only, overlay)
    lines = ["stateDiagram-v2", f"    [*] --> {INITIAL_STATE}"]
    for i, (row, priority) in enumerate(_prioritised(rows)):
        if only and overlay is not None and not overlay.counts[i]:
            continue
        label = _edge_label(row, priority).replace(":", "﹕")
        if overlay is not None:
            label += _times(overlay.counts[i])
        if row.resumes:
            label = RESUME_MARK + label
        lines.append(f"    {row.source} --> {row.dest} : {label}")
    ends = sorted(TERMINAL_STATES)
    if only and overlay is not None:
        ends = [state for state in ends if state == overlay.stopped]
    lines.extend(f"    {state} --> [*]" for state in ends)
    if overlay is not None:
        fill, stroke = _VISITED
        lines.append(f"    classDef visited fill:{fill},stroke:{stroke},stroke-width:2px")
        fill, stroke = overlay.colours()
        name = f"stopped_{overlay.tone}"
        lines.append(f"    classDef {name} fill:{fill},stroke:{stroke},stroke-width:3px")
        if overlay.visited:
            lines.append(f"    class {', '.join(overlay.visited)} visited")
        if overlay.stopped is not None:
            lines.append(f"    class {overlay.stopped} {name}")
            caption = overlay.caption.replace(":", "﹕")
            lines.append(f"    note right of {overlay.stopped} : {caption}")
    return "\n".join(lines) + "\n"


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', r"\"") + '"'


def to_dot(rows: Sequence[Row], run: RunOverlay | None = None, *, path_only: bool = False) -> str:
    """Graphviz DOT text.

    With ``run``, the caption (stop reason, turns) is the graph label, visited states are
    filled, the stopping state is filled green (DONE) or red (ERROR), taken edges are drawn
    thicker in colour with ``×N``, and edges not taken are grey; with ``path_only`` too,
    edges not taken are left out.
    """
    overlay = _Overlay.of(rows, run) if run is not None else None
    only = _path_only(path_only, overlay)
    lines = [
        "digraph agent_fsm {",
        "    rankdir=LR;",
        '    node [shape=box, style=rounded, fontname="Helvetica"];',
        '    edge [fontname="Helvetica", fontsize=10];',
        '    __start [shape=point, label=""];',
        f"    __start -> {INITIAL_STATE};",
    ]
    lines.extend(f"    {state} [shape=doublecircle];" for state in sorted(TERMINAL_STATES))
    if overlay is not None:
        lines.append(f"    labelloc=t; label={_quote(overlay.caption)};")
        fill, stroke = _VISITED
        for state in overlay.visited:
            lines.append(
                f'    {state} [style="rounded,filled", fillcolor="{fill}", color="{stroke}", '
                "penwidth=2];"
            )
        if overlay.stopped is not None:
            fill, stroke = overlay.colours()
            lines.append(
                f'    {overlay.stopped} [style="rounded,filled", fillcolor="{fill}", '
                f'color="{stroke}", penwidth=3];'
            )
    for i, (row, priority) in enumerate(_prioritised(rows)):
        if only and overlay is not None and not overlay.counts[i]:
            continue
        label = _edge_label(row, priority)
        style = ""
        if overlay is not None:
            count = overlay.counts[i]
            label += _times(count)
            if count:
                width = min(1.5 + 0.5 * count, 6.0)
                style = f', color="{_VISITED[1]}", fontcolor="{_VISITED[1]}", penwidth={width}'
            else:
                style = f', color="{_UNTAKEN[0]}", fontcolor="{_UNTAKEN[1]}"'
        if row.resumes:
            style += ", style=dashed"
        lines.append(f"    {row.source} -> {row.dest} [label={_quote(label)}{style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5rem; }}
pre.mermaid {{ background: none; }}
details {{ margin-top: 1rem; }}
</style>
</head>
<body>
<h1>{title}</h1>
<pre class="mermaid">
{drawn}</pre>
<details><summary>mermaid source</summary><pre>{diagram}</pre></details>
<script>
{script}
</script>
<script>
mermaid.initialize({{ startOnLoad: true, securityLevel: "strict", maxTextSize: 1000000,
  stateDiagram: {{ useMaxWidth: false }} }});
</script>
</body>
</html>
"""


def to_html(
    rows: Sequence[Row],
    run: RunOverlay | None = None,
    *,
    path_only: bool = False,
    title: str = "agent_fsm",
) -> str:
    """A page that draws the diagram in a browser (see ``to_mermaid`` for the overlay and
    ``path_only``): the mermaid text, and mermaid.js inlined from ``agent_fsm/assets``, so
    it needs neither a network nor graphviz. Open the file, or serve it."""
    source = to_mermaid(rows, run, path_only=path_only)
    script = (files("agent_fsm") / "assets" / "mermaid.min.js").read_text(encoding="utf-8")
    # a colon in a label is mermaid's entity #58; here (browsers' fonts may lack the "﹕"
    # the text form uses, which GitHub's renderer draws)
    drawn = html.escape(source.replace("﹕", "#58;"))
    return _PAGE.format(
        title=html.escape(title), drawn=drawn, diagram=html.escape(source), script=script
    )


def _graphviz(dot_text: str, output: Literal["svg", "png"]) -> bytes:
    """``dot -T<output>`` with the DOT text on stdin."""
    binary = shutil.which("dot")
    if binary is None:
        raise DiagramError(
            f"{'an' if output == 'svg' else 'a'} {output.upper()} diagram needs the graphviz "
            "`dot` program, which is not on PATH: " + INSTALL_GRAPHVIZ
        )
    try:
        done = subprocess.run(
            [binary, f"-T{output}"],
            input=dot_text.encode(),
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiagramError(f"graphviz `dot -T{output}` could not run: {exc}") from exc
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()
        raise DiagramError(f"graphviz `dot -T{output}` exited with {done.returncode}: {detail}")
    return done.stdout


def to_svg(rows: Sequence[Row], run: RunOverlay | None = None, *, path_only: bool = False) -> str:
    """SVG text from graphviz (see ``to_dot``); needs the ``dot`` program.

    The SVG carries a comment with the SHA-256 of the DOT text it was drawn from, so a
    committed SVG can be checked against the table without graphviz.

    Raises:
        DiagramError: when ``dot`` is not on PATH (the message says how to install it) or fails.
    """
    source = to_dot(rows, run, path_only=path_only)
    svg = _graphviz(source, "svg").decode()
    digest = hashlib.sha256(source.encode()).hexdigest()
    at = svg.find("<svg")
    return f"{svg[:at]}<!-- agent_fsm: drawn from DOT source sha256 {digest} -->\n{svg[at:]}"


def to_png(rows: Sequence[Row], run: RunOverlay | None = None, *, path_only: bool = False) -> bytes:
    """PNG image bytes from graphviz (see ``to_dot``); needs the ``dot`` program.

    Raises:
        DiagramError: when ``dot`` is not on PATH (the message says how to install it) or fails.
    """
    return _graphviz(to_dot(rows, run, path_only=path_only), "png")


@overload
def render(
    rows: Sequence[Row],
    format: Literal["mermaid", "dot", "html", "svg"] = "mermaid",
    *,
    run: RunOverlay | None = None,
    path_only: bool = False,
) -> str: ...
@overload
def render(
    rows: Sequence[Row],
    format: Literal["png"],
    *,
    run: RunOverlay | None = None,
    path_only: bool = False,
) -> bytes: ...
@overload
def render(
    rows: Sequence[Row],
    format: str,
    *,
    run: RunOverlay | None = None,
    path_only: bool = False,
) -> str | bytes: ...
def render(
    rows: Sequence[Row],
    format: str = "mermaid",
    *,
    run: RunOverlay | None = None,
    path_only: bool = False,
) -> str | bytes:
    """The diagram of ``rows`` in ``format`` (one of FORMATS), overlaid with ``run`` if given
    (only the run's path with ``path_only``).

    Text for every format but ``png``, which is bytes.

    Raises:
        DiagramError: for an unknown format.
        DiagramError: for svg/png without graphviz, or a run that does not fit ``rows``.
    """
    if format == "mermaid":
        return to_mermaid(rows, run, path_only=path_only)
    if format == "dot":
        return to_dot(rows, run, path_only=path_only)
    if format == "html":
        return to_html(rows, run, path_only=path_only)
    if format == "svg":
        return to_svg(rows, run, path_only=path_only)
    if format == "png":
        return to_png(rows, run, path_only=path_only)
    raise DiagramError(f"unknown diagram format {format!r}; choose one of {', '.join(FORMATS)}")
