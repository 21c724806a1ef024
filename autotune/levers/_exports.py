"""How a lever's arguments fields are said in each export form: one declaration per lever (``Lever.tool_keys``).

The forms that take the arguments as they are (``TrainingArguments`` / ``SFTConfig`` JSON, ``HfArgumentParser``
flags, a Python call, the ``trl sft`` command line, whose parser reads every ``SFTConfig`` field) say a
lever's fields by their own names: the lever's ``fields``. The tools that rename them (axolotl,
LLaMA-Factory) read each field through what its lever declares here: a :data:`Mapper` to the tool's keys,
or :class:`CannotExpress` with why. A lever that leaves a tool or a field out fails
tests/levers/test_lever_home.py, so no new lever's field becomes "not expressible" unsaid.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

# The tools whose keys are not the arguments' fields (autotune.views.sft_tool_yaml renders them).
TOOL_FORMS = ("axolotl", "llama-factory")
# Each mapper: (the argument's value, every argument) -> (the tool's keys, comment lines). A comment line is
# what the tool cannot express, or, starting with NOTE, what a reader of an expressed key must know.
Mapper = Callable[[Any, Mapping[str, Any]], tuple[dict[str, Any], list[str]]]
NOTE = "note: "


@dataclasses.dataclass(frozen=True)
class CannotExpress:
    """The tool has no key for the field: the export names it in a ``not expressible`` line, with ``reason``."""

    reason: str

    def __call__(self, value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
        return {}, [self.reason]


def same(key: str) -> Mapper:
    """The tool's key ``key`` takes the value as it is."""
    return lambda value, _args: ({key: value}, [])


def nothing(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Said by another field's mapper."""
    return {}, []


def same_names(*fields: str) -> dict[str, Mapper]:
    """Each field under its own name (LLaMA-Factory takes every ``TrainingArguments`` field unchanged)."""
    return {field: same(field) for field in fields}
