"""Diagrams drawn from the table, run overlays, graphviz output, and JSON Lines trace files."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent_fsm import AgentState, RunResult, StopReason, TraceEntry
from agent_fsm.diagrams import DiagramError, edge_counts, render, to_dot, to_mermaid
from agent_fsm.durable.tracefile import (
    RecordedRun,
    TraceFileError,
    TraceWriter,
    read_run,
    read_trace,
    recorded_runs,
    select_run,
)
from agent_fsm.events import MessageUpdated, RunFinished, RunStarted, StateChanged
from agent_fsm.messages import ReplyDelta
from agent_fsm.table import TABLE, Trigger
from agent_fsm.testing import call, reply
from tests.conftest import Recorder, make_agent

ROOT = Path(__file__).resolve().parent.parent
DIAGRAMS = ROOT / "diagrams"
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="graphviz `dot` is not on PATH")

GOLDEN_MERMAID = """\
stateDiagram-v2
    [*] --> OBSERVE
    OBSERVE --> ERROR : observed #1 [abort_requested] aborted
    OBSERVE --> ERROR : observed #2 [input_guardrail_tripped] guardrail_tripped
    OBSERVE --> COMPACT : observed #3 [prompt_exceeds_window] compact
    OBSERVE --> LAST_ANSWER : observed #4 [last_answer_wanted ∧ prompt_exceeds_budget] last_answer
    OBSERVE --> ERROR : observed #5 [prompt_exceeds_budget] token_budget
    OBSERVE --> ERROR : observed #6 [prompt_exceeds_cost_budget] cost_budget
    OBSERVE --> LAST_ANSWER : observed #7 [last_answer_wanted ∧ no_turns_left] last_answer
    OBSERVE --> ERROR : observed #8 [no_turns_left] max_turns
    OBSERVE --> THINK : observed #9 [else] think
    COMPACT --> ERROR : compacted #1 [abort_requested] aborted
    COMPACT --> LAST_ANSWER : compacted #2 [last_answer_wanted ∧ last_answer_due] last_answer
    COMPACT --> LAST_ANSWER : compacted #3 [last_answer_wanted ∧ no_turns_left] last_answer
    COMPACT --> ERROR : compacted #4 [no_turns_left] max_turns
    COMPACT --> LAST_ANSWER : compacted #5 [last_answer_wanted ∧ budget_exhausted] last_answer
    COMPACT --> ERROR : compacted #6 [budget_exhausted] token_budget
    COMPACT --> ERROR : compacted #7 [cost_budget_spent] cost_budget
    COMPACT --> SUMMARISE : compacted #8 [summary_requested] summarise
    COMPACT --> ERROR : compacted #9 [prompt_exceeds_window] context_window
    COMPACT --> LAST_ANSWER : compacted #10 [last_answer_wanted ∧ prompt_exceeds_budget] last_answer
    COMPACT --> ERROR : compacted #11 [prompt_exceeds_budget] token_budget
    COMPACT --> ERROR : compacted #12 [prompt_exceeds_cost_budget] cost_budget
    COMPACT --> THINK : compacted #13 [else] think
    SUMMARISE --> ERROR : summarised #1 [abort_requested] aborted
    SUMMARISE --> COMPACT : summarised #2 [last_answer_wanted ∧ model_call_failed ∧ time_is_up ∧ prompt_exceeds_window] compact
    SUMMARISE --> LAST_ANSWER : summarised #3 [last_answer_wanted ∧ model_call_failed ∧ time_is_up] last_answer
    SUMMARISE --> ERROR : summarised #4 [model_call_failed ∧ time_is_up] timeout
    SUMMARISE --> ERROR : summarised #5 [model_call_failed ∧ context_overflowed] context_window
    SUMMARISE --> ERROR : summarised #6 [model_call_failed ∧ model_error_is_permanent] model_error
    SUMMARISE --> ERROR : summarised #7 [model_call_failed ∧ no_retries_left] model_error
    SUMMARISE --> COMPACT : summarised #8 [last_answer_wanted ∧ model_call_failed ∧ budget_exhausted ∧ prompt_exceeds_window] compact
    SUMMARISE --> LAST_ANSWER : summarised #9 [last_answer_wanted ∧ model_call_failed ∧ budget_exhausted] last_answer
    SUMMARISE --> ERROR : summarised #10 [model_call_failed ∧ budget_exhausted] token_budget
    SUMMARISE --> ERROR : summarised #11 [model_call_failed ∧ prompt_exceeds_cost_budget] cost_budget
    SUMMARISE --> SUMMARISE : summarised #12 [model_call_failed] retry
    SUMMARISE --> OBSERVE : summarised #13 [else] summarised
    THINK --> ERROR : thought #1 [abort_requested] aborted
    THINK --> COMPACT : thought #2 [last_answer_wanted ∧ model_call_failed ∧ time_is_up ∧ prompt_exceeds_window] compact
    THINK --> LAST_ANSWER : thought #3 [last_answer_wanted ∧ model_call_failed ∧ time_is_up] last_answer
    THINK --> ERROR : thought #4 [model_call_failed ∧ time_is_up] timeout
    THINK --> COMPACT : thought #5 [model_call_failed ∧ context_overflowed ∧ prompt_exceeds_window] compact
    THINK --> ERROR : thought #6 [model_call_failed ∧ context_overflowed] context_window
    THINK --> ERROR : thought #7 [model_call_failed ∧ model_error_is_permanent] model_error
    THINK --> ERROR : thought #8 [model_call_failed ∧ no_retries_left] model_error
    THINK --> COMPACT : thought #9 [last_answer_wanted ∧ model_call_failed ∧ prompt_exceeds_budget ∧ prompt_exceeds_window] compact
    THINK --> LAST_ANSWER : thought #10 [last_answer_wanted ∧ model_call_failed ∧ prompt_exceeds_budget] last_answer
    THINK --> ERROR : thought #11 [model_call_failed ∧ prompt_exceeds_budget] token_budget
    THINK --> ERROR : thought #12 [model_call_failed ∧ prompt_exceeds_cost_budget] cost_budget
    THINK --> COMPACT : thought #13 [model_call_failed ∧ prompt_exceeds_window] compact
    THINK --> THINK : thought #14 [model_call_failed] retry
    THINK --> ERROR : thought #15 [reply_was_filtered] content_filter
    THINK --> ERROR : thought #16 [reply_was_refused] refused
    THINK --> ACT : thought #17 [reply_has_tool_calls] act
    THINK --> ERROR : thought #18 [output_guardrail_tripped] guardrail_tripped
    THINK --> REFLECT : thought #19 [output_rejected] correct
    THINK --> REFLECT : thought #20 [input_waiting] follow_up
    THINK --> DONE : thought #21 [reply_was_truncated] max_tokens
    THINK --> DONE : thought #22 [else] final_answer
    ACT --> REFLECT : acted #1 [else] reflect
    REFLECT --> ERROR : reflected #1 [abort_requested] aborted
    REFLECT --> ERROR : reflected #2 [output_guardrail_tripped] guardrail_tripped
    REFLECT --> DONE : reflected #3 [ask_user_called] ask_user
    REFLECT --> DONE : reflected #4 [finish_task_called] finish_task
    REFLECT --> DONE : reflected #5 [terminal_tool_succeeded] terminal_tool
    REFLECT --> DONE : reflected #6 [approval_pending] approval_required
    REFLECT --> DONE : reflected #7 [sub_agent_paused] sub_agent_paused
    REFLECT --> ERROR : reflected #8 [too_many_errors] consecutive_errors
    REFLECT --> ERROR : reflected #9 [output_retries_exhausted] invalid_output
    REFLECT --> COMPACT : reflected #10 [last_answer_wanted ∧ budget_exhausted ∧ prompt_exceeds_window] compact
    REFLECT --> LAST_ANSWER : reflected #11 [last_answer_wanted ∧ budget_exhausted] last_answer
    REFLECT --> ERROR : reflected #12 [budget_exhausted] token_budget
    REFLECT --> ERROR : reflected #13 [cost_budget_spent] cost_budget
    REFLECT --> COMPACT : reflected #14 [last_answer_wanted ∧ no_turns_left ∧ prompt_exceeds_window] compact
    REFLECT --> LAST_ANSWER : reflected #15 [last_answer_wanted ∧ no_turns_left] last_answer
    REFLECT --> ERROR : reflected #16 [no_turns_left] max_turns
    REFLECT --> COMPACT : reflected #17 [last_answer_wanted ∧ time_is_up ∧ prompt_exceeds_window] compact
    REFLECT --> LAST_ANSWER : reflected #18 [last_answer_wanted ∧ time_is_up] last_answer
    REFLECT --> ERROR : reflected #19 [time_is_up] timeout
    REFLECT --> OBSERVE : reflected #20 [is_looping ∧ nudge_due] nudge
    REFLECT --> OBSERVE : reflected #21 [is_looping ∧ withhold_due] withhold
    REFLECT --> COMPACT : reflected #22 [last_answer_wanted ∧ is_looping ∧ prompt_exceeds_window] compact
    REFLECT --> LAST_ANSWER : reflected #23 [last_answer_wanted ∧ is_looping] last_answer
    REFLECT --> ERROR : reflected #24 [is_looping] loop_detected
    REFLECT --> DONE : reflected #25 [reflector_says_done] reflector_done
    REFLECT --> OBSERVE : reflected #26 [else] continue
    LAST_ANSWER --> ERROR : last_answered #1 [output_guardrail_tripped] guardrail_tripped
    LAST_ANSWER --> ERROR : last_answered #2 [closing_on_token_budget] token_budget
    LAST_ANSWER --> ERROR : last_answered #3 [closing_on_max_turns] max_turns
    LAST_ANSWER --> ERROR : last_answered #4 [closing_on_timeout] timeout
    LAST_ANSWER --> ERROR : last_answered #5 [else] loop_detected
    DONE --> OBSERVE : ⟲ resumed #1 [stopped_to_ask_user ∧ reply_given] answer
    DONE --> ACT : ⟲ resumed #2 [stopped_for_approval ∧ approvals_decided] carry_out
    DONE --> ACT : ⟲ resumed #3 [stopped_for_sub_agent ∧ sub_agent_answered] carry_out
    ERROR --> OBSERVE : ⟲ resumed #1 [stopped_by_interruption] resume
    ERROR --> OBSERVE : ⟲ resumed #2 [stopped_by_transient_model_failure] recover
    ERROR --> OBSERVE : ⟲ resumed #3 [stopped_by_context_window] resume
    OBSERVE --> OBSERVE : ⟲ resumed #1 [stopped_by_crash] restart
    COMPACT --> COMPACT : ⟲ resumed #1 [stopped_by_crash] restart
    SUMMARISE --> SUMMARISE : ⟲ resumed #1 [stopped_by_crash] restart
    THINK --> THINK : ⟲ resumed #1 [stopped_by_crash] restart
    ACT --> ACT : ⟲ resumed #1 [stopped_by_crash] restart
    REFLECT --> REFLECT : ⟲ resumed #1 [stopped_by_crash] restart
    LAST_ANSWER --> LAST_ANSWER : ⟲ resumed #1 [stopped_by_crash] restart
    DONE --> [*]
    ERROR --> [*]
"""


def _two_tool_turns() -> tuple[RunResult, Recorder]:
    """A completed run: two tool turns, then a final answer (3 model calls)."""
    agent, _ = make_agent(
        [reply("", call("echo", text="a")), reply("", call("add", a=1, b=2)), "3, and a."]
    )
    recorder = Recorder()
    agent = agent.subscribe(recorder)
    return agent.run_sync("go"), recorder


def _failed_run() -> RunResult:
    """A run stopped by the turn budget: ERROR max_turns."""
    agent, _ = make_agent([reply("", call("echo", text=str(i))) for i in range(5)], max_turns=2)
    result = agent.run_sync("go")
    assert result.stop_reason is StopReason.MAX_TURNS
    return result


def _line(rows_text: str, prefix: str) -> str:
    (found,) = [line for line in rows_text.splitlines() if line.strip().startswith(prefix)]
    return found.strip()


# -- the plain diagram ---------------------------------------------------------------------


def test_golden_mermaid_for_the_default_machine() -> None:
    assert render(TABLE) == GOLDEN_MERMAID
    assert to_mermaid(TABLE) == GOLDEN_MERMAID
    agent, _ = make_agent([])
    assert agent.diagram() == GOLDEN_MERMAID


def test_every_row_is_one_edge_with_priority_and_guards() -> None:
    dot = render(TABLE, "dot")
    edges = [line for line in dot.splitlines() if " -> " in line and "__start" not in line]
    assert len(edges) == len(TABLE)
    assert 'REFLECT -> OBSERVE [label="reflected #26 [else] continue"];' in dot
    assert "DONE [shape=doublecircle];" in dot
    assert "ERROR [shape=doublecircle];" in dot


def test_unknown_format_is_a_value_error() -> None:
    with pytest.raises(DiagramError, match="unknown diagram format 'gif'"):
        render(TABLE, "gif")


# -- overlays --------------------------------------------------------------------------------


def test_overlay_counts_each_edge_a_scripted_run_took() -> None:
    result, _ = _two_tool_turns()
    counts = edge_counts(TABLE, result.trace)
    taken = {
        (row.source, row.dest, row.label): n for row, n in zip(TABLE, counts, strict=True) if n
    }
    assert taken == {
        (AgentState.OBSERVE, AgentState.THINK, "think"): 3,
        (AgentState.THINK, AgentState.ACT, "act"): 2,
        (AgentState.ACT, AgentState.REFLECT, "reflect"): 2,
        (AgentState.REFLECT, AgentState.OBSERVE, "continue"): 2,
        (AgentState.THINK, AgentState.DONE, "final_answer"): 1,
    }
    assert sum(counts) == len(result.trace)

    mermaid = render(TABLE, "mermaid", run=result)
    assert "    OBSERVE --> THINK : observed #9 [else] think ×3\n" in mermaid
    assert "    THINK --> ACT : thought #17 [reply_has_tool_calls] act ×2\n" in mermaid
    assert "    REFLECT --> OBSERVE : reflected #26 [else] continue ×2\n" in mermaid
    assert "    THINK --> DONE : thought #22 [else] final_answer ×1\n" in mermaid
    # untaken edges keep their plain label
    assert "    THINK --> DONE : thought #21 [reply_was_truncated] max_tokens\n" in mermaid
    assert mermaid.count("×") == 5
    assert "    class OBSERVE, THINK, ACT, REFLECT visited\n" in mermaid
    assert "    class DONE stopped_ok\n" in mermaid
    assert "classDef stopped_ok fill:#dcfce7" in mermaid
    assert f"note right of DONE : stopped﹕ final_answer, 3 turns (run {result.run_id[:12]})" in (
        mermaid
    )
    # the overlay only adds: the plain diagram is a prefix, edge labels aside
    plain_lines = [line.split(" : ")[0] for line in GOLDEN_MERMAID.splitlines()]
    overlay_lines = [line.split(" : ")[0] for line in mermaid.splitlines()]
    assert overlay_lines[: len(plain_lines)] == plain_lines


def test_dot_overlay_colours_and_counts() -> None:
    result, _ = _two_tool_turns()
    dot = to_dot(TABLE, result)
    think = _line(dot, 'OBSERVE -> THINK [label="observed #9')
    assert "think ×3" in think
    assert 'color="#1d4ed8"' in think
    assert "penwidth=3.0" in think
    untaken = _line(dot, 'THINK -> DONE [label="thought #21')
    assert "×" not in untaken
    assert 'color="#9ca3af"' in untaken
    assert 'label="stopped: final_answer, 3 turns' in dot
    assert 'DONE [style="rounded,filled", fillcolor="#dcfce7"' in dot
    assert 'THINK [style="rounded,filled", fillcolor="#dbeafe"' in dot
    assert "ERROR [style=" not in dot


def test_overlay_of_a_failed_run_marks_error() -> None:
    result = _failed_run()
    mermaid = render(TABLE, "mermaid", run=result)
    assert "    class ERROR stopped_error\n" in mermaid
    assert "note right of ERROR : stopped﹕ max_turns, 2 turns" in mermaid
    assert "    REFLECT --> ERROR : reflected #16 [no_turns_left] max_turns ×1\n" in mermaid
    assert "class DONE" not in mermaid
    assert 'ERROR [style="rounded,filled", fillcolor="#fee2e2"' in render(TABLE, "dot", run=result)


def test_agent_diagram_takes_a_run() -> None:
    agent, _ = make_agent([reply("", call("echo", text="a")), "ok"])
    result = agent.run_sync("go")
    assert agent.diagram(run=result) == render(TABLE, "mermaid", run=result)
    assert agent.diagram("dot", run=result) == render(TABLE, "dot", run=result)


def test_a_trace_from_another_table_is_refused() -> None:
    stranger = TraceEntry(
        trigger=Trigger.THOUGHT,
        source=AgentState.THINK,
        dest=AgentState.DONE,
        guards=("made_up",),
        label="final_answer",
        turn=1,
    )
    with pytest.raises(DiagramError, match=r"THINK → DONE \[made_up\].*matches no row"):
        edge_counts(TABLE, [stranger])


# -- DOT validity and graphviz output ---------------------------------------------------------

_DOT_STATEMENT = re.compile(
    r"""^\s{4}(?:
        (?:rankdir|labelloc)=\w+;(?:\ label="(?:[^"\\]|\\.)*";)?
      | (?:node|edge)\ \[[^\]]*\];
      | (?P<node>\w+)\ \[[^\]]*\];
      | (?P<src>\w+)\ ->\ (?P<dst>\w+)(?:\ \[label="(?:[^"\\]|\\.)*"[^\]]*\])?;
    )$""",
    re.VERBOSE,
)


def _check_dot(text: str) -> None:
    """Structure (always) and, where graphviz is available, graphviz's own parser."""
    lines = text.splitlines()
    assert lines[0] == "digraph agent_fsm {"
    assert lines[-1] == "}"
    known = {state.value for state in AgentState} | {"__start"}
    for line in lines[1:-1]:
        match = _DOT_STATEMENT.match(line)
        assert match, f"not a DOT statement this renderer writes: {line!r}"
        for name in ("node", "src", "dst"):
            if match.group(name):
                assert match.group(name) in known, line
    if importlib.util.find_spec("graphviz") is not None and HAS_DOT:
        import graphviz  # type: ignore[import-not-found,unused-ignore]

        assert graphviz.Source(text).pipe(format="svg").startswith(b"<?xml")
    if HAS_DOT:
        done = subprocess.run(["dot", "-Tcanon"], input=text.encode(), capture_output=True)
        assert done.returncode == 0, done.stderr.decode()


def test_dot_is_valid_plain_and_overlaid() -> None:
    _check_dot(render(TABLE, "dot"))
    _check_dot(render(TABLE, "dot", run=_two_tool_turns()[0]))
    _check_dot(render(TABLE, "dot", run=_failed_run()))


@needs_dot
def test_svg_and_png_through_graphviz() -> None:
    result, _ = _two_tool_turns()
    svg = render(TABLE, "svg", run=result)
    assert svg.startswith("<?xml")
    assert "<svg" in svg
    assert "think ×3" in svg
    digest = hashlib.sha256(render(TABLE, "dot", run=result).encode()).hexdigest()
    assert f"drawn from DOT source sha256 {digest}" in svg
    png = render(TABLE, "png")
    assert isinstance(png, bytes)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")


@pytest.mark.parametrize("format", ["svg", "png"])
def test_svg_and_png_without_graphviz_say_how_to_install_it(
    format: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DiagramError, match="`dot` program, which is not on PATH") as info:
        render(TABLE, format)
    assert "apt-get install graphviz" in str(info.value)
    assert "brew install graphviz" in str(info.value)


# -- committed diagrams ------------------------------------------------------------------------


def test_committed_dot_matches_the_table() -> None:
    committed = (DIAGRAMS / "agent.dot").read_text(encoding="utf-8")
    assert committed == render(TABLE, "dot"), "run `make diagrams` and commit the result"


def test_committed_svg_was_drawn_from_the_current_table() -> None:
    """Needs no graphviz: the SVG records the SHA-256 of the DOT text it was drawn from."""
    committed = (DIAGRAMS / "agent.svg").read_text(encoding="utf-8")
    digest = hashlib.sha256(render(TABLE, "dot").encode()).hexdigest()
    assert f"drawn from DOT source sha256 {digest}" in committed, (
        "run `make diagrams` (with graphviz installed) and commit the result"
    )


def _graphviz_version(svg: str) -> str | None:
    found = re.search(r"Generated by graphviz version [^\n]*", svg)
    return found.group() if found else None


@needs_dot
def test_committed_svg_matches_a_fresh_render() -> None:
    committed = (DIAGRAMS / "agent.svg").read_text(encoding="utf-8")
    fresh = render(TABLE, "svg")
    if _graphviz_version(committed) != _graphviz_version(fresh):
        pytest.skip("diagrams/agent.svg was drawn by another graphviz version")
    assert committed == fresh, "run `make diagrams` and commit the result"


# -- trace files -------------------------------------------------------------------------------


def test_trace_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    agent, _ = make_agent(
        [reply("", call("echo", text="a")), reply("", call("add", a=1, b=2)), "3, and a."]
    )
    recorder = Recorder()
    agent = agent.subscribe(recorder)
    agent = agent.subscribe(TraceWriter(path))
    result = agent.run_sync("go")

    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(recorder)
    assert all(line.startswith('{"kind":"') for line in lines)
    events = read_trace(path)
    assert events == list(recorder)

    recorded = read_run(path)
    assert recorded.run_id == result.run_id
    assert recorded.input == "go"
    assert recorded.trace == result.trace
    assert recorded.final_state is result.final_state
    assert recorded.stop_reason is StopReason.FINAL_ANSWER
    assert recorded.status is result.status
    assert recorded.turns == result.turns == 3
    assert recorded.usage == result.usage
    assert recorded.output == result.output
    # the overlay from a file is the overlay from the result
    assert render(TABLE, "mermaid", run=recorded) == render(TABLE, "mermaid", run=result)
    assert render(TABLE, "dot", run=recorded) == render(TABLE, "dot", run=result)


def test_one_writer_records_every_run_of_an_agent(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    agent, _ = make_agent(["one", "two"])
    agent = agent.subscribe(TraceWriter(path))
    first = agent.run_sync("a")
    second = agent.run_sync("b")
    runs = recorded_runs(read_trace(path))
    assert [run.run_id for run in runs] == [first.run_id, second.run_id]
    assert [run.output for run in runs] == ["one", "two"]
    assert read_run(path, second.run_id).input == "b"
    with pytest.raises(TraceFileError, match=r"holds 2 runs .*pick one with run_id=ID"):
        read_run(path)
    with pytest.raises(TraceFileError, match="no run 'nope'"):
        read_run(path, "nope")


def test_writer_truncates_unless_appending(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("old line\n")
    TraceWriter(path, append=True)
    assert path.read_text() == "old line\n"
    with TraceWriter(path):
        pass
    assert path.read_text() == ""
    with pytest.raises(FileNotFoundError):
        TraceWriter(tmp_path / "missing" / "t.jsonl")


def test_writer_skips_streaming_deltas_unless_asked(tmp_path: Path) -> None:
    delta = MessageUpdated(run_id="r", turn=1, delta=ReplyDelta(text="he"))
    start = RunStarted(run_id="r", input="hi")
    quiet = TraceWriter(tmp_path / "q.jsonl")
    loud = TraceWriter(tmp_path / "l.jsonl", include_deltas=True)
    for writer in (quiet, loud):
        writer(start)
        writer(delta)
        writer.close()
    assert read_trace(tmp_path / "q.jsonl") == [start]
    assert read_trace(tmp_path / "l.jsonl") == [start, delta]


def test_bad_lines_are_named(tmp_path: Path) -> None:
    good = '{"kind":"run_started","run_id":"r","input":"hi"}'
    cases = {
        "not json": (f"{good}\n\nnot json\n", r"bad\.jsonl:3: not an agent_fsm event: .*JSON"),
        "bad kind": (f'{good}\n{{"kind":"party"}}\n', r"bad\.jsonl:2: .*tag 'party'"),
        "missing field": (
            '{"kind":"state_changed","run_id":"r"}\n',
            r"bad\.jsonl:1: not an agent_fsm event: state_changed\.source: Field required",
        ),
    }
    for text, pattern in cases.values():
        (tmp_path / "bad.jsonl").write_text(text)
        with pytest.raises(TraceFileError, match=pattern):
            read_trace(tmp_path / "bad.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(TraceFileError, match="no events"):
        read_run(tmp_path / "empty.jsonl")


def test_a_trace_keeps_custom_states_by_name_and_default_ones_as_members() -> None:
    """A trace file read back (its states are JSON text) names the default loop's states and
    triggers by their enum members, so ``is`` comparisons hold, and a custom state's by name."""
    planned = StateChanged(
        run_id="r", source="PLAN", dest="THINK", trigger="planned", guards=(), label="ask",
        turn=0,
    )  # fmt: skip
    (entry,) = recorded_runs([planned])[0].trace
    assert entry.source == "PLAN"
    assert entry.trigger == "planned"
    assert entry.dest is AgentState.THINK


def test_an_unfinished_run_is_drawn_as_unfinished(tmp_path: Path) -> None:
    path = tmp_path / "cut.jsonl"
    result, recorder = _two_tool_turns()
    with TraceWriter(path) as writer:
        for event in recorder[:-6]:  # the process "died" in the second tool turn
            writer(event)
    recorded = read_run(path)
    assert recorded.finished is None
    assert recorded.stop_reason is None
    assert recorded.status is None
    assert recorded.final_state is recorded.trace[-1].dest
    assert len(recorded.trace) < len(result.trace)
    mermaid = render(TABLE, "mermaid", run=recorded)
    assert f"class {recorded.final_state} stopped_open" in mermaid
    assert "run did not finish﹕ last state" in mermaid
    assert not any(isinstance(e, RunFinished) for e in recorded.events)


def test_select_run_needs_a_run() -> None:
    with pytest.raises(TraceFileError, match="x: no events"):
        select_run([], None, "x")
    only = RecordedRun(run_id="r", input=None, trace=(), finished=None, events=())
    assert select_run([only], None, "x") is only
    assert only.final_state is None
    assert only.turns == 0


def test_a_runs_path_alone_is_drawn_with_path_only() -> None:
    result, _ = _two_tool_turns()
    agent, _ = make_agent([])
    mermaid = agent.diagram(run=result, path_only=True)
    edges = [line for line in mermaid.splitlines() if " --> " in line and "[*]" not in line]
    assert edges == [
        "    OBSERVE --> THINK : observed #9 [else] think ×3",
        "    THINK --> ACT : thought #17 [reply_has_tool_calls] act ×2",
        "    THINK --> DONE : thought #22 [else] final_answer ×1",
        "    ACT --> REFLECT : acted #1 [else] reflect ×2",
        "    REFLECT --> OBSERVE : reflected #26 [else] continue ×2",
    ]
    assert "    DONE --> [*]" in mermaid
    assert "ERROR --> [*]" not in mermaid
    dot = render(TABLE, "dot", run=result, path_only=True)
    assert dot.count(" -> ") == len(edges) + 1  # and the start arrow
    with pytest.raises(DiagramError, match="pass the run too"):
        render(TABLE, "mermaid", path_only=True)
