"""README snippets and examples are executed, and diagrams/ must match the code."""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from agent_fsm.diagrams import render
from agent_fsm.table import TABLE

pytestmark = pytest.mark.slow  # real processes or servers: make check leaves it out

ROOT = Path(__file__).resolve().parent.parent


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.DOTALL)


def test_readme_starts_with_the_two_commands() -> None:
    head = (ROOT / "README.md").read_text().splitlines()[:8]
    assert any(line.startswith("make demo") for line in head)
    assert any(line.startswith("make test") for line in head)


def _sections(markdown: str) -> list[str]:
    """The README's ``## `` headings in order (a ``# `` comment inside a code block is not
    one)."""
    return re.findall(r"^## (.+)$", re.sub(r"```.*?```", "", markdown, flags=re.DOTALL), re.M)


def test_readme_opens_with_install_quick_start_and_a_real_server() -> None:
    """A newcomer reads how to install, then the quick start, then how to run it on a real
    model, before any single capability; the list of examples comes last but one."""
    sections = _sections((ROOT / "README.md").read_text())
    assert sections[:3] == ["Install", "Quick start", "Real models and local servers"]
    assert sections[-2:] == ["Examples", "Development"]


def test_readme_names_every_example() -> None:
    readme = (ROOT / "README.md").read_text()
    listed = readme.split("\n## Examples\n", 1)[1].split("\n## ", 1)[0]
    for path in sorted((ROOT / "examples").glob("*.py")):
        assert f"(examples/{path.name})" in listed, f"{path.name} is not in the Examples list"


def test_install_commands_name_what_exists() -> None:
    """No package index has agent-fsm: an extra is installed from a clone or a wheel, and the
    README, the examples and every error message say so."""
    texts = {p: p.read_text() for p in [ROOT / "README.md", *(ROOT / "examples").glob("*.py")]}
    texts.update({p: p.read_text() for p in (ROOT / "agent_fsm").rglob("*.py")})
    for path, text in texts.items():
        assert "install 'agent-fsm[" not in text, f"{path} installs from a package index"


def test_readme_python_snippets_run(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = _python_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 2
    namespace: dict[str, object] = {"__name__": "readme"}
    for block in blocks:
        exec(compile(block, "README.md", "exec"), namespace)
    # The bound the README shows in a comment is the one the snippet prints.
    readme = (ROOT / "README.md").read_text()
    shown = readme.split("# TerminationBound(", 1)[1].split("\n", 1)[0]
    assert f"TerminationBound({shown}" in capsys.readouterr().out


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_examples_run_offline(
    path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", [str(path)])
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out


def test_committed_diagram_matches_the_table() -> None:
    committed = (ROOT / "diagrams" / "agent.mmd").read_text()
    assert committed == render(TABLE, "mermaid"), "run `make diagrams` and commit the result"


def test_examples_and_readme_snippets_pass_the_type_checker(tmp_path: Path) -> None:
    """What users copy must type-check under ``mypy --strict`` as the package does (a
    decorated tool stays typed, an Optional is narrowed before use)."""
    snippets = tmp_path / "readme_snippets.py"
    snippets.write_text("\n".join(_python_blocks((ROOT / "README.md").read_text())))
    examples = sorted(str(p) for p in (ROOT / "examples").glob("*.py"))
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(snippets), *examples],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
