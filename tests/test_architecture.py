"""The layout docs/architecture.md describes holds: no module reaches back up the flow.

spec -> space -> study -> runner -> result -> ranking -> export/report/dashboard. The foundations
(spec and the shared types) import no stage; the runner (what the child executes) knows nothing of
the study; the study writes trials and knows nothing of how they are ranked or shown; the ranking
and everything that shows a study read it through the storage, never through the study package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"

FOUNDATIONS = {
    "errors", "units", "schema", "ceiling", "models", "devices", "config", "flops", "measure", "data",
    "estimate", "result", "space", "validate", "files", "forkserver_signals", "numerics", "levers", "base_args",
    "search_options",
}
STAGES_AFTER_STUDY = {"ranking", "export", "report", "dashboard", "display", "plan_display"}
# For each group of modules, the autotune modules it must never import.
FORBIDDEN = {
    "foundations": (FOUNDATIONS, {"runner", "study", "storage", "calibrate", "cli", *STAGES_AFTER_STUDY}),
    "runner": ({"runner"}, {"study", "storage", "cli", *STAGES_AFTER_STUDY}),
    "storage": ({"storage"}, {"runner", "study", "cli", "calibrate", *STAGES_AFTER_STUDY}),
    "study": ({"study"}, {"cli", *STAGES_AFTER_STUDY}),
    "ranking": ({"ranking"}, {"runner", "study", "storage", "cli", "export", "report", "dashboard", "display", "plan_display"}),
    "views": ({"export", "report", "dashboard", "display", "plan_display"}, {"runner", "study", "cli"}),
}


def stage_of(module: str) -> str:
    """``autotune.study._loop`` -> ``study``; ``autotune.ranking`` -> ``ranking``."""
    return module.split(".")[1] if module.count(".") >= 1 else module


def imports_of(path: Path) -> set[str]:
    """Every ``autotune`` module a file imports, at the top or inside functions."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("autotune"):
            found.add(node.module if node.module != "autotune" else f"autotune.{node.names[0].name}")
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("autotune."))
    return found


def modules() -> list[tuple[str, Path]]:
    return [(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts), path) for path in sorted(PACKAGE.rglob("*.py"))]


@pytest.mark.parametrize("group", sorted(FORBIDDEN))
def test_no_module_reaches_back_up_the_flow(group):
    members, forbidden = FORBIDDEN[group]
    offences = []
    for name, path in modules():
        if stage_of(name) not in members:
            continue
        for imported in sorted(imports_of(path)):
            if stage_of(imported) in forbidden:
                offences.append(f"{name} imports {imported}")
    assert not offences, "\n".join(offences)


def test_nothing_imports_the_cli():
    offences = [f"{name} imports autotune.cli" for name, path in modules() if name != "autotune.cli" and "autotune.cli" in imports_of(path)]
    offences = [o for o in offences if not o.startswith("autotune.__main__")]
    assert not offences, "\n".join(offences)


def test_the_checker_sees_function_level_imports(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from autotune.study import run_search\n    import autotune.runner\n")
    assert imports_of(source) == {"autotune.study", "autotune.runner"}


TESTS = Path(__file__).resolve().parent
MIRRORED_PACKAGES = ("study", "runner")


def missing_mirrors(package_root: Path, tests_root: Path) -> list[str]:
    """Each ``<package>/_<name>.py`` of the mirrored packages without its ``tests/<package>/test_<name>.py``."""
    missing = []
    for package in MIRRORED_PACKAGES:
        for module in sorted((package_root / package).glob("_*.py")):
            if module.name == "__init__.py":
                continue
            mirror = tests_root / package / f"test_{module.stem.removeprefix('_')}.py"
            if not mirror.is_file():
                missing.append(f"{module.relative_to(package_root.parent)} has no {mirror.relative_to(tests_root.parent)}")
    return missing


def test_every_study_and_runner_module_has_its_mirrored_test_file():
    """Tests mirror the package: the unit tests of ``autotune/study/_record.py`` are in
    ``tests/study/test_record.py``, so a reader finds a module's tests by its name."""
    assert not missing_mirrors(PACKAGE, TESTS), "\n".join(missing_mirrors(PACKAGE, TESTS))


def test_the_mirror_check_sees_a_module_without_its_tests(tmp_path):
    for package in MIRRORED_PACKAGES:
        (tmp_path / "autotune" / package).mkdir(parents=True)
        (tmp_path / "autotune" / package / "__init__.py").write_text("")
        (tmp_path / "tests" / package).mkdir(parents=True)
    (tmp_path / "autotune" / "study" / "_record.py").write_text("")
    (tmp_path / "autotune" / "runner" / "_pool.py").write_text("")
    (tmp_path / "tests" / "runner" / "test_pool.py").write_text("")
    assert missing_mirrors(tmp_path / "autotune", tmp_path / "tests") == ["autotune/study/_record.py has no tests/study/test_record.py"]


def test_every_file_the_suite_starts_first_exists():
    """A renamed heavy test file would silently lose its early start (tests/conftest.py, HEAVIEST_FIRST)."""
    from tests.conftest import HEAVIEST_FIRST

    missing = [path for path in HEAVIEST_FIRST if not (PACKAGE.parent / path).is_file()]
    assert missing == [], missing
