"""The table, its verification, the termination bound and the guard priority order."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent_fsm import ConfigError, Limits
from agent_fsm.loop import machine as machine_module
from agent_fsm.loop.guards import GUARDS
from agent_fsm.loop.machine import AgentMachine
from agent_fsm.loop.verify import termination_bound, verify_table
from agent_fsm.messages import FinishReason, Usage
from agent_fsm.state import ControlKind, ControlRequest, ModelFailure, RunState
from agent_fsm.table import TABLE, AgentState, Row, StopReason, Trigger, Verb

S, T = AgentState, Trigger


def _rows(state: AgentState) -> list[tuple[tuple[str, ...], str]]:
    """The rows that leave ``state`` within the loop, in priority order (without the row
    that restarts it after a crash: ``test_resume_rows``)."""
    return [(row.guards, row.label) for row in TABLE if row.source is state and not row.resumes]


def test_reflect_priority_order_is_pinned() -> None:
    assert _rows(S.REFLECT) == [
        (("abort_requested",), "aborted"),
        (("output_guardrail_tripped",), "guardrail_tripped"),
        (("ask_user_called",), "ask_user"),
        (("finish_task_called",), "finish_task"),
        (("terminal_tool_succeeded",), "terminal_tool"),
        (("approval_pending",), "approval_required"),
        (("sub_agent_paused",), "sub_agent_paused"),
        (("too_many_errors",), "consecutive_errors"),
        (("output_retries_exhausted",), "invalid_output"),
        (("last_answer_wanted", "budget_exhausted", "prompt_exceeds_window"), "compact"),
        (("last_answer_wanted", "budget_exhausted"), "last_answer"),
        (("budget_exhausted",), "token_budget"),
        (("cost_budget_spent",), "cost_budget"),
        (("last_answer_wanted", "no_turns_left", "prompt_exceeds_window"), "compact"),
        (("last_answer_wanted", "no_turns_left"), "last_answer"),
        (("no_turns_left",), "max_turns"),
        (("last_answer_wanted", "time_is_up", "prompt_exceeds_window"), "compact"),
        (("last_answer_wanted", "time_is_up"), "last_answer"),
        (("time_is_up",), "timeout"),
        (("is_looping", "nudge_due"), "nudge"),
        (("is_looping", "withhold_due"), "withhold"),
        (("last_answer_wanted", "is_looping", "prompt_exceeds_window"), "compact"),
        (("last_answer_wanted", "is_looping"), "last_answer"),
        (("is_looping",), "loop_detected"),
        (("reflector_says_done",), "reflector_done"),
        ((), "continue"),
    ]


def test_last_answer_rows_are_pinned() -> None:
    """Each limit's stop row is softened by a row into LAST_ANSWER, and LAST_ANSWER ends the
    run with the stop that asked for it. It has no abort row: the limit has already fired,
    and an abort during the last answer only cancels that call."""
    assert _rows(S.LAST_ANSWER) == [
        (("output_guardrail_tripped",), "guardrail_tripped"),
        (("closing_on_token_budget",), "token_budget"),
        (("closing_on_max_turns",), "max_turns"),
        (("closing_on_timeout",), "timeout"),
        ((), "loop_detected"),
    ]


def test_think_and_observe_priority_order_is_pinned() -> None:
    last = "last_answer_wanted"
    assert _rows(S.OBSERVE) == [
        (("abort_requested",), "aborted"),
        (("input_guardrail_tripped",), "guardrail_tripped"),
        (("prompt_exceeds_window",), "compact"),
        ((last, "prompt_exceeds_budget"), "last_answer"),
        (("prompt_exceeds_budget",), "token_budget"),
        (("prompt_exceeds_cost_budget",), "cost_budget"),
        ((last, "no_turns_left"), "last_answer"),
        (("no_turns_left",), "max_turns"),
        ((), "think"),
    ]
    window = "prompt_exceeds_window"
    assert _rows(S.COMPACT) == [
        (("abort_requested",), "aborted"),
        ((last, "last_answer_due"), "last_answer"),
        ((last, "no_turns_left"), "last_answer"),
        (("no_turns_left",), "max_turns"),
        ((last, "budget_exhausted"), "last_answer"),
        (("budget_exhausted",), "token_budget"),
        (("cost_budget_spent",), "cost_budget"),
        (("summary_requested",), "summarise"),
        (("prompt_exceeds_window",), "context_window"),
        ((last, "prompt_exceeds_budget"), "last_answer"),
        (("prompt_exceeds_budget",), "token_budget"),
        (("prompt_exceeds_cost_budget",), "cost_budget"),
        ((), "think"),
    ]
    assert _rows(S.SUMMARISE) == [
        (("abort_requested",), "aborted"),
        ((last, "model_call_failed", "time_is_up", window), "compact"),
        ((last, "model_call_failed", "time_is_up"), "last_answer"),
        (("model_call_failed", "time_is_up"), "timeout"),
        (("model_call_failed", "context_overflowed"), "context_window"),
        (("model_call_failed", "model_error_is_permanent"), "model_error"),
        (("model_call_failed", "no_retries_left"), "model_error"),
        ((last, "model_call_failed", "budget_exhausted", window), "compact"),
        ((last, "model_call_failed", "budget_exhausted"), "last_answer"),
        (("model_call_failed", "budget_exhausted"), "token_budget"),
        (("model_call_failed", "prompt_exceeds_cost_budget"), "cost_budget"),
        (("model_call_failed",), "retry"),
        ((), "summarised"),
    ]
    assert _rows(S.THINK) == [
        (("abort_requested",), "aborted"),
        ((last, "model_call_failed", "time_is_up", window), "compact"),
        ((last, "model_call_failed", "time_is_up"), "last_answer"),
        (("model_call_failed", "time_is_up"), "timeout"),
        (("model_call_failed", "context_overflowed", window), "compact"),
        (("model_call_failed", "context_overflowed"), "context_window"),
        (("model_call_failed", "model_error_is_permanent"), "model_error"),
        (("model_call_failed", "no_retries_left"), "model_error"),
        ((last, "model_call_failed", "prompt_exceeds_budget", window), "compact"),
        ((last, "model_call_failed", "prompt_exceeds_budget"), "last_answer"),
        (("model_call_failed", "prompt_exceeds_budget"), "token_budget"),
        (("model_call_failed", "prompt_exceeds_cost_budget"), "cost_budget"),
        (("model_call_failed", "prompt_exceeds_window"), "compact"),
        (("model_call_failed",), "retry"),
        (("reply_was_filtered",), "content_filter"),
        (("reply_was_refused",), "refused"),
        (("reply_has_tool_calls",), "act"),
        (("output_guardrail_tripped",), "guardrail_tripped"),
        (("output_rejected",), "correct"),
        (("input_waiting",), "follow_up"),
        (("reply_was_truncated",), "max_tokens"),
        ((), "final_answer"),
    ]
    assert _rows(S.ACT) == [((), "reflect")]


def test_abort_is_first_everywhere() -> None:
    for state in (S.OBSERVE, S.COMPACT, S.SUMMARISE, S.THINK, S.REFLECT):
        assert _rows(state)[0][0] == ("abort_requested",)


def test_every_table_guard_is_a_named_pure_function() -> None:
    for row in TABLE:
        for name in row.guards:
            assert GUARDS[name].__name__ == name


def test_default_bound() -> None:
    machine = AgentMachine()
    bound = machine.bound(Limits(max_turns=10))
    assert bound.model_calls == 10 + 12  # max_turns + model_retries_per_run
    # THINK, ACT, REFLECT, OBSERVE, COMPACT: a turn that compacts takes five transitions.
    assert bound.transitions == 5 * 22 + 2
    assert bound.formula == "5·(max_turns + model_retries_per_run) + 2"
    assert machine.bound(Limits(max_turns=1, model_retries_per_run=0)).transitions == 7


def _replace(index: int, **changes: object) -> tuple[Row, ...]:
    rows = list(TABLE)
    rows[index] = dataclasses.replace(rows[index], **changes)  # type: ignore[arg-type]
    return tuple(rows)


def _index(source: AgentState, label: str) -> int:
    return next(i for i, r in enumerate(TABLE) if r.source is source and r.label == label)


def test_cycle_without_model_call_is_rejected() -> None:
    # REFLECT's "continue" goes back to ACT: ACT -> REFLECT -> ACT never calls the model.
    rows = _replace(_index(S.REFLECT, "continue"), dest=S.ACT)
    with pytest.raises(ConfigError, match=r"cycle .*ACT.*REFLECT.* makes no model call"):
        verify_table(rows)


def test_ungated_model_call_is_rejected() -> None:
    # Without the max_turns rows of REFLECT and OBSERVE, OBSERVE -> THINK repeats with no turn
    # budget check. Either one alone gates the loop (OBSERVE's also gates a resumed run).
    def without(*sources: AgentState) -> tuple[Row, ...]:
        return tuple(r for r in TABLE if not (r.source in sources and "no_turns_left" in r.guards))

    with pytest.raises(ConfigError, match="no_turns_left"):
        verify_table(without(S.REFLECT, S.OBSERVE))
    verify_table(without(S.REFLECT))
    # A resume enters OBSERVE with every turn possibly used, and so does a written summary
    # (SUMMARISE -> OBSERVE): only OBSERVE's row gates those.
    with pytest.raises(ConfigError, match=r"OBSERVE --observed \[else\]--> THINK"):
        verify_table(without(S.OBSERVE))
    with pytest.raises(ConfigError, match=r"OBSERVE --observed \[else\]--> THINK"):
        verify_table(tuple(r for r in without(S.OBSERVE) if not r.resumes))
    # Without summaries (no way into SUMMARISE, no way out of it but an error), and without
    # resumes, REFLECT's gate alone is enough (a restart after a crash is no new start).
    summary_free = tuple(
        dataclasses.replace(r, dest=S.ERROR, guards=(), outcome=StopReason.MODEL_ERROR)
        if r.source is S.SUMMARISE and r.label == "summarised"
        else r
        for r in without(S.OBSERVE)
        if (not r.resumes or r.restarts) and r.label != "summarise"
    )
    verify_table(summary_free)


def test_retry_without_its_budget_gate_is_rejected() -> None:
    """A retry is no turn, so the turn budget does not bound it: its own budget must."""
    rows = tuple(r for r in TABLE if not (r.source is S.THINK and "no_retries_left" in r.guards))
    with pytest.raises(
        ConfigError,
        match=r"THINK --thought \[model_call_failed\]--> THINK retry\) retries a model call "
        r"without .*'no_retries_left'",
    ):
        verify_table(rows)
    # A gate on the turn budget does not stand in for it.
    gated_by_turns = tuple(
        dataclasses.replace(
            r, guards=("model_call_failed", "no_turns_left"), outcome=StopReason.MODEL_ERROR
        )
        if r.source is S.THINK and "no_retries_left" in r.guards
        else r
        for r in TABLE
    )
    with pytest.raises(ConfigError, match="retries a model call without"):
        verify_table(gated_by_turns)


def test_the_bound_counts_a_last_answer_only_when_the_limits_want_one() -> None:
    machine = AgentMachine()
    without, wanted = (
        machine.bound(Limits(max_turns=10, last_answer=flag)) for flag in (False, True)
    )
    assert (without.model_calls, without.last_answers) == (22, 0)
    assert (wanted.model_calls, wanted.last_answers) == (23, 1)
    # Each resumed activation may write its own last answer (a timed-out run resumes).
    assert (without.calls_with_resumes(2), wanted.calls_with_resumes(2)) == (22, 25)
    # The longest way to a stop, a turn that compacts and then stops, now passes LAST_ANSWER
    # too: one transition more, for the run and for each resumed activation.
    assert (wanted.transitions, wanted.per_resume) == (
        without.transitions + 1,
        without.per_resume + 1,
    )
    assert wanted.formula == "5·(max_turns + model_retries_per_run) + 3"


def test_last_answer_rows_that_break_rule_5_are_rejected() -> None:
    into = _index(S.REFLECT, "last_answer")
    # Not right before the stop row it softens (here there is none).
    rows = tuple(r for i, r in enumerate(TABLE) if i != into + 1)
    with pytest.raises(ConfigError, match="must stand right before the stop row it softens"):
        verify_table(rows)
    # Without last_answer_wanted, the row would fire whatever the limits say.
    rows = list(TABLE)
    rows[into] = dataclasses.replace(rows[into], guards=("no_turns_left", "budget_exhausted"))
    rows[into + 1] = dataclasses.replace(rows[into + 1], guards=("budget_exhausted",))
    with pytest.raises(ConfigError, match="must stand right before"):
        verify_table(tuple(rows))
    # A way out of LAST_ANSWER that does not end the run.
    out = _index(S.LAST_ANSWER, "max_turns")
    with pytest.raises(ConfigError, match="does not end the run"):
        verify_table(_replace(out, dest=S.OBSERVE, outcome=Verb.CONTINUE))
    # A way out that names the wrong stop for its guard.
    with pytest.raises(ConfigError, match="must name the one guard"):
        verify_table(_replace(out, outcome=StopReason.TIMEOUT))
    # A limit's stop row without its rows into LAST_ANSWER (and into COMPACT for it).
    assert TABLE[into + 3].dest is S.COMPACT
    assert TABLE[into + 4].dest is S.LAST_ANSWER
    rows = tuple(r for i, r in enumerate(TABLE) if i not in (into + 3, into + 4))
    with pytest.raises(ConfigError, match="max_turns, which gets a last answer everywhere"):
        verify_table(rows)
    # The row into COMPACT for a last answer without the row into LAST_ANSWER after it.
    rows = tuple(r for i, r in enumerate(TABLE) if i != into + 4)
    with pytest.raises(ConfigError, match="right before that row into LAST_ANSWER"):
        verify_table(rows)
    # The compaction for a last answer goes on into LAST_ANSWER from COMPACT only.
    due = _index(S.COMPACT, "last_answer")
    assert TABLE[due].guards == ("last_answer_wanted", "last_answer_due")
    with pytest.raises(ConfigError, match="'last_answer_due' goes on to LAST_ANSWER"):
        verify_table(_replace(due, guards=("last_answer_due",)))
    # A softened stop that no way out ends the run with.
    rows = tuple(r for i, r in enumerate(TABLE) if i != out)
    with pytest.raises(ConfigError, match="softens the stop max_turns, but no row out"):
        verify_table(rows)


def test_a_table_without_retries_is_bounded_by_max_turns_alone() -> None:
    rows = tuple(
        r
        for r in TABLE
        if not (
            r.source in (S.THINK, S.SUMMARISE)
            and ("no_retries_left" in r.guards or r.label == "retry")
        )
    )
    verify_table(rows)
    bound = termination_bound(rows, Limits(max_turns=10))
    assert (bound.model_calls, bound.formula) == (10, "5·max_turns + 2")


def test_state_that_cannot_terminate_is_rejected() -> None:
    # Every row of the loop into DONE or ERROR goes round the loop instead, and nothing
    # enters LAST_ANSWER (which still ends the run, unreached).
    onward = {
        S.OBSERVE: S.THINK,
        S.COMPACT: S.THINK,
        S.SUMMARISE: S.OBSERVE,
        S.THINK: S.ACT,
        S.ACT: S.REFLECT,
        S.REFLECT: S.OBSERVE,
    }
    rows = tuple(
        dataclasses.replace(r, dest=onward[r.source], outcome=Verb.CONTINUE)
        if r.dest in (S.DONE, S.ERROR) and r.source is not S.LAST_ANSWER
        else r
        for r in TABLE
        if r.dest is not S.LAST_ANSWER and "last_answer_wanted" not in r.guards
    )
    with pytest.raises(ConfigError, match="can never reach DONE or ERROR"):
        verify_table(rows)


def test_unknown_guard_and_missing_else_are_rejected() -> None:
    with pytest.raises(ConfigError, match="unknown guard"):
        verify_table(_replace(0, guards=("no_such_guard",)))
    rows = tuple(r for r in TABLE if r.source is not S.ACT)
    with pytest.raises(ConfigError, match="state ACT has no way out"):
        verify_table(rows)
    with pytest.raises(ConfigError, match="no unguarded last row"):
        verify_table(_replace(_index(S.ACT, "reflect"), guards=("is_looping",)))


def test_control_flow_row_after_continue_is_rejected_as_dead() -> None:
    rows = list(TABLE)
    finish = rows.pop(_index(S.REFLECT, "finish_task"))
    rows.append(finish)
    with pytest.raises(ConfigError, match="can never fire"):
        verify_table(tuple(rows))


def test_terminal_rows_carry_stop_reasons() -> None:
    """Every stop reason is some row's, but ``rejected``, which only a user's own table
    gives (a judge's verdict, say)."""
    reasons = {row.stop_reason for row in TABLE if row.stop_reason is not None}
    assert reasons == set(StopReason) - {StopReason.REJECTED}


def test_a_machine_with_callbacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lean classes move the run and record the row, and run no callbacks: the engine
    does every state's work between triggers. A machine built with callbacks is refused
    rather than silently skipping them."""
    original = machine_module._Machine.__init__

    def with_callback(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **{**kwargs, "after_state_change": [lambda event: None]})

    monkeypatch.setattr(machine_module._Machine, "__init__", with_callback)
    with pytest.raises(ConfigError, match="runs no callbacks"):
        AgentMachine()


_MACHINE = AgentMachine()
_KINDS = st.sampled_from([None, *ControlKind])
_FINISH = st.sampled_from([None, *FinishReason])


@st.composite
def _run_states(draw: st.DrawFn) -> RunState:
    failure = draw(st.sampled_from([None, True, False]))
    kind = draw(_KINDS)
    state = RunState(
        run_id="decide",
        turns=draw(st.integers(0, 4)),
        usage=Usage(input_tokens=draw(st.integers(0, 120))),
        prompt_tokens_estimate=draw(st.integers(0, 60)),
        consecutive_errors=draw(st.integers(0, 3)),
        model_failure=None if failure is None else ModelFailure(message="x", permanent=failure),
        last_tool_calls=draw(st.integers(0, 2)),
        last_finish_reason=draw(_FINISH),
        control=None if kind is None else ControlRequest(kind=kind, text="t", tool_call_id="c"),
        reflector_done=draw(st.booleans()),
        elapsed_s=draw(st.sampled_from([0.0, 5.0])),
        timed_out=draw(st.booleans()),
        abort_reason=draw(st.sampled_from([None, "stop"])),
        pending_input=draw(st.lists(st.just("more"), max_size=1)),
    )
    if draw(st.booleans()):
        state.loop.detected = "a loop"
    return state


@given(_run_states(), st.sampled_from([S.OBSERVE, S.THINK, S.ACT, S.REFLECT]))
def test_the_machine_takes_the_first_row_whose_guards_all_pass(
    state: RunState, source: AgentState
) -> None:
    """The reference is the table read literally: rows of the state in order, every guard
    asked. The machine asks a shared leading guard once per group; it must agree."""
    limits = Limits(max_turns=3, token_budget=100, timeout_s=4.0, max_consecutive_errors=2)
    state.state = source
    expected = next(
        row
        for row in TABLE
        if row.source is source and all(GUARDS[name](state, limits) for name in row.guards)
    )
    assert _MACHINE.fire(_MACHINE.handle(state, limits)) is expected
    assert state.state is expected.dest


def _asking(asked: list[str]) -> dict[str, Callable[[RunState, Limits], bool]]:
    """The built-in guards, each writing its name to ``asked`` when it is read."""

    def counted(name: str) -> Callable[[RunState, Limits], bool]:
        guard = GUARDS[name]

        def ask(state: RunState, limits: Limits) -> bool:
            asked.append(name)
            return guard(state, limits)

        return ask

    return {name: counted(name) for name in GUARDS}


def test_rows_are_tried_in_order_and_each_stops_at_its_first_failing_guard() -> None:
    """Rows are tried in table order; a row stops at its first false guard, and rows in a row
    that begin with the same guard share one reading of it (guards are pure), so a turn whose
    model call succeeded reads ``model_call_failed`` once per run of the failed call's rows,
    not once per row."""
    asked: list[str] = []

    machine = AgentMachine(TABLE, _asking(asked))
    state = RunState(run_id="in-order", state=S.THINK, turns=1, last_tool_calls=1)
    assert machine.fire(machine.handle(state, Limits())).label == "act"
    leading = [row.guards[0] for row in TABLE if row.source is S.THINK and row.guards]
    assert leading.count("model_call_failed") == 9
    # A last-answer row asks first whether a last answer is wanted: no, by default.
    assert asked == [
        "abort_requested",
        "last_answer_wanted",  # two last-answer rows (compact, last answer) for the timeout
        "model_call_failed",  # timeout, overflow (compact, stop), permanent, retries
        "last_answer_wanted",  # the same for the token budget
        "model_call_failed",  # token budget, cost budget, compact, retry
        "reply_was_filtered",
        "reply_was_refused",
        "reply_has_tool_calls",
    ]


def test_rows_that_share_a_first_guard_still_read_their_other_guards_in_order() -> None:
    """When the shared first guard is true, each row of the run reads its own guards in
    turn, and the first row whose guards all pass is taken: a failed call that is
    permanent stops ``model_error``, past the rows for the deadline and the context."""
    asked: list[str] = []

    machine = AgentMachine(TABLE, _asking(asked))
    failure = ModelFailure(message="bad request", permanent=True)
    state = RunState(run_id="failed", state=S.THINK, turns=1, model_failure=failure)
    row = machine.fire(machine.handle(state, Limits()))
    assert row.stop_reason is StopReason.MODEL_ERROR
    assert asked == [
        "abort_requested",
        "last_answer_wanted",
        "model_call_failed",
        "time_is_up",
        "context_overflowed",  # the compact row: overflowed, then the window
        "context_overflowed",  # the context_window stop
        "model_error_is_permanent",
    ]


def test_rows_of_features_an_agent_does_not_use_are_not_tried() -> None:
    """An agent without a last answer, a context window, a reflector, an output type,
    policies or approval tools never tries the rows that read those features: they cannot
    fire for it, and a feature that is off costs nothing per turn. The table, the verifier
    and the bound are unchanged."""
    from agent_fsm import Agent
    from agent_fsm.testing import ScriptedModel

    asked: list[str] = []

    plain = Agent(model=ScriptedModel([]))
    dead = plain.run_config.dead_guards
    assert {
        "last_answer_wanted",
        "prompt_exceeds_window",
        "reflector_says_done",
        "output_rejected",
        "output_retries_exhausted",
        "summary_requested",
        "terminal_tool_succeeded",
        "approval_pending",
        "prompt_exceeds_cost_budget",
        "cost_budget_spent",
        "input_guardrail_tripped",
        "output_guardrail_tripped",
    } <= dead
    assert not {"ask_user_called", "finish_task_called", "no_turns_left"} & dead
    machine = AgentMachine(TABLE, _asking(asked))
    state = RunState(run_id="lean", state=S.REFLECT, turns=1)
    assert machine.fire(machine.handle(state, Limits(), dead)).label == "continue"
    assert not set(asked) & dead
    assert asked == [
        "abort_requested",
        "ask_user_called",
        "finish_task_called",
        "too_many_errors",
        "budget_exhausted",
        "no_turns_left",
        "time_is_up",
        "is_looping",
    ]
    # with every feature on, nothing is left out
    asked.clear()
    state = RunState(run_id="full", state=S.REFLECT, turns=1)
    assert machine.fire(machine.handle(state, Limits())).label == "continue"
    assert "last_answer_wanted" in asked
    assert "reflector_says_done" in asked
