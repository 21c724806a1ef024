"""The search-space YAML: read, and checked against the levers (one key per lever)."""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
)

from autotune.errors import AutotuneError
from autotune.levers import BATCH_LIMIT_KNOBS, LEVERS, Lever
from autotune.spec.files import read_user_file

# What a space file may hold. Every trial stores each knob's full list of choices with its params
# (Optuna's CategoricalDistribution, serialised per trial param in the storage), and the sampler walks
# them on every ask: a space of 700k micro-batch choices (a 5 MB file) took 22 s to validate, minutes
# per trial in the parent and a 22 MB database. The default space is far below both bounds.
MAX_SPACE_FILE_BYTES = 64 * 1024
MAX_CHOICES_PER_KNOB = 256
AUTO = "auto"
_STRICT = {int: StrictInt, bool: StrictBool, str: StrictStr}


def _field(lever: Lever) -> tuple[Any, Any]:
    """The YAML key of a lever: a list of strictly typed choices (YAML's ``true`` is not a batch size
    of 1, nor ``1`` a boolean), or ``auto``; absent: ``auto``, the default alone, or left out."""
    choices = list[_STRICT[lever.value_type]]  # type: ignore[index]
    if lever.auto_choices is not None:
        return choices | StrictStr, AUTO if lever.absent_means_auto else [lever.default]
    if lever.in_every_space:
        return choices, [lever.default]
    return choices | None, None


def _check_lever(cls: type, value: Any, info: ValidationInfo) -> Any:
    lever = LEVERS[info.field_name]
    if value is None:
        return value
    if isinstance(value, str):
        if value != AUTO:
            raise ValueError(f"must be a list of choices or '{AUTO}'")
        return value
    if len(value) > MAX_CHOICES_PER_KNOB:
        raise ValueError(f"{len(value)} choices; give at most {MAX_CHOICES_PER_KNOB}")
    return lever.check_choices(value)


def _check_batch_limit(cls: type, value: int | None) -> int | None:
    if value is not None and value <= 0:
        raise ValueError("must be a positive integer")
    return value


# Constraints on micro_batch x grad_accum (not levers): --global-batch / --max-global-batch override.
SpaceFile: type[BaseModel] = create_model(
    "SpaceFile",
    __config__=ConfigDict(extra="forbid"),
    __validators__={
        "check_lever": field_validator(*LEVERS)(_check_lever),
        "check_batch_limit": field_validator(*BATCH_LIMIT_KNOBS)(_check_batch_limit),
    },
    **{lever.name: _field(lever) for lever in LEVERS.values()},
    **{limit: (StrictInt | None, None) for limit in BATCH_LIMIT_KNOBS},
)
SpaceFile.__doc__ = "The YAML schema: each lever maps to its list of choices (autotune.levers)."


def read_space_file(path: str) -> BaseModel:
    """The space file, read within :data:`MAX_SPACE_FILE_BYTES` and validated.

    Raises:
        AutotuneError: Unreadable, too large, not UTF-8 text, not valid YAML, not a mapping, or a
            key or choice the levers do not allow (naming the key and the choice).
    """
    text = read_user_file(path, "--space", "UTF-8 YAML", MAX_SPACE_FILE_BYTES, "a space lists a few choices per knob")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AutotuneError(f"--space {path}: not valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(raw, dict):
        raise AutotuneError(f"--space {path}: expected a mapping of knob -> list of choices")
    try:
        return SpaceFile.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        # loc is (knob, [union branch such as "list[int]"], [index of the choice]): name the knob
        # and the offending choice, not pydantic's path through the type.
        knob = str(error["loc"][0]) if error["loc"] else "(top level)"
        message = "unknown knob (see search_spaces/README.md)" if error["type"] == "extra_forbidden" else error["msg"]
        if isinstance(error["loc"][-1], int):
            message = f"choice {error['input']!r}: {message}"
        raise AutotuneError(f"--space {path}: {knob}: {message.removeprefix('Value error, ')}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What the YAML parser found wrong, and where (line and column, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem
