"""Crash test: a child process runs a durable agent and is killed with SIGKILL at random
points; each time a fresh process resumes the run from its checkpoint (in SQLite, and in
PostgreSQL), until it completes. Then: the transcript is valid (every tool call answered
exactly once), and the non-idempotent tool's side effect (a line appended to a file) never
happened twice.

Seeded and bounded: ``TRIALS`` runs, at most ``MAX_KILLS`` kills each.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent_fsm.messages import AssistantMessage, ToolMessage
from agent_fsm.table import AgentState
from agent_fsm.testing.invariants import transcript_problems
from tests.crash_child import STEPS
from tests.stores import Opener

ROOT = Path(__file__).resolve().parent.parent
TRIALS = int(os.environ.get("AGENT_FSM_CRASH_TRIALS", "6"))
MAX_KILLS = 3
SEED = 20261122

pytestmark = [
    pytest.mark.slow,  # real processes: make check leaves it out
    pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL"),
]


def _child(store: Opener, log: Path, run_id: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.crash_child", str(log), run_id, store.kind, *store.location],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run_with_kills(rng: random.Random, store: Opener, log: Path, run_id: str) -> int:
    """Start/resume the run until a child finishes it; return how many children were killed."""
    kills = 0
    while True:
        child = _child(store, log, run_id)
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        if kills < MAX_KILLS:
            time.sleep(rng.uniform(0.0, 0.08))
            if child.poll() is None:
                child.send_signal(signal.SIGKILL)
                child.communicate(timeout=10)  # reap it and close its pipes
                kills += 1
                continue
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, f"child failed:\n{out}\n{err}"
        return kills


@pytest.mark.parametrize("trial", range(TRIALS))
def test_killed_runs_resume_and_never_repeat_a_side_effect(
    trial: int, tmp_path: Path, open_shared_store: Opener
) -> None:
    rng = random.Random(SEED + trial)
    log, run_id = tmp_path / "side_effects.log", f"crash-{trial}"
    kills = _run_with_kills(rng, open_shared_store, log, run_id)
    assert kills >= 1, "no child was killed: the kill window misses the run"

    with open_shared_store() as store:
        state = store.load(run_id)
    assert state.state is AgentState.DONE
    assert state.output == "done"
    assert not transcript_problems(state.messages)
    calls = [c.id for m in state.messages if isinstance(m, AssistantMessage) for c in m.tool_calls]
    answers = collections.Counter(
        m.tool_call_id for m in state.messages if isinstance(m, ToolMessage)
    )
    assert sorted(answers) == sorted(calls)
    assert set(answers.values()) == {1}
    assert len(calls) == 2 * STEPS

    lines = log.read_text().splitlines() if log.exists() else []
    repeated = [line for line, n in collections.Counter(lines).items() if n > 1]
    assert not repeated, f"a non-idempotent side effect ran twice: {repeated}"
    # Every step's append either happened once, or its outcome was reported unknown.
    unknown = [m for m in state.messages if isinstance(m, ToolMessage) and "unknown" in m.content]
    assert len(lines) + len(unknown) >= STEPS
