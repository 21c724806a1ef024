"""Every name the scripts and benchmarks import from autotune exists: they run outside the suite (on a lent
GPU, by hand), so a name a refactor moved would otherwise be found there, at the cost of the loan (the
GPU acceptance's llm step imported ``views.export.write_json`` long after it had moved)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from tests.support.cli import REPO

SOURCES = sorted([*(REPO / "scripts").glob("*.py"), *(REPO / "benchmarks").glob("*.py")])


def autotune_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of every ``from autotune... import name`` in the file, at any depth."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autotune":
            found += [(node.lineno, node.module, alias.name) for alias in node.names]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_autotune_name_a_script_imports_exists(path):
    missing = []
    for line, module, name in autotune_imports(path):
        imported = importlib.import_module(module)
        if not hasattr(imported, name):
            try:  # a submodule imported by name (``from autotune.plan import cli_options``)
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{path.name}:{line}: {module} has no {name}")
    assert missing == []
