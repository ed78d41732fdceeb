"""``assert_terminates``: prove, by property-based testing, that a user's agent always ends well.

Hypothesis generates model behaviours focused on the agent's own tools (``behaviours_for``);
each one is played against a copy of the agent (``harness.Stage``) and every run invariant is
checked. When one breaks, hypothesis shrinks the behaviour to a minimal one and replays it
last, so the ``HarnessFailure`` that ``assert_terminates`` raises carries the *shrunk* case:
the violated invariants and a script with the model's replies in order. It works the same
under pytest and in a plain script, and honours the active hypothesis settings profile
(``max_examples`` and the rest) unless ``settings`` is given.

Each hypothesis example plays up to ``BATCH`` behaviours of the agent's catalogue, one run
each. Hypothesis spends about as much on an example of its own (its bookkeeping, whatever is
drawn) as a short run costs; shared by a batch, it is an eighth of that, which is most of
what makes ten thousand runs per CI run affordable. ``max_examples`` still counts runs.
Behaviours of other strategies (given ``behaviours``, window pressure) play one per example.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, Phase, example, given
from hypothesis import settings as Settings
from hypothesis import strategies as st

from agent_fsm.agent import Agent
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.messages import UserInput
from agent_fsm.models.base import Model
from agent_fsm.testing.behaviour import Behaviour
from agent_fsm.testing.harness import (
    DEFAULT_INPUT,
    HarnessFailure,
    LoopRunner,
    Stage,
    frozen_heap,
)
from agent_fsm.testing.strategies import (
    batches_for,
    behaviours_for,
    edge_behaviours,
    window_pressure_for,
)

__all__ = ["BATCH", "assert_terminates"]

BATCH = 8
"""Catalogue behaviours played per hypothesis example (see the module). A failing batch
shrinks as one: the passing behaviours become the simplest ones (all alike, so played once),
and the failure shows the failing run only."""


def _examples(runs: int, per_example: int) -> int:
    """Hypothesis examples for at least ``runs`` runs: whole batches, and one more, as the
    first (hypothesis's simplest: all zeros) plays a single behaviour."""
    return 1 if runs <= 1 else -(-runs // per_example) + (per_example > 1)


def _batches(
    agent: Agent, behaviours: st.SearchStrategy[Behaviour] | None, tool_failures: bool
) -> tuple[int, st.SearchStrategy[list[Behaviour]]]:
    """What each example plays, and at most how many runs that is."""
    if behaviours is None and agent.limits.context_window is None:
        batches = batches_for(agent, BATCH, tool_failures=tool_failures)
        if batches is not None:
            return BATCH, batches
    if behaviours is None:
        behaviours = behaviours_for(agent, tool_failures=tool_failures)
        if agent.limits.context_window is not None:
            behaviours = st.one_of(behaviours, window_pressure_for(agent))
    return 1, behaviours.map(lambda behaviour: [behaviour])


def assert_terminates(
    agent: Agent,
    *,
    user_input: UserInput = DEFAULT_INPUT,
    behaviours: st.SearchStrategy[Behaviour] | None = None,
    tool_failures: bool = True,
    max_examples: int | None = None,
    settings: Settings | None = None,
    store: CheckpointStore | None = None,
    through: Callable[[Model], Model] | None = None,
    real_tools: bool = False,
) -> None:
    """Check that every run of ``agent`` ends in DONE or ERROR within its termination bound,
    with a valid transcript, whatever its model and tools do.

    The agent's own model is never called, nor are its tools unless ``real_tools``: each run
    uses a copy of the agent (``agent.replace``) with a generated model behaviour, tool
    doubles built from the tools (their names and schemas) that answer, or fail, time out or
    return huge outputs (unless ``tool_failures`` is False), and a fake clock (retry
    backoff costs no time). For an agent with a context window, half the behaviours keep
    calling tools that return large outputs (``window_pressure_for``), and every prompt sent
    is checked too: the system prompt and latest input kept, no call without its result.

    Args:
        agent: the agent under test.
        user_input: the message every run starts with (text, or texts, images and files:
            ``Agent.start``).
        behaviours: the behaviours to try; ``behaviours_for(agent)`` by default.
        tool_failures: let generated tool doubles misbehave.
        max_examples: how many behaviours to try (runs: rounded up to whole batches, of
            which behaviours drawn alike are played once, so a few fewer may run); the
            active profile's number by default.
        settings: hypothesis settings to start from; the active profile by default.
        store: where the generated runs are checkpointed; an in-memory store of the harness
            by default, never the agent's own (a production database stays untouched).
        through: wraps the generated model before the agent gets it (``Stage``'s
            ``through``): to play the behaviours through a model adapter and its wire format.
        real_tools: run the agent's real tools where a double would answer "ok"
            (``Stage``'s ``real_tools``): only for tools without side effects that answer
            at once, since a search calls them hundreds of times.

    Raises:
        HarnessFailure: an AssertionError naming the broken invariants of the minimal failing
            behaviour, with a pasteable reproducer (also in its ``reproducer`` attribute).
    """
    stage = Stage(agent, user_input=user_input, store=store, through=through, real_tools=real_tools)
    per_example, batches = _batches(stage.agent, behaviours, tool_failures)
    base = settings if settings is not None else Settings()
    runs = max_examples if max_examples is not None else base.max_examples
    chosen = Settings(
        base,
        max_examples=_examples(runs, per_example),
        deadline=None,
        report_multiple_bugs=False,
        # the explain phase reruns many variants of the shrunk case to annotate it; the
        # reproducer says more, at a fraction of the time
        phases=[phase for phase in base.phases if phase is not Phase.explain],
        suppress_health_check=[*base.suppress_health_check, HealthCheck.too_slow],
    )

    loop = LoopRunner()

    @chosen
    @given(batch=batches)
    def every_run_terminates(batch: list[Behaviour]) -> None:
        for behaviour in batch:
            case = stage.play(behaviour, loop)
            if not case.ok:
                raise HarnessFailure(
                    case,
                    header="assert_terminates: a run of the agent broke a run invariant "
                    "(the minimal case hypothesis found).",
                )

    if behaviours is None:
        edges = edge_behaviours(stage.agent)
        if edges:
            every_run_terminates = example(batch=edges)(every_run_terminates)
    try:
        with frozen_heap():
            every_run_terminates()
    finally:
        loop.close()
