"""Every example runs with what its docstring says to install: the package's own
dependencies and the extras it names (issue 40: ``examples/otel_trace.py`` failed with
``No module named 'opentelemetry.sdk'`` after installing ``[otel]``)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def _distributions(requirements: list[str]) -> set[str]:
    return {_normal(Requirement(item).name) for item in requirements}


def _third_party_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return {
        name
        for name in found
        if name.split(".")[0] not in sys.stdlib_module_names
        and name.split(".")[0] not in ("agent_fsm", "examples", "tests")
    }


def _normal(name: str) -> str:
    return name.lower().replace("_", "-")


def _owners(module: str) -> set[str]:
    """The distributions that install ``module``; for a namespace package (opentelemetry),
    the ones that hold this submodule."""
    top = module.split(".")[0]
    candidates = importlib.metadata.packages_distributions().get(top, [top])
    if len(candidates) == 1:
        return {_normal(candidates[0])}
    path = module.replace(".", "/")
    return {
        _normal(name)
        for name in candidates
        if any(str(f).startswith(path) for f in importlib.metadata.files(name) or ())
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_an_example_needs_nothing_its_docstring_does_not_name(example: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    docstring = ast.get_docstring(ast.parse(example.read_text())) or ""
    named = re.findall(r"\.\[([\w,]+)\]", docstring)
    extras = {extra for group in named for extra in group.split(",")}
    allowed = _distributions(project["dependencies"])
    for extra in extras:
        allowed |= _distributions(project["optional-dependencies"][extra])
    missing = {
        module: sorted(owners)
        for module in sorted(_third_party_imports(example))
        if not (owners := _owners(module)) & allowed
    }
    assert not missing, (
        f"{example.name} imports {missing}, which {sorted(extras) or 'no extra'} does not install"
    )
