"""The search benchmark measures the search that ships: it imports only public names of autotune
(no ``autotune.study._proposals``, no private helper), replays ``autotune.study.search`` itself, and
judges memory with the one fit rule, ``autotune.spec.ceiling.fits``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCHMARK_FILES = sorted((REPO / "benchmarks" / "bench_search").glob("*.py"))


def autotune_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every ``autotune`` import of a file, at the top or inside functions."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "autotune":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "autotune"]
    return found


def test_the_benchmark_is_a_package_of_modules():
    assert {p.name for p in BENCHMARK_FILES} >= {"__init__.py", "__main__.py", "grid.py", "strategies.py", "report.py"}


def test_the_benchmark_imports_no_private_module_or_name():
    private = [
        f"{path.relative_to(REPO)}: {module} {name}".strip()
        for path in BENCHMARK_FILES
        for module, name in autotune_imports(path)
        if any(part.startswith("_") for part in module.split(".")) or name.startswith("_")
    ]
    assert not private, "\n".join(private)


def test_the_benchmark_replays_the_public_search_call_and_the_one_fit_rule():
    imports = {pair for path in BENCHMARK_FILES for pair in autotune_imports(path)}
    assert ("autotune.study", "search") in imports
    assert ("autotune.spec.ceiling", "fits") in imports
    # Neither the loop's parts nor a fit rule of its own.
    assert (
        not {("autotune.study", "run_one_trial"), ("autotune.study", "stop_reason"), ("autotune.study", "ask_trial")}
        & imports
    )
    sources = "\n".join(path.read_text() for path in BENCHMARK_FILES)
    assert "def fits(" not in sources and "<= ceiling_bytes" not in sources
