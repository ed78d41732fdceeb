"""The scripts under benchmarks/ run: each once, on its smallest sizes, so that a change to the
library cannot leave a benchmark broken until someone next measures with it.

These check that a script runs to its report, never a figure: figures move with the machine
(the scripts' own docstrings say how to read them). ``instructions.py`` needs valgrind and is
run only where it is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # real processes: make check leaves it out

ROOT = Path(__file__).resolve().parent.parent

# script and arguments, then a line its report must hold
SMALLEST = [
    (["adapters.py", "--calls", "2"], "openai-responses"),
    (["harness_rate.py", "--examples", "3"], "runs per second"),
    (["overhead.py", "--repeat", "1"], "µs/turn"),
    (["parked_runs.py", "--runs", "10", "--top", "2"], "collector's objects per run"),
    (["ui_pages.py", "--runs", "20", "--rounds", "1"], "one run, step 3"),
    (["checkpoint_save.py"], "SQLiteStore"),
    (["machine_fire.py"], "triggers"),
    (["concurrent_runs.py", "--runs", "10", "--turns", "2", "--repeat", "1"], "collector"),
    (
        [
            "concurrent_runs.py",
            "--runs",
            "10",
            "--turns",
            "2",
            "--repeat",
            "1",
            "--model",
            "openai",
        ],
        "openai model",
    ),
    (
        ["stores.py", "--runs", "4", "--turns", "2", "--workers", "1", "--stores", "memory"],
        "memory",
    ),
    (
        ["stores.py", "--runs", "4", "--turns", "2", "--workers", "2", "--stores", "sqlite"],
        "sqlite",
    ),
]


def _run(arguments: list[str], **extra: str) -> str:
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **extra}
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / arguments[0]), *arguments[1:]],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.parametrize(
    ("arguments", "expected"), SMALLEST, ids=[" ".join(arguments) for arguments, _ in SMALLEST]
)
def test_a_benchmark_runs_to_its_report(arguments: list[str], expected: str) -> None:
    assert expected in _run(arguments)


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py")))
def test_every_benchmark_explains_itself(script: str) -> None:
    """``--help`` gives the script's first paragraph whole, not a sentence cut at a line."""
    first_paragraph = " ".join(_first_paragraph(ROOT / "benchmarks" / script).split())
    shown = " ".join(_run([script, "--help"]).split())
    assert first_paragraph
    assert first_paragraph in shown


def test_the_round_trip_count_runs(postgres_url: str) -> None:
    """``round_trips.py`` on the tests' PostgreSQL (its own schema, dropped after)."""
    shown = _run(
        ["round_trips.py", "--runs", "2", "--turns", "2"], AGENT_FSM_POSTGRES_URL=postgres_url
    )
    assert "store.claim" in shown
    assert "total" in shown


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="callgrind needs valgrind")
def test_the_instruction_count_runs() -> None:
    assert "per turn" in _run(["instructions.py", "--only", "unsubscribed", "--turns", "2", "3"])


def _first_paragraph(path: Path) -> str:
    source = path.read_text()
    docstring = source.split('"""')[1]
    return docstring.split("\n\n")[0]
