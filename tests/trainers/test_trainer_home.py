"""Every trainer is one module of ``autotune.trainers``, and no other part of autotune tells trainers
apart by name: it asks the trainer object what differs (docs/architecture.md, "Adding a trainer").

Outside autotune/trainers/ no module compares a value with a trainer's name (``trainer == "sft"``,
``name in ("trainer", "sft")``) nor spells a trainer's class or its arguments class as a string
(``"trl:SFTConfig"``, ``"TrainingArguments"``): both are the trainer's to say.
"""

from __future__ import annotations

import ast
from pathlib import Path

from autotune import trainers
from tests.levers.test_lever_home import _docstrings  # the same docstrings the lever-home check skips

REPO = Path(__file__).resolve().parent.parent.parent
PACKAGE = REPO / "autotune"
TRAINERS_FOLDER = PACKAGE / "trainers"
_COMPARING = (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot)


def trainer_names() -> set[str]:
    return set(trainers.NAMES)


def class_names() -> set[str]:
    """Each trainer's class and arguments class, as ``module:Class`` and as ``Class``."""
    paths = {path for kind in trainers.REGISTERED for path in (kind.trainer_class, kind.arguments_path)}
    return paths | {path.partition(":")[2] for path in paths}


def _strings(node: ast.AST) -> list[str]:
    """The string constants of a comparison's operand: itself, or the items of a literal tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [value for item in node.elts for value in _strings(item)]
    return []


def trainer_name_uses(source: str, names: set[str], classes: set[str]) -> list[tuple[int, str]]:
    """Where ``source`` compares with a trainer's name, or spells a trainer's class as a string (not in a docstring)."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(isinstance(op, _COMPARING) for op in node.ops):
            named = sorted({s for side in (node.left, *node.comparators) for s in _strings(side) if s in names})
            found += [(node.lineno, f"compares with the trainer name {name!r}") for name in named]
        elif isinstance(node, ast.Constant) and node.value in classes and id(node) not in docstrings:
            found.append((node.lineno, f"names the class {node.value!r}"))
    return found


def outside_trainers() -> list[Path]:
    return [path for path in sorted(PACKAGE.rglob("*.py")) if TRAINERS_FOLDER not in path.parents]


def test_no_module_outside_the_trainers_tells_trainers_apart_by_name():
    """The rest of autotune asks the trainer object (``autotune.trainers.get``) what differs: its
    arguments class, whether it prepares its rows, fuses its LM head, chooses a loss, ..."""
    offences = [
        f"{path.relative_to(REPO)}:{line} {what}"
        for path in outside_trainers()
        for line, what in trainer_name_uses(path.read_text(), trainer_names(), class_names())
    ]
    assert offences == [], "\n".join(offences)


def test_the_check_sees_each_way_of_telling_trainers_apart():
    source = '''
def f(workload, trainer, name):
    """Under trainer == "sft" in prose, which is no comparison; nor is "SFTConfig" here."""
    a = workload.trainer == "sft"
    b = trainer != "trainer"
    c = name in ("trainer", "sft")
    d = "sft" if trainer else "x"
    e = ("trl", "SFTConfig")
    g = "transformers:TrainingArguments"
    h = f"{trainer} in words"
    return workload.acts_on == "model"
'''
    found = trainer_name_uses(source, {"trainer", "sft"}, class_names())
    assert sorted(found) == [
        (4, "compares with the trainer name 'sft'"),
        (5, "compares with the trainer name 'trainer'"),
        (6, "compares with the trainer name 'sft'"),
        (6, "compares with the trainer name 'trainer'"),
        (8, "names the class 'SFTConfig'"),
        (9, "names the class 'transformers:TrainingArguments'"),
    ]


def test_each_trainer_is_one_module_of_the_package_registered_once():
    modules = {path.stem for path in TRAINERS_FOLDER.glob("*.py") if not path.stem.startswith("_")}
    assert len(trainers.NAMES) == len(set(trainers.NAMES))
    assert {type(kind).__module__.rsplit(".", 1)[1] for kind in trainers.REGISTERED} == modules
    assert trainers.DEFAULT in trainers.REGISTERED
