"""``assert_terminates``: prove, by property-based testing, that a user's agent always ends well.

Hypothesis generates model behaviours focused on the agent's own tools (``behaviours_for``);
each one is played against a copy of the agent (``harness.Stage``) and every run invariant is
checked. When one breaks, hypothesis shrinks the behaviour to a minimal one and replays it
last, so the ``HarnessFailure`` that ``assert_terminates`` raises carries the *shrunk* case:
the violated invariants and a script with the model's replies in order. It works the same
under pytest and in a plain script, and honours the active hypothesis settings profile
(``max_examples`` and the rest) unless ``settings`` is given.
"""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import HealthCheck, Phase, example, given
from hypothesis import settings as Settings
from hypothesis import strategies as st

from agent_fsm.agent import Agent
from agent_fsm.durable.checkpoint import CheckpointStore
from agent_fsm.models.base import Model
from agent_fsm.testing.behaviour import Behaviour
from agent_fsm.testing.harness import DEFAULT_INPUT, HarnessFailure, LoopRunner, Stage
from agent_fsm.testing.strategies import behaviours_for, edge_behaviours, window_pressure_for

__all__ = ["assert_terminates"]


def assert_terminates(
    agent: Agent,
    *,
    user_input: str = DEFAULT_INPUT,
    behaviours: st.SearchStrategy[Behaviour] | None = None,
    tool_failures: bool = True,
    max_examples: int | None = None,
    settings: Settings | None = None,
    store: CheckpointStore | None = None,
    through: Callable[[Model], Model] | None = None,
) -> None:
    """Check that every run of ``agent`` ends in DONE or ERROR within its termination bound,
    with a valid transcript, whatever its model and tools do.

    The agent's own model is never called: each run uses a copy of the agent
    (``agent.replace``) with a generated model behaviour, tool doubles that may fail, time out
    or return huge outputs (unless ``tool_failures`` is False), and a fake clock (retry
    backoff costs no time). For an agent with a context window, half the behaviours keep
    calling tools that return large outputs (``window_pressure_for``), and every prompt sent
    is checked too: the system prompt and latest input kept, no call without its result.

    Args:
        agent: the agent under test.
        user_input: the message every run starts with.
        behaviours: the behaviours to try; ``behaviours_for(agent)`` by default.
        tool_failures: let generated tool doubles misbehave.
        max_examples: how many behaviours to try; the active profile's number by default.
        settings: hypothesis settings to start from; the active profile by default.
        store: where the generated runs are checkpointed; an in-memory store of the harness
            by default, never the agent's own (a production database stays untouched).
        through: wraps the generated model before the agent gets it (``Stage``'s
            ``through``): to play the behaviours through a model adapter and its wire format.

    Raises:
        HarnessFailure: an AssertionError naming the broken invariants of the minimal failing
            behaviour, with a pasteable reproducer (also in its ``reproducer`` attribute).
    """
    stage = Stage(agent, user_input=user_input, store=store, through=through)
    strategy = behaviours if behaviours is not None else behaviours_for(
        stage.agent, tool_failures=tool_failures
    )  # fmt: skip
    if behaviours is None and stage.agent.limits.context_window is not None:
        strategy = st.one_of(strategy, window_pressure_for(stage.agent))
    base = settings if settings is not None else Settings()
    chosen = Settings(
        base,
        max_examples=max_examples if max_examples is not None else base.max_examples,
        deadline=None,
        report_multiple_bugs=False,
        # the explain phase reruns many variants of the shrunk case to annotate it; the
        # reproducer says more, at a fraction of the time
        phases=[phase for phase in base.phases if phase is not Phase.explain],
        suppress_health_check=[*base.suppress_health_check, HealthCheck.too_slow],
    )

    loop = LoopRunner()

    @chosen
    @given(behaviour=strategy)
    def every_run_terminates(behaviour: Behaviour) -> None:
        case = stage.play(behaviour, loop)
        if not case.ok:
            raise HarnessFailure(
                case,
                header="assert_terminates: a run of the agent broke a run invariant "
                "(the minimal case hypothesis found).",
            )

    if behaviours is None:
        for edge in edge_behaviours(stage.agent):
            every_run_terminates = example(behaviour=edge)(every_run_terminates)
    try:
        every_run_terminates()
    finally:
        loop.close()
