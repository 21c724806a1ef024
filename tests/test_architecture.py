"""The layout docs/architecture.md describes holds: no module reaches back up the flow.

cli -> plan -> spec, trainers, levers, estimate, space -> study -> runner -> result -> storage -> views.
The foundations (spec, trainers, levers) import no stage; the runner (what the child executes) knows nothing of the
plan or the study; the study writes trials and knows nothing of how they are shown; the views read a
study through the storage and the result, never through the study package. (That no module outside
levers/ reads a lever by name is checked in tests/levers/test_lever_home.py.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"

# The layers, one folder each, in the order data flows (docs/architecture.md). The only modules at the
# package root are the CLI, ``__main__``, the package face and the two foundations every layer may use.
ROOT_MODULES = {"__init__", "__main__", "cli", "errors", "units"}
LAYERS = ("spec", "trainers", "levers", "estimate", "space", "plan", "study", "runner", "result", "storage", "views")
# For each layer, the layers it must never import. Upstream never names downstream; the study drives the
# runner (the one edge to a later stage); the runner knows nothing of the study, the plan or the views;
# the views read a study through the storage and the result, never through the study or the runner.
FORBIDDEN = {
    "spec": {"trainers", "levers", "estimate", "space", "plan", "study", "runner", "result", "storage", "views"},
    # The trainers (autotune/trainers/) own what differs between trainers, down to how a trial builds its
    # trainer object and what it exports: as data, or as functions of spec-level inputs, which the levers,
    # the runner, the study and the views call; so they import only spec.
    "trainers": {"levers", "estimate", "space", "plan", "study", "runner", "result", "storage", "views"},
    "levers": {"estimate", "space", "plan", "study", "runner", "result", "storage", "views"},
    "estimate": {"space", "plan", "study", "runner", "result", "storage", "views"},
    "space": {"plan", "study", "runner", "result", "storage", "views"},
    "storage": {"spec", "trainers", "levers", "estimate", "space", "plan", "study", "runner", "result", "views"},
    "result": {"estimate", "space", "plan", "study", "runner", "views"},
    "runner": {"plan", "study", "storage", "views"},
    "plan": {"study", "views"},
    "study": {"views"},
    "views": {"plan", "study", "runner"},
}


def layer_of(module: str) -> str:
    """``autotune.study._loop`` -> ``study``; ``autotune.errors`` -> ``errors``."""
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


def modules(package: Path = PACKAGE) -> list[tuple[str, Path]]:
    return [
        (".".join(path.relative_to(package.parent).with_suffix("").parts), path)
        for path in sorted(package.rglob("*.py"))
    ]


def test_every_module_lives_in_a_layer_folder():
    loose = [name for name, path in modules() if path.parent == PACKAGE and path.stem not in ROOT_MODULES]
    folders = {path.parent.name for _, path in modules() if path.parent != PACKAGE}
    assert loose == [], f"modules at the package root: {loose}"
    assert folders <= set(LAYERS) | {"catalog"}, f"folders that are not layers: {folders - set(LAYERS)}"
    assert set(FORBIDDEN) == set(LAYERS)


@pytest.mark.parametrize("layer", LAYERS)
def test_no_module_reaches_back_up_the_flow(layer):
    offences = []
    for name, path in modules():
        if layer_of(name) != layer:
            continue
        for imported in sorted(imports_of(path)):
            if layer_of(imported) in FORBIDDEN[layer]:
                offences.append(f"{name} imports {imported}")
    assert not offences, "\n".join(offences)


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
    """Cycles among the package's modules, each a list of module names (a package's face counts as its
    ``__init__``; an import of ``a.b.c`` names the module ``a.b.c`` if it exists, else the package ``a.b``)."""
    known = {name.removesuffix(".__init__"): path for name, path in modules(package)}
    graph = {}
    for name, path in known.items():
        edges = set()
        for imported in imports_of(path):
            target = imported if imported in known else imported.rsplit(".", 1)[0]
            if target in known and target != name:
                edges.add(target)
        graph[name] = edges
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            # A package's face importing its own private modules is how a face works, not a cycle.
            if node == nxt.rsplit(".", 1)[0]:
                continue
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return cycles


def test_no_import_cycle():
    """No module imports one that imports it back, at the top or inside a function."""
    assert import_cycles() == []


def test_the_cycle_check_sees_a_function_level_cycle(tmp_path):
    package = tmp_path / "autotune"
    (package / "spec").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "spec" / "__init__.py").write_text("")
    (package / "spec" / "a.py").write_text("from autotune.spec.b import x\n")
    (package / "spec" / "b.py").write_text("def f():\n    from autotune.spec.a import y\n")
    assert import_cycles(package) == [["autotune.spec.a", "autotune.spec.b", "autotune.spec.a"]]


def test_no_module_names_another_in_a_string():
    """An upstream module never names a downstream one as a string (an import hidden from this test)."""
    offences = []
    for name, path in modules():
        layer = layer_of(name)
        for match in re.finditer(r"[\"']autotune\.([a-z_]+)", path.read_text()):
            if match.group(1) in FORBIDDEN.get(layer, set()):
                offences.append(f"{name} names autotune.{match.group(1)}")
    assert offences == [], "\n".join(offences)


def test_nothing_imports_the_cli():
    offences = [
        f"{name} imports autotune.cli"
        for name, path in modules()
        if name != "autotune.cli" and "autotune.cli" in imports_of(path)
    ]
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
                missing.append(
                    f"{module.relative_to(package_root.parent)} has no {mirror.relative_to(tests_root.parent)}"
                )
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
    assert missing_mirrors(tmp_path / "autotune", tmp_path / "tests") == [
        "autotune/study/_record.py has no tests/study/test_record.py"
    ]


def test_every_file_the_suite_starts_first_exists():
    """A renamed heavy test file would silently lose its early start (tests/conftest.py, HEAVIEST_FIRST)."""
    from tests.conftest import HEAVIEST_FIRST

    missing = [path for path in HEAVIEST_FIRST if not (PACKAGE.parent / path).is_file()]
    assert missing == [], missing


def test_every_package_folder_ships_in_the_wheel():
    """Every folder of the package is in pyproject.toml's ``packages``: setuptools installs only the packages
    listed there, and a layer left out imports in the checkout (where the suite runs) but not from the wheel
    a user installs (seen: ``trainers/`` landed and the wheelhouse install failed, No module named
    'autotune.trainers', in tests/e2e/test_offline_install.py)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(path.parent.relative_to(PACKAGE.parent).parts)
        for path in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in path.parts
    }
    assert folders - listed == set(), f"add to [tool.setuptools] packages in pyproject.toml: {sorted(folders - listed)}"
