"""Sub-agents (``Agent.as_tool``): a child runs within what its parent has left, its spend is
counted in the parent's, its failure is a tool result, the parent's abort stops it, and the
harness proves that a parent with two children terminates, with the budgets held across the
tree."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_fsm import (
    Agent,
    Approval,
    ConfigError,
    Limits,
    MemoryStore,
    Pricing,
    ResumeError,
    RunLeased,
    SQLiteStore,
    StopReason,
    tool,
)
from agent_fsm.events import (
    ModelResponded,
    RunFinished,
    RunStarted,
    SubAgentStarted,
    ToolFinished,
)
from agent_fsm.messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    ToolMessage,
    ToolStatus,
    UserMessage,
)
from agent_fsm.run import delegation, parenting
from agent_fsm.state import RunResult, RunState, RunStatus
from agent_fsm.testing import (
    Behaviour,
    FunctionModel,
    HarnessFailure,
    ScriptedModel,
    Stage,
    assert_terminates,
    call,
    reply,
)
from agent_fsm.testing.invariants import check_invariants, transcript_problems
from tests.conftest import FAST, Recorder, add, echo

PRICES = {
    "boss": Pricing(input_per_million=1.0, output_per_million=2.0),
    "worker": Pricing(input_per_million=1.0, output_per_million=2.0),
}


def busy(name: str, usage: tuple[int, int] = (10, 2)) -> FunctionModel:
    """A model that calls echo with new text for ever."""
    turns = itertools.count()

    def decide(request: ModelRequest) -> ModelResponse:
        return reply("", call("echo", text=f"{name} {next(turns)}"), usage=usage)

    return FunctionModel(decide, name=name)


def delegating(tool_name: str, usage: tuple[int, int] = (10, 2)) -> FunctionModel:
    """A model that delegates a task for ever."""
    turns = itertools.count()

    def decide(request: ModelRequest) -> ModelResponse:
        return reply("", call(tool_name, task=f"task {next(turns)}"), usage=usage)

    return FunctionModel(decide, name="boss")


def run(agent: Agent, text: str = "go") -> tuple[Recorder, RunResult]:
    recorder = Recorder()
    result = agent.subscribe(recorder).run_sync(text)
    check_invariants(
        result, limits=agent.limits, bound=agent.bound, events=recorder, rows=agent.machine.rows
    )
    return recorder, result


def tool_results(result: RunResult) -> list[ToolMessage]:
    return [m for m in result.messages if isinstance(m, ToolMessage)]


def test_a_child_answers_its_parents_call_and_its_spend_is_the_parents() -> None:
    worker = Agent(
        model=ScriptedModel(
            [reply("", call("echo", text="x"), usage=(10, 2)), reply("found x", usage=(5, 1))],
            name="worker",
        ),
        tools=[echo],
        system_prompt="You research.",
    )
    boss = Agent(
        model=ScriptedModel(
            [reply("", call("research", task="find x"), usage=(20, 4)), "x it is"], name="boss"
        ),
        tools=[worker.as_tool(name="research", description="Researches a question.")],
        limits=Limits(**FAST, prices=PRICES),
    )
    events, result = run(boss)
    assert result.output == "x it is"
    (answer,) = tool_results(result)
    assert answer.content == "found x"
    assert answer.status is ToolStatus.OK
    details: Any = answer.details
    assert details["stop_reason"] == "final_answer"
    assert details["turns"] == 2
    child_id = details["sub_agent_run_id"]
    # the tree's spend is the parent's: two own turns, two of the child's
    assert result.turns == 4
    assert result.usage.requests == 4
    own = [e.usage for e in events if isinstance(e, ModelResponded) and e.run_id != child_id]
    assert sum(u.input_tokens for u in own) + 15 == result.usage.input_tokens
    assert result.cost is not None
    assert details["cost"] == pytest.approx((15 + 2 * 3) / 1e6)
    # the child's events reach the parent's listeners, after a SubAgentStarted
    (started,) = [e for e in events if isinstance(e, SubAgentStarted)]
    assert (started.run_id, started.sub_agent_run_id, started.tool) == (
        result.run_id,
        child_id,
        "research",
    )
    finished = [e.run_id for e in events if isinstance(e, RunFinished)]
    assert finished == [child_id, result.run_id]


def test_a_child_gets_only_the_turns_its_parent_has_left() -> None:
    """The parent may make 5 model calls; after its first, the child gets 4, uses them all,
    and the parent, with none left, stops: 5 model calls in the whole tree."""
    worker_model = busy("worker")
    worker = Agent(model=worker_model, tools=[echo], limits=Limits(**FAST, max_turns=50))
    boss_model = delegating("work")
    boss = Agent(
        model=boss_model,
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST, max_turns=5),
    )
    _, result = run(boss)
    assert result.stop_reason is StopReason.MAX_TURNS
    (answer,) = tool_results(result)
    assert answer.status is ToolStatus.ERROR
    details: Any = answer.details
    assert (details["stop_reason"], details["turns"]) == ("max_turns", 4)
    assert len(boss_model.requests) + len(worker_model.requests) == 5
    assert result.turns == 5


def test_a_child_gets_only_the_tokens_and_money_its_parent_has_left() -> None:
    worker = Agent(model=busy("worker", usage=(300, 100)), tools=[echo])
    boss = Agent(
        model=delegating("work", usage=(300, 100)),
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST, token_budget=2_000, prices=PRICES),
    )
    _, result = run(boss)
    assert result.stop_reason is StopReason.TOKEN_BUDGET
    first: Any = tool_results(result)[0].details
    assert first["stop_reason"] == "token_budget"
    priced = Agent(
        model=delegating("work", usage=(300, 100)),
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST, cost_budget=0.002, prices=PRICES),
    )
    _, result = run(priced)
    assert result.stop_reason is StopReason.COST_BUDGET
    first = tool_results(result)[0].details
    assert first["stop_reason"] == "cost_budget"
    assert result.cost is not None


def test_carve_takes_the_smaller_of_each_budget() -> None:
    own = Limits(max_turns=10, token_budget=1_000, timeout_s=100.0, last_answer=True)
    parent = SimpleNamespace(
        state=RunState(run_id="p", turns=7, retries=11, cost=0.5),
        limits=Limits(max_turns=9, timeout_s=30.0, cost_budget=2.0, prices=PRICES),
        clock=lambda: 50.0,
        started_at=40.0,
        finished_children=(),
    )
    parent.state.usage = parent.state.usage.model_copy(update={"input_tokens": 150})
    carved = delegation.carve(own, parent).limits  # type: ignore[arg-type]
    assert carved is not None
    assert carved.max_turns == 1  # 2 left, one kept for the last answer
    assert carved.last_answer
    assert carved.token_budget == 1_000
    assert carved.model_retries_per_run == 1
    assert carved.timeout_s == pytest.approx(20.0)
    assert carved.cost_budget == pytest.approx(1.5)
    assert dict(carved.prices) == PRICES
    parent.state.turns = 9
    assert delegation.carve(own, parent).why_not == "no turns"  # type: ignore[arg-type]


def test_a_child_is_not_started_when_its_parent_has_nothing_left() -> None:
    worker_model = busy("worker")
    worker = Agent(model=worker_model, tools=[echo])
    boss = Agent(
        model=ScriptedModel([reply("", call("work", task="a")), "done"], name="boss"),
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST, max_turns=1, last_answer=True),
    )
    _, result = run(boss)
    (answer,) = tool_results(result)
    assert answer.status is ToolStatus.ERROR
    assert "was not started: the run has no turns left" in answer.content
    assert worker_model.requests == []


def test_the_parents_abort_aborts_the_child() -> None:
    entered = asyncio.Event()
    release = asyncio.Event()

    @tool
    async def wait_here() -> str:
        """Wait."""
        entered.set()
        await release.wait()
        return "released"

    worker = Agent(
        model=ScriptedModel([reply("", call("wait_here")), "never"], name="worker"),
        tools=[wait_here],
    )
    boss = Agent(
        model=ScriptedModel([reply("", call("work", task="a")), "never"], name="boss"),
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST),
    )
    recorder = Recorder()

    async def main() -> RunResult:
        parent = boss.start("go")
        parent.subscribe(recorder)
        running = asyncio.ensure_future(parent.run())
        await entered.wait()
        parent.abort("stop everything")
        return await running

    result = asyncio.run(main())
    check_invariants(result, limits=boss.limits, bound=boss.bound, events=recorder)
    assert result.stop_reason is StopReason.ABORTED
    ends = {e.run_id: e.stop_reason for e in recorder if isinstance(e, RunFinished)}
    (child_id,) = [e.sub_agent_run_id for e in recorder if isinstance(e, SubAgentStarted)]
    assert ends == {child_id: StopReason.ABORTED, result.run_id: StopReason.ABORTED}
    (answer,) = tool_results(result)
    assert answer.status is not ToolStatus.OK
    # the child ended before the parent's call was answered
    order = [
        (e.kind, e.run_id)
        for e in recorder
        if isinstance(e, RunFinished) or (isinstance(e, ToolFinished) and e.name == "work")
    ]
    assert order[0] == ("run_finished", child_id)


def test_a_stream_goes_on_past_a_childs_run_finished() -> None:
    worker = Agent(model=ScriptedModel(["done here"], name="worker"))
    boss = Agent(
        model=ScriptedModel([reply("", call("work", task="a")), "all done"], name="boss"),
        tools=[worker.as_tool(name="work", description="Works.")],
    )

    async def main() -> list[Any]:
        return [event async for event in boss.stream("go")]

    events = asyncio.run(main())
    assert isinstance(events[-1], RunFinished)
    assert events[-1].output == "all done"


def test_an_agent_reachable_from_itself_is_refused() -> None:
    first = Agent(model=ScriptedModel([], name="worker"))
    second = Agent(
        model=ScriptedModel([], name="worker"),
        tools=[first.as_tool(name="first", description="First.")],
    )
    # A frozen agent cannot be built around itself; a cycle needs a mutation (or a tool that
    # looks its agent up late), which the check refuses all the same.
    object.__setattr__(first._config.tools, "_tools", {"second": second.as_tool(
        name="second", description="Second.")})  # fmt: skip
    with pytest.raises(ConfigError, match="unbounded recursion"):
        Agent(model=ScriptedModel([]), tools=[first.as_tool(name="top", description="Top.")])


def test_prices_must_cover_every_sub_agents_model() -> None:
    worker = Agent(model=ScriptedModel([], name="unpriced"))
    with pytest.raises(ConfigError, match=r"sub-agent work: .* not its model 'unpriced'"):
        Agent(
            model=ScriptedModel([], name="boss"),
            tools=[worker.as_tool(name="work", description="Works.")],
            limits=Limits(prices=PRICES),
        )
    with pytest.raises(ConfigError, match="needs a description"):
        worker.as_tool(name="work", description=" ")


def test_the_bound_composes() -> None:
    alpha = Agent(model=ScriptedModel([]), tools=[echo], limits=Limits(max_turns=3))
    beta = Agent(model=ScriptedModel([]), tools=[add], limits=Limits(max_turns=4))
    boss = Agent(
        model=ScriptedModel([]),
        tools=[
            alpha.as_tool(name="alpha", description="A."),
            beta.as_tool(name="beta", description="B."),
        ],
        limits=Limits(max_turns=5),
    )
    bound = boss.bound
    plain = Agent(model=ScriptedModel([]), limits=Limits(max_turns=5)).bound
    assert bound.nested == (("alpha", alpha.bound), ("beta", beta.bound))
    assert bound.transitions == plain.transitions
    assert bound.model_calls == plain.model_calls  # children's calls are carved from these
    widest = max(alpha.bound.tree_transitions, beta.bound.tree_transitions)
    assert bound.tree_transitions == bound.transitions + 5 * widest
    assert alpha.bound.tree_transitions == alpha.bound.transitions


def _supervisor() -> Agent:
    prices = {"m": Pricing(input_per_million=100.0, output_per_million=400.0)}
    alpha = Agent(model=ScriptedModel([], name="m"), tools=[echo], limits=Limits(max_turns=4))
    beta = Agent(
        model=ScriptedModel([], name="m"),
        tools=[add],
        limits=Limits(max_turns=5, last_answer=True),
    )
    return Agent(
        model=ScriptedModel([], name="m"),
        tools=[
            alpha.as_tool(name="alpha", description="Researches."),
            beta.as_handoff(name="beta", description="Takes over the conversation."),
        ],
        limits=Limits(max_turns=6, token_budget=20_000, cost_budget=0.2, prices=prices),
    )


def test_a_parent_with_two_children_terminates_whatever_the_models_do() -> None:
    """The harness plays generated behaviours through the parent and both children (one
    script, shared; one child is a sub-agent, the other a handoff): every run ends within
    its bound, and the tree's turns, tokens and money stay within the parent's limits (its
    invariants count the children's spend)."""
    assert_terminates(_supervisor(), max_examples=300)


def test_the_harness_catches_a_child_given_its_parents_full_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seeded bug: the child runs with the parent's limits, not with what is left."""

    def full_budget(own: Limits, parent: Any) -> delegation.LimitsLeft:
        return delegation.LimitsLeft(limits=own if parent is None else parent.limits)

    monkeypatch.setattr(delegation, "carve", full_budget)
    with pytest.raises(HarnessFailure, match=r"exceed max_turns|budget"):
        assert_terminates(_supervisor(), max_examples=300)


def test_a_child_that_fails_answers_with_its_stop_reason() -> None:
    worker = Agent(
        model=ScriptedModel([RuntimeError("adapter bug")], name="worker"),
        limits=Limits(**FAST),
    )
    boss = Agent(
        model=ScriptedModel([reply("", call("work", task="a")), "coped"], name="boss"),
        tools=[worker.as_tool(name="work", description="Works.")],
    )
    _, result = run(boss)
    assert result.status is RunStatus.COMPLETED
    (answer,) = tool_results(result)
    assert answer.status is ToolStatus.ERROR
    assert answer.content.startswith("The sub-agent work stopped without finishing: model_error")
    details: Any = answer.details
    assert (details["status"], details["stop_reason"]) == ("failed", "model_error")


def test_events_carry_the_path_of_nested_runs() -> None:
    """A grandchild's events reach the top run's listeners; its RunStarted carries the ids
    of the runs above it, outermost first."""
    leaf = Agent(model=ScriptedModel(["leaf done"], name="worker"))
    middle = Agent(
        model=ScriptedModel([reply("", call("leaf", task="a")), "middle done"], name="worker"),
        tools=[leaf.as_tool(name="leaf", description="Leaf.")],
    )
    top = Agent(
        model=ScriptedModel([reply("", call("middle", task="b")), "top done"], name="boss"),
        tools=[middle.as_tool(name="middle", description="Middle.")],
        limits=Limits(**FAST),
    )
    events, result = run(top)
    starts = {e.run_id: e.path for e in events if isinstance(e, RunStarted)}
    assert len(starts) == 3
    (middle_id,) = [run_id for run_id, path in starts.items() if path == (result.run_id,)]
    (leaf_id,) = [run_id for run_id, path in starts.items() if path == (result.run_id, middle_id)]
    assert starts[result.run_id] == ()
    assert result.turns == 5  # two of its own, the middle's two and the leaf's one
    assert top.bound.nested[0][1].nested[0][0] == "leaf"
    linked = [
        (e.run_id, e.sub_agent_run_id, e.path) for e in events if isinstance(e, SubAgentStarted)
    ]
    assert linked == [(result.run_id, middle_id, ()), (middle_id, leaf_id, (result.run_id,))]


def test_a_handoff_takes_the_conversation_over_and_its_answer_ends_the_run() -> None:
    refunds_model = ScriptedModel(["Your refund of order 42 is on its way."], name="worker")
    refunds = Agent(model=refunds_model, system_prompt="You handle refunds.")
    triage_model = ScriptedModel(
        [reply("", call("refunds", note="order 42, damaged")), "never"], name="boss"
    )
    triage = Agent(
        model=triage_model,
        system_prompt="You route questions.",
        tools=[refunds.as_handoff(name="refunds", description="Refund questions.")],
        limits=Limits(**FAST),
    )
    _, result = run(triage, "My order 42 arrived broken, I want my money back.")
    assert result.stop_reason is StopReason.TERMINAL_TOOL
    assert result.output == "Your refund of order 42 is on its way."
    assert len(triage_model.requests) == 1
    seen = refunds_model.requests[0].messages
    assert [m.role for m in seen] == ["system", "user", "user"]
    assert seen[0].content == "You handle refunds."
    assert seen[1].content == "My order 42 arrived broken, I want my money back."
    assert "order 42, damaged" in seen[2].content
    assert result.turns == 2


def test_a_failed_handoff_goes_back_to_the_model() -> None:
    broken = Agent(model=ScriptedModel([RuntimeError("down")], name="worker"))
    triage = Agent(
        model=ScriptedModel([reply("", call("refunds")), "I will answer myself."], name="boss"),
        tools=[broken.as_handoff(name="refunds", description="Refund questions.")],
        limits=Limits(**FAST),
    )
    _, result = run(triage)
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "I will answer myself.")
    (answer,) = tool_results(result)
    assert answer.status is ToolStatus.ERROR


def test_a_crash_during_a_sub_agent_call_never_runs_it_twice(tmp_path: Path) -> None:
    """The parent's task is cancelled from outside while its child works, as a dying driver
    leaves it (the call is journaled as started, then answered "cancelled"); reopened from
    its store by a new process's agent, the parent answers the call from its journal, and
    the child's side effect does not happen again."""
    effects: list[str] = []
    entered = asyncio.Event()

    @tool
    async def charge_card(amount: int) -> str:
        """Charge the card (not idempotent)."""
        effects.append(f"charged {amount}")
        entered.set()
        await asyncio.sleep(3600)
        return "charged"

    def build(*script: ModelResponse | str) -> Agent:
        worker = Agent(
            model=ScriptedModel([reply("", call("charge_card", amount=5)), "ok"], name="worker"),
            tools=[charge_card],
        )
        return Agent(
            model=ScriptedModel(list(script), name="boss"),
            tools=[worker.as_tool(name="pay", description="Pays.")],
            store=SQLiteStore(tmp_path / "runs.db"),
            limits=Limits(**FAST),
        )

    async def crash() -> None:
        started = build(reply("", call("pay", task="charge 5"))).start("pay 5", run_id="crashy")
        task = asyncio.ensure_future(started.run())
        await entered.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(crash())
    resumed = build("Could not tell whether it paid; not trying again.")
    result = resumed.resume_sync("crashy")
    check_invariants(result, limits=resumed.limits, bound=resumed.bound)
    assert effects == ["charged 5"]
    (answer,) = tool_results(result)
    assert answer.status is ToolStatus.ERROR
    details: Any = answer.details
    assert details["runtime"]["replayed"] is True
    assert result.stop_reason is StopReason.FINAL_ANSWER


def test_the_harness_checks_each_sub_agents_run_under_its_carved_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seeded bug: the child's run reports more turns than its carve allowed (while its
    parent counts what it really spent, so the parent's counts hold): the harness's check
    of the child's own run, under its carved limits, finds it."""
    stage = Stage(_supervisor())
    behaviour = Behaviour(
        steps=(reply("", call("alpha", task="x")), reply("", call("echo", text="a")), "ok", "done"),
        cycle=False,
    )
    assert stage.play(behaviour).violation is None

    def inflate(delegate: Any, parent: Any, child: RunResult, config: Any) -> None:
        if parent is not None:  # the parent counts what the child really spent
            parent.finished_children += (child,)
        delegate.observer(child.model_copy(update={"turns": child.turns + 50}), config)

    monkeypatch.setattr(delegation, "_ended", inflate)
    violation = stage.play(behaviour).violation
    assert violation is not None
    assert "a sub-agent's run broke its invariants" in violation
    assert "turns exceed max_turns" in violation


def _asking_tree(
    store: Any = None, *, resumed: bool = False
) -> tuple[Agent, ScriptedModel, ScriptedModel]:
    """A boss whose sub-agent asks the user a question, then answers with what it heard
    (``resumed``: the models of a new process, whose first replies were given already)."""
    first = 1 if resumed else 0
    worker_model = ScriptedModel(
        [reply("", call("ask_user", question="Which city?"), usage=(10, 2)), "Sunny in Paris"][
            first:
        ],
        name="worker",
    )
    worker = Agent(model=worker_model)
    boss_model = ScriptedModel(
        [reply("", call("work", task="weather"), usage=(20, 4)), "Done: sunny"][first:],
        name="boss",
    )
    boss = Agent(
        model=boss_model,
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST, prices=PRICES),
        store=store,
    )
    return boss, boss_model, worker_model


def test_a_child_that_asks_the_user_pauses_the_whole_tree_and_resumes_with_the_answer() -> None:
    """The child stops to ask; its parent stops too, showing the child's question, with a
    valid transcript (the sub-agent call answered, as an approval's call is). The user
    answers the parent; the child goes on with the answer, and its result comes to the
    parent's model in the next user message. The spend of the tree is counted once."""
    boss, boss_model, worker_model = _asking_tree()
    recorder = Recorder()
    boss = boss.subscribe(recorder)
    paused = boss.run_sync("go")
    check_invariants(paused, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    assert paused.status is RunStatus.NEEDS_INPUT
    assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
    pending = paused.pending
    assert pending is not None
    assert pending.sub_agent is not None
    assert (pending.kind.value, pending.text) == ("sub_agent", "Which city?")
    assert (pending.sub_agent.tool, pending.sub_agent.asks.value) == ("work", "ask_user")
    (answer,) = tool_results(paused)
    assert "waits for the user (Which city?)" in answer.content
    child_id = pending.sub_agent.run_id
    assert paused.turns == 2  # its own call and the child's
    assert paused.cost == pytest.approx((20 + 2 * 4 + 10 + 2 * 2) / 1e6)
    with pytest.raises(ResumeError, match="asked the user 'Which city\\?'"):
        boss.resume_sync(paused.run_id)
    with pytest.raises(ResumeError, match="not approvals"):
        boss.resume_sync(paused.run_id, approvals=True, pause=pending.pause)
    recorder.clear()
    done = boss.resume_sync(paused.run_id, "Paris")
    check_invariants(done, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    assert (done.status, done.output) == (RunStatus.COMPLETED, "Done: sunny")
    assert "Paris" in str(worker_model.requests[-1].messages[-1])
    told = boss_model.requests[-1].messages[-1]
    assert "Sunny in Paris" in str(told)
    assert "which waited for the user" in str(told)
    assert done.turns == 2 + 1 + 1  # the child's second turn and the boss's answer
    assert done.usage.requests == len(boss_model.requests) + len(worker_model.requests)
    finished = [e.run_id for e in recorder if isinstance(e, RunFinished)]
    assert finished == [child_id, done.run_id]


def test_approvals_inside_a_child_pause_the_tree_and_name_their_pause() -> None:
    """The child's call needs approval: the parent's pending request lists it; the user
    approves it on the parent run (each call by id, or all at once naming the pause); it
    runs once, in the child."""
    booked: list[str] = []

    @tool(requires_approval=True)
    def book(city: str) -> str:
        """Book a trip."""
        booked.append(city)
        return f"booked {city}"

    def tree() -> tuple[Agent, ScriptedModel]:
        worker = Agent(
            model=ScriptedModel([reply("", call("book", city="Paris")), "Booked."], name="w"),
            tools=[book],
        )
        boss_model = ScriptedModel([reply("", call("travel", task="book Paris")), "All set."])
        boss = Agent(
            model=boss_model,
            tools=[worker.as_tool(name="travel", description="Books trips.")],
            limits=Limits(**FAST),
        )
        return boss, boss_model

    for blanket in (False, True):
        booked.clear()
        boss, boss_model = tree()
        paused = boss.run_sync("go")
        check_invariants(paused, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
        pending = paused.pending
        assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
        assert pending is not None
        assert pending.sub_agent is not None
        assert pending.sub_agent.asks.value == "approval"
        (waiting,) = pending.pending_calls
        assert waiting.name == "book"
        assert booked == []
        with pytest.raises(ResumeError, match="waits for approvals, not a reply"):
            boss.resume_sync(paused.run_id, "yes")
        if blanket:
            with pytest.raises(ResumeError, match="must name the pause"):
                boss.resume_sync(paused.run_id, approvals=True)
            done = boss.resume_sync(paused.run_id, approvals=True, pause=pending.pause)
        else:
            done = boss.resume_sync(paused.run_id, approvals={waiting.id: True})
        check_invariants(done, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
        assert (done.status, done.output) == (RunStatus.COMPLETED, "All set.")
        assert "Booked." in str(boss_model.requests[-1].messages[-1])
        assert booked == ["Paris"]


def test_a_paused_tree_resumes_from_its_store_in_a_new_agent(tmp_path: Path) -> None:
    """With a store, the child's run is checkpointed in it under its own id, linked to the
    parent's call; a new agent (a new process) answers the parent, and the child goes on
    from its checkpoint."""
    path = tmp_path / "runs.db"
    boss, _, _ = _asking_tree(SQLiteStore(path))
    _, paused = run(boss)
    pending = paused.pending
    assert pending is not None
    assert pending.sub_agent is not None
    (call_message,) = tool_results(paused)
    child_id = pending.sub_agent.run_id
    assert child_id == delegation.child_run_id(paused.run_id, 1, call_message.tool_call_id)
    stored = SQLiteStore(path).load(child_id)
    assert stored.parent is not None
    assert (stored.parent.run_id, stored.parent.tool_call_id, stored.parent.tool) == (
        paused.run_id,
        call_message.tool_call_id,
        "work",
    )
    assert stored.stop_reason is StopReason.ASK_USER
    later, _, worker_model = _asking_tree(SQLiteStore(path), resumed=True)
    done = later.resume_sync(paused.run_id, "Paris")
    assert (done.status, done.output) == (RunStatus.COMPLETED, "Done: sunny")
    assert len(worker_model.requests) == 1  # the child went on, it did not start again
    child = SQLiteStore(path).load(child_id)
    assert child.stop_reason is StopReason.FINAL_ANSWER
    assert [m.role for m in child.messages].count("user") == 2  # the task and "Paris"


def test_a_child_answered_from_the_journal_after_a_crash_still_counts() -> None:
    """The parent dies after its child finished but before the step did (another call of
    the same reply hangs): the redone step answers both calls from the journal, running
    neither again, and counts what the child spent, which the lost process had counted.
    (Caught a bug: the child's spend was counted mid-step, which moved the turn count that
    keys the journal, so the call after it ran twice.)"""
    worker_model = ScriptedModel([reply("", call("echo", text="a")), "paid"], name="worker")
    entered = asyncio.Event()

    hung: list[bool] = []

    @tool
    async def hang() -> str:
        """Hang (not idempotent: it must not run again)."""
        hung.append(True)
        entered.set()
        await asyncio.sleep(3600)
        return "never"

    store = MemoryStore()

    def build(*script: ModelResponse | str) -> Agent:
        worker = Agent(model=worker_model, tools=[echo])
        return Agent(
            model=ScriptedModel(list(script), name="boss"),
            tools=[worker.as_tool(name="pay", description="Pays."), hang],
            store=store,
            limits=Limits(**FAST),
        )

    async def crash() -> None:
        first = build(reply("", call("pay", task="pay"), call("hang")))
        started = first.start("go", run_id="crashy")
        task = asyncio.ensure_future(started.run())
        await entered.wait()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(crash())
    assert len(worker_model.requests) == 2
    resumed = build("done")
    result = resumed.resume_sync("crashy")
    check_invariants(result, limits=resumed.limits, bound=resumed.bound)
    assert len(worker_model.requests) == 2  # the child did not run again
    assert hung == [True]  # nor did the call after it (the journal's keys did not move)
    paid = tool_results(result)[0]
    details: Any = paid.details
    assert details["runtime"]["replayed"] is True
    assert result.turns == 1 + 2 + 1  # its call, the child's two (counted again), its answer
    assert result.usage.requests == 2 + 0 + 0 + 2  # what the replies reported, with the child's


def test_the_parents_lost_lease_stops_its_child() -> None:
    """The parent's lease is taken over while its child works: the heartbeat finds it, the
    parent's step is stopped, the child is aborted with it (its call cancelled, its run
    stopped and checkpointed), and the parent's driver stops with ``RunLeased`` at its save,
    writing nothing."""
    entered = asyncio.Event()
    cancelled: list[bool] = []

    @tool
    async def wait_forever() -> str:
        """Wait."""
        entered.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise
        return "never"

    class Stolen(MemoryStore):
        """The parent's lease (and only its) is taken over once ``stolen``."""

        stolen = False

        def _check(self, run_id: str) -> None:
            if self.stolen and run_id == "leased":
                raise RunLeased(
                    "taken over by worker 'thief'", run_id=run_id, holder="thief", expires_at=0.0
                )

        def renew(self, lease: Any) -> Any:
            self._check(lease.run_id)
            return super().renew(lease)

        def save(self, state: RunState, *, lease: Any = None) -> Any:
            self._check(state.run_id)
            return super().save(state, lease=lease)

    store = Stolen()
    worker = Agent(
        model=ScriptedModel([reply("", call("wait_forever"))], name="worker"),
        tools=[wait_forever],
    )
    boss = Agent(
        model=ScriptedModel([reply("", call("work", task="wait"))], name="boss"),
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST),
        store=store,
        lease_s=0.3,
        worker_id="first",
    )

    async def main() -> None:
        task = asyncio.ensure_future(boss.run("go", run_id="leased"))
        await entered.wait()
        before = store.load("leased")
        store.stolen = True
        with pytest.raises(RunLeased, match="thief"):
            await asyncio.wait_for(task, 60)
        assert store.load("leased").trace == before.trace  # the stale driver wrote nothing
        (call_message,) = [m for m in before.messages if m.role == "assistant"]
        assert isinstance(call_message, AssistantMessage)
        child_id = delegation.child_run_id("leased", 1, call_message.tool_calls[0].id)
        child = store.load(child_id)
        assert child.stop_reason is StopReason.ABORTED
        assert "lease was lost" in (child.error or "")
        assert not transcript_problems(child.messages)

    asyncio.run(main())
    assert cancelled == [True]


_BOSS_MOVES = ("child", "ask", "echo", "answer", "rush")
_WORKER_MOVES = ("ask", "approve", "echo", "answer")


def _player(name: str, moves: list[str], tool_name: str = "") -> FunctionModel:
    """A model that plays ``moves`` in order, for ever (its own turn count picks the move)."""
    played = itertools.count()

    def decide(request: ModelRequest) -> ModelResponse:
        number = next(played)
        move = moves[number % len(moves)]
        if move == "child":
            return reply("", call(tool_name, task=f"task {number}"), usage=(10, 2))
        if move == "ask":
            return reply("", call("ask_user", question=f"{name} asks {number}"), usage=(10, 2))
        if move == "approve":
            return reply("", call("book", city=f"c{number}"), usage=(10, 2))
        if move == "echo":
            return reply("", call("echo", text=f"{name} {number}"), usage=(10, 2))
        if move == "rush":  # a child, and a terminal tool in the same reply
            task = call(tool_name, task=f"task {number}")
            return reply("", task, call("submit", text=f"{name} {number}"), usage=(10, 2))
        return reply(f"{name} answers {number}", usage=(10, 2))

    return FunctionModel(decide, name=name)


@given(
    boss_moves=st.lists(st.sampled_from(_BOSS_MOVES), min_size=1, max_size=8),
    worker_moves=st.lists(st.sampled_from(_WORKER_MOVES), min_size=1, max_size=8),
)
@settings(max_examples=80, deadline=None, database=None)
def test_a_tree_paused_and_resumed_any_way_keeps_every_promise(
    boss_moves: list[str], worker_moves: list[str]
) -> None:
    """Whatever the parent and its child do (delegate, ask the user, ask for approvals,
    call tools, answer), a tree answered at each pause until it ends: every activation of the
    parent keeps the invariants (a valid transcript at every pause), the tree's model calls
    are counted once each in the parent's spend across its pauses, and stay within its
    turns; every child run kept in the store has a valid transcript and names its parent."""
    booked: list[str] = []

    @tool(requires_approval=True)
    def book(city: str) -> str:
        """Book a trip."""
        booked.append(city)
        return f"booked {city}"

    @tool(terminal=True)
    def submit(text: str) -> str:
        """Submit the answer."""
        return text

    store = MemoryStore()
    worker_model = _player("worker", worker_moves)
    boss_model = _player("boss", boss_moves, "work")
    worker = Agent(model=worker_model, tools=[echo, book], limits=Limits(max_turns=4))
    boss = Agent(
        model=boss_model,
        tools=[worker.as_tool(name="work", description="Works."), echo, submit],
        limits=Limits(max_turns=8, loop_detection=False, prices=PRICES, cost_budget=1.0),
        store=store,
    )
    result = boss.run_sync("go")
    answers = 0
    while True:
        check_invariants(result, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
        pending = result.pending
        if result.status is not RunStatus.NEEDS_INPUT or pending is None:
            break
        assert answers < 20, "the tree never stops pausing"
        answers += 1
        asks = pending.waits_for
        if asks.value == "ask_user":
            result = boss.resume_sync(result.run_id, f"answer {answers}")
        else:
            result = boss.resume_sync(result.run_id, approvals=True, pause=pending.pause)
    assert result.turns <= boss.limits.max_turns
    calls = len(boss_model.requests) + len(worker_model.requests)
    assert result.usage.requests == calls  # each call of the tree counted once
    assert result.cost == pytest.approx(calls * (10 * 1.0 + 2 * 2.0) / 1e6)
    assert len(booked) == len(set(booked))  # no approved call ran twice
    children = [s.run_id for s in store.list_runs() if s.run_id != result.run_id]
    for run_id in children:
        stored = store.load(run_id)
        assert stored.parent is not None
        assert stored.parent.run_id == result.run_id
        assert not transcript_problems(stored.messages)
        assert stored.stop_reason not in _WAITS  # the tree ended: no child is left waiting


_WAITS = (StopReason.ASK_USER, StopReason.APPROVAL_REQUIRED, StopReason.SUB_AGENT_PAUSED)


def test_the_tree_property_catches_a_childs_spend_counted_twice_across_a_pause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A seeded bug: a child that goes on after a pause has all its spend added again (not
    only what it spent since): the property above finds it."""
    fold = parenting.fold

    def twice(parent: Any, child: RunResult, counted: Any = None) -> None:
        fold(parent, child, None)

    monkeypatch.setattr(parenting, "fold", twice)
    with pytest.raises((AssertionError, ExceptionGroup)):
        test_a_tree_paused_and_resumed_any_way_keeps_every_promise()


def test_a_handoff_that_asks_the_user_ends_its_parent_once_answered() -> None:
    """A handoff's child asks; the tree pauses; answered, the child's answer ends the
    parent's run through the terminal_tool row, as a handoff that did not pause does."""
    taker = Agent(
        model=ScriptedModel([reply("", call("ask_user", question="Your name?")), "Hi Ann."])
    )
    boss_model = ScriptedModel([reply("", call("transfer", note="greet"))])
    boss = Agent(
        model=boss_model,
        tools=[taker.as_handoff(name="transfer", description="Hands over.")],
        limits=Limits(**FAST),
    )
    paused = boss.run_sync("hello")
    check_invariants(paused, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
    done = boss.resume_sync(paused.run_id, "Ann")
    check_invariants(done, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    assert (done.stop_reason, done.output) == (StopReason.TERMINAL_TOOL, "Hi Ann.")
    assert len(boss_model.requests) == 1  # the parent's model was not asked again


def test_the_parents_abort_while_a_paused_child_goes_on_aborts_the_child() -> None:
    """Resumed with the answer, the parent goes on with its child; the parent is aborted
    meanwhile: the child is aborted first (its call in flight cancelled), and the parent
    stops ``aborted`` with a valid transcript, its model told the child was stopped once it
    is resumed."""
    entered = asyncio.Event()

    @tool
    async def slow() -> str:
        """Take long."""
        entered.set()
        await asyncio.sleep(3600)
        return "never"

    worker = Agent(
        model=ScriptedModel([reply("", call("ask_user", question="Go?")), reply("", call("slow"))]),
        tools=[slow],
    )
    boss_model = ScriptedModel([reply("", call("work", task="x")), "stopped, fine"])
    boss = Agent(
        model=boss_model,
        tools=[worker.as_tool(name="work", description="Works.")],
        limits=Limits(**FAST),
        store=MemoryStore(),
    )
    paused = boss.run_sync("go")
    pending = paused.pending
    assert pending is not None
    assert pending.sub_agent is not None

    async def main() -> RunResult:
        run = boss.reopen(paused.run_id, "yes")
        task = asyncio.ensure_future(run.run())
        await entered.wait()
        run.abort("the user gave up")
        return await asyncio.wait_for(task, 60)

    aborted = asyncio.run(main())
    check_invariants(aborted, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    assert aborted.stop_reason is StopReason.ABORTED
    child = boss.checkpoints.load(pending.sub_agent.run_id)
    assert child.stop_reason is StopReason.ABORTED
    assert not transcript_problems(child.messages)
    again = boss.resume_sync(aborted.run_id)
    assert again.output == "stopped, fine"
    assert "was stopped before it finished" in str(boss_model.requests[-1].messages[-1])


def test_a_child_kept_in_memory_under_a_durable_parent_is_never_started_twice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parent whose journal is durable but whose child lives in memory (as a DBOS
    parent's does): the process dies mid-child (the store as it was then is what a new
    process finds); the redone call cannot find the child, and does not start it again: its
    outcome is unknown, and the child's side effect happened once."""
    effects: list[str] = []
    entered = asyncio.Event()

    @tool
    async def charge() -> str:
        """Charge (not idempotent)."""
        effects.append("charged")
        entered.set()
        await asyncio.sleep(3600)
        return "charged"

    def build(store: MemoryStore, *script: ModelResponse | str) -> Agent:
        worker = Agent(
            model=ScriptedModel([reply("", call("charge")), "ok"], name="w"), tools=[charge]
        )
        return Agent(
            model=ScriptedModel(list(script), name="boss"),
            tools=[worker.as_tool(name="pay", description="Pays.")],
            store=store,
            limits=Limits(**FAST),
        )

    monkeypatch.setattr(delegation, "_home", lambda delegate, parent: delegate.agent.residence)
    store = MemoryStore()

    async def crash() -> MemoryStore:
        task = asyncio.ensure_future(
            build(store, reply("", call("pay", task="pay"))).run("go", run_id="p")
        )
        await entered.wait()
        died = copy.deepcopy(store)  # what the store holds when the process dies
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return died

    died = asyncio.run(crash())
    resumed = build(died, "Could not tell.")
    result = resumed.resume_sync("p")
    check_invariants(result, limits=resumed.limits, bound=resumed.bound)
    assert effects == ["charged"]
    (answer,) = tool_results(result)
    assert "outcome is unknown" in answer.content


def test_a_parent_that_dies_while_its_answered_child_goes_on_resumes_it_once() -> None:
    """The tree paused for the child's question; answered, the child goes on and its next
    call (not idempotent) is in flight when the parent's process dies (the store as it was
    then is what a new process finds). Resumed, the parent carries the answer out again: the
    child, no longer at its pause, goes on from its checkpoint (the call's outcome unknown,
    not run again), and its result reaches the parent once."""
    effects: list[str] = []
    entered = asyncio.Event()

    @tool
    async def charge() -> str:
        """Charge (not idempotent)."""
        effects.append("charged")
        entered.set()
        await asyncio.sleep(3600)
        return "charged"

    def build(store: MemoryStore) -> tuple[Agent, FunctionModel]:
        def worker_decides(request: ModelRequest) -> ModelResponse:
            answers = [m for m in request.messages if isinstance(m, ToolMessage)]
            if not answers:
                return reply("", call("ask_user", question="Charge?"))
            if len(answers) == 1:
                return reply("", call("charge"))
            return reply(f"worker saw: {answers[-1].content}")

        def boss_decides(request: ModelRequest) -> ModelResponse:
            if len(request.messages) <= 2:
                return reply("", call("pay", task="pay"))
            return reply("boss done")

        worker_model = FunctionModel(worker_decides, name="w")
        worker = Agent(model=worker_model, tools=[charge])
        boss = Agent(
            model=FunctionModel(boss_decides, name="boss"),
            tools=[worker.as_tool(name="pay", description="Pays.")],
            store=store,
            limits=Limits(**FAST),
        )
        return boss, worker_model

    store = MemoryStore()
    boss, _ = build(store)
    paused = boss.run_sync("go")
    assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED

    async def crash() -> MemoryStore:
        task = asyncio.ensure_future(boss.resume(paused.run_id, "yes"))
        await entered.wait()
        died = copy.deepcopy(store)  # what the store holds when the process dies
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return died

    died = asyncio.run(crash())
    later, worker_model = build(died)
    result = later.resume_sync(paused.run_id)
    check_invariants(result, limits=later.limits, bound=later.bound, rows=later.machine.rows)
    assert (result.stop_reason, result.output) == (StopReason.FINAL_ANSWER, "boss done")
    assert effects == ["charged"]
    told = [m for m in result.messages if isinstance(m, UserMessage)][-1]
    assert "worker saw:" in told.content
    assert "outcome" in told.content.lower()  # the charge's outcome is unknown
    assert len(worker_model.requests) == 1  # the child went on where it was


def _waiting_child_tree(
    boss_replies: list[Any], tools: list[Any] | None = None, **limits: Any
) -> tuple[Agent, ScriptedModel, ScriptedModel]:
    """A boss (kept in a MemoryStore) whose sub-agent ``work`` asks the user a question."""
    worker_model = ScriptedModel(
        [reply("", call("ask_user", question="Which city?")), "Sunny in Paris"], name="worker"
    )
    worker = Agent(model=worker_model)
    boss_model = ScriptedModel(boss_replies, name="boss")
    boss = Agent(
        model=boss_model,
        tools=[worker.as_tool(name="work", description="Works."), *(tools or [])],
        limits=Limits(**{**FAST, **limits}),
        store=MemoryStore(),
    )
    return boss, boss_model, worker_model


def _child_of(boss: Agent, result: RunResult) -> RunState:
    (answer,) = [m for m in tool_results(result) if m.name == "work"]
    child_id = delegation.child_run_id(result.run_id, 1, answer.tool_call_id)
    return boss.checkpoints.load(child_id)


def test_a_parent_ended_by_a_higher_row_than_its_childs_pause_ends_the_child() -> None:
    """The reply that calls the sub-agent also calls a terminal tool: the terminal_tool row
    outranks sub_agent_paused, the parent completes, and the child, which asked the user, is
    ended (aborted, by its rows: its question left unanswered), not left waiting for an
    answer that never comes; the call's answer never promised the run would wait."""

    @tool(terminal=True)
    def submit(text: str) -> str:
        """Submit the answer."""
        return text

    boss, _, worker_model = _waiting_child_tree(
        [reply("", call("work", task="weather"), call("submit", text="done anyway"))],
        tools=[submit],
    )
    _, done = run(boss)
    assert (done.stop_reason, done.output) == (StopReason.TERMINAL_TOOL, "done anyway")
    answer = next(m for m in tool_results(done) if m.name == "work")
    assert "unless it stops for another reason first" in answer.content
    child = _child_of(boss, done)
    assert child.stop_reason is StopReason.ABORTED
    assert not transcript_problems(child.messages)
    assert len(worker_model.requests) == 1  # ended, not run on


def test_a_parent_aborted_in_the_turn_its_child_paused_ends_the_child_and_says_so() -> None:
    """Another call of the same reply aborts the parent: the abort row wins, the child that
    paused is ended, and the parent, resumed, tells its model the child was stopped."""
    runs: list[Any] = []

    @tool
    def halt() -> str:
        """Stop the run."""
        runs[0].abort("the user gave up")
        return "halted"

    boss, boss_model, _ = _waiting_child_tree(
        [reply("", call("work", task="weather"), call("halt")), "ok, stopped"], tools=[halt]
    )

    async def main() -> RunResult:
        runs.append(boss.start("go"))
        return await runs[0].run()

    aborted = asyncio.run(main())
    check_invariants(aborted, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    assert aborted.stop_reason is StopReason.ABORTED
    child = _child_of(boss, aborted)
    assert child.stop_reason is StopReason.ABORTED
    assert not transcript_problems(child.messages)
    again = boss.resume_sync(aborted.run_id)
    assert again.output == "ok, stopped"
    told = str(list(boss_model.requests[-1].messages))
    assert "was stopped without an answer: the run stopped (aborted) first" in told


def test_a_parent_resumed_without_room_for_its_child_ends_the_child() -> None:
    """Resumed with the answer, the parent has no turn left for its child: the child is
    ended (not left at its pause), and the parent stops with a valid transcript."""
    boss, _, worker_model = _waiting_child_tree(
        [reply("", call("work", task="weather")), "never"], max_turns=2
    )
    _, paused = run(boss)
    assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
    ended = boss.resume_sync(paused.run_id, "Paris")
    check_invariants(ended, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    child = _child_of(boss, paused)
    assert child.stop_reason is StopReason.ABORTED
    assert not transcript_problems(child.messages)
    assert len(worker_model.requests) == 1


def test_a_settled_tree_ends_every_level_and_runs_no_call_waiting_for_approval() -> None:
    """Three levels: the leaf waits for approval of a call, the middle agent waits for the
    leaf, and the boss ends by a terminal tool in the same reply: both are ended (aborted),
    the call waiting for approval is denied, never run, and every transcript is valid."""
    booked: list[str] = []

    @tool(requires_approval=True)
    def book(city: str) -> str:
        """Book a trip."""
        booked.append(city)
        return f"booked {city}"

    @tool(terminal=True)
    def submit(text: str) -> str:
        """Submit the answer."""
        return text

    leaf = Agent(model=ScriptedModel([reply("", call("book", city="Paris"))]), tools=[book])
    middle = Agent(
        model=ScriptedModel([reply("", call("leaf", task="book"))]),
        tools=[leaf.as_tool(name="leaf", description="Books.")],
    )
    boss = Agent(
        model=ScriptedModel(
            [reply("", call("middle", task="plan"), call("submit", text="enough"))]
        ),
        tools=[middle.as_tool(name="middle", description="Plans."), submit],
        limits=Limits(**FAST),
        store=MemoryStore(),
    )
    _, done = run(boss)
    assert (done.stop_reason, done.output) == (StopReason.TERMINAL_TOOL, "enough")
    (answer,) = [m for m in tool_results(done) if m.name == "middle"]
    middle_id = delegation.child_run_id(done.run_id, 1, answer.tool_call_id)
    middle_run = boss.checkpoints.load(middle_id)
    (leaf_answer,) = [m for m in middle_run.messages if isinstance(m, ToolMessage)][:1]
    leaf_id = delegation.child_run_id(middle_id, 1, leaf_answer.tool_call_id)
    leaf_run = boss.checkpoints.load(leaf_id)
    assert middle_run.stop_reason is StopReason.ABORTED
    assert leaf_run.stop_reason is StopReason.ABORTED
    assert booked == []
    for messages in (middle_run.messages, leaf_run.messages):
        assert not transcript_problems(messages)


def test_an_abort_before_a_reopened_run_takes_its_resume_row_is_kept() -> None:
    """A run reopened with its answer and aborted before its first step (a paused child its
    stopping parent goes on with) ends ``aborted`` at its next transition: the resume row,
    which clears the fields of the stop it leaves, does not clear the abort, and no model
    call is made."""
    model = ScriptedModel([reply("", call("ask_user", question="Go?")), "went on"])
    agent = Agent(model=model, limits=Limits(**FAST), store=MemoryStore())
    paused = agent.run_sync("go")

    async def main() -> RunResult:
        run = agent.reopen(paused.run_id, "yes")
        run.abort("stopped at once")
        return await run.run()

    aborted = asyncio.run(main())
    assert (aborted.stop_reason, aborted.error) == (StopReason.ABORTED, "stopped at once")
    assert len(model.requests) == 1
    assert not transcript_problems(aborted.messages)


def test_a_parent_taken_over_waits_out_its_dead_drivers_lease_on_the_child() -> None:
    """Worker A dies while its parent's sub-agent call is in flight (its event loop is
    abandoned: no release, no heartbeat), and its lease on the child outlives its lease on
    the parent. Worker B takes the parent over and redoes the call: it waits the child's
    lease out and goes on with the child, instead of answering the model that the sub-agent
    could not be run; the child's side effect happens once."""
    store = MemoryStore()
    effects: list[str] = []
    hang = [True]
    entered = asyncio.Event()

    @tool
    async def append_line(text: str) -> str:
        """Append a line."""
        effects.append(text)
        if hang[0]:
            entered.set()
            await asyncio.sleep(3600)
        return "appended"

    def worker(request: ModelRequest) -> ModelResponse | str:
        answers = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not answers:
            return reply("", call("append_line", text="once"))
        return f"child done: {answers[-1].content}"

    def boss_model(request: ModelRequest) -> ModelResponse | str:
        answers = [m for m in request.messages if isinstance(m, ToolMessage)]
        if not answers:
            return reply("", call("work", task="append"))
        return f"parent done: {answers[-1].content}"

    def build(worker_id: str) -> Agent:
        child = Agent(model=FunctionModel(worker, name="worker"), tools=[append_line])
        return Agent(
            model=FunctionModel(boss_model, name="boss"),
            tools=[child.as_tool(name="work", description="Works.")],
            limits=Limits(**FAST),
            store=store,
            lease_s=0.5,
            worker_id=worker_id,
        )

    dead = asyncio.new_event_loop()
    driver = dead.create_task(build("A").run("go", run_id="parent"))
    dead.run_until_complete(entered.wait())  # A dies here, its calls in flight
    parent = store.load("parent")
    (asked,) = [m for m in parent.messages if isinstance(m, AssistantMessage)]
    child_id = delegation.child_run_id("parent", 1, asked.tool_calls[0].id)
    while True:  # A's leases run out; its last renewal of the child came later
        try:
            store.release(store.claim("parent", "probe", 0.5))
            store.claim(child_id, "A", 1.0)
            break
        except RunLeased:
            time.sleep(0.1)
    hang[0] = False
    later = build("B")
    taken = later.resume_sync("parent")
    check_invariants(taken, limits=later.limits, bound=later.bound, rows=later.machine.rows)
    assert taken.stop_reason is StopReason.FINAL_ANSWER
    (answer,) = tool_results(taken)
    assert answer.content.startswith("child done:"), answer.content
    assert effects == ["once"]
    child = store.load(child_id)
    assert child.stop_reason is StopReason.FINAL_ANSWER
    assert not transcript_problems(child.messages)
    driver.cancel()  # the stale driver, were it to wake, writes nothing over B's work
    with contextlib.suppress(BaseException):
        dead.run_until_complete(driver)
    dead.close()
    assert store.load(child_id).stop_reason is StopReason.FINAL_ANSWER


def test_edited_arguments_for_a_grandchilds_call_are_checked_against_its_own_tools() -> None:
    """Three levels: the leaf's call waits for approval, the pause reaches the boss through
    the middle agent. Arguments edited on the boss are checked against the leaf's tool
    schema (a wrong edit is refused, the tree stays paused), and a right one runs the call
    once, with them, in the leaf."""
    booked: list[str] = []

    @tool(requires_approval=True)
    def book(city: str) -> str:
        """Book a trip."""
        booked.append(city)
        return f"booked {city}"

    leaf = Agent(
        model=ScriptedModel([reply("", call("book", city="Paris")), "Booked."]), tools=[book]
    )
    middle = Agent(
        model=ScriptedModel([reply("", call("leaf", task="book")), "Planned."]),
        tools=[leaf.as_tool(name="leaf", description="Books.")],
    )
    boss = Agent(
        model=ScriptedModel([reply("", call("middle", task="plan")), "All set."]),
        tools=[middle.as_tool(name="middle", description="Plans.")],
        limits=Limits(**FAST),
        store=MemoryStore(),
    )
    _, paused = run(boss)
    pending = paused.pending
    assert paused.stop_reason is StopReason.SUB_AGENT_PAUSED
    assert pending is not None
    assert pending.sub_agent is not None
    assert (pending.sub_agent.tool, pending.sub_agent.below) == ("middle", ("leaf",))
    (waiting,) = pending.pending_calls
    with pytest.raises(ResumeError, match="city"):
        boss.resume_sync(
            paused.run_id, approvals={waiting.id: Approval(allow=True, arguments={"city": 3})}
        )
    assert booked == []
    done = boss.resume_sync(
        paused.run_id, approvals={waiting.id: Approval(allow=True, arguments={"city": "Rome"})}
    )
    check_invariants(done, limits=boss.limits, bound=boss.bound, rows=boss.machine.rows)
    assert (done.status, done.output) == (RunStatus.COMPLETED, "All set.")
    assert booked == ["Rome"]


def test_a_child_makes_no_last_answer_once_the_trees_money_is_spent_to_the_last_rounding() -> None:
    """Found by the harness (``_supervisor``): 0.2 less 0.04 less 0.12 leaves 0.04000000000000001
    in floating point, so a child carved that much and spending 0.04 thought it had money left
    and wrote a last answer, a call begun with the tree's whole budget of 0.2 spent. Amounts
    within rounding of a budget reach it (``Limits.money_spent``), for parent and child alike."""
    prices = {"m": Pricing(input_per_million=0.0, output_per_million=400.0)}  # 0.04 a reply
    alpha = Agent(
        model=ScriptedModel(
            [
                reply("", call("echo", text="a"), usage=(0, 100)),
                reply("", call("echo", text="b"), usage=(0, 100)),
                reply("found", usage=(0, 100)),
            ],
            name="m",
        ),
        tools=[echo],
        limits=Limits(max_turns=4),
    )
    beta = Agent(
        model=ScriptedModel(
            [reply("", call("add", a=1, b=2), usage=(0, 100)), reply("last", usage=(0, 100))],
            name="m",
        ),
        tools=[add],
        limits=Limits(max_turns=5, last_answer=True),
    )
    parent = Agent(
        model=ScriptedModel(
            [reply("", call("alpha", task="x"), call("beta"), usage=(0, 100))], name="m"
        ),
        tools=[
            alpha.as_tool(name="alpha", description="Researches."),
            beta.as_handoff(name="beta", description="Takes over the conversation."),
        ],
        limits=Limits(max_turns=6, cost_budget=0.2, prices=prices),
    )
    events: list[Any] = []
    result = parent.subscribe(events.append).run_sync("Do the task.")

    costs = [e.cost for e in events if isinstance(e, ModelResponded)]
    assert costs == [0.04] * 5  # the parent's, alpha's three, beta's one: no last answer
    assert result.cost == pytest.approx(0.2)
    check_invariants(result, limits=parent.limits, bound=parent.bound, events=events)
