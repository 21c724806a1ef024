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
    field_validator,
)

from autotune.errors import AutotuneError
from autotune.levers import BATCH_LIMITS, LEVERS
from autotune.spec.files import read_user_file

# What a space file may hold. Every trial stores each lever's full list of choices with its params
# (Optuna's CategoricalDistribution, serialised per trial param in the storage), and the sampler walks
# them on every ask: a space of 700k micro-batch choices (a 5 MB file) took 22 s to validate, minutes
# per trial in the parent and a 22 MB database. The default space is far below both bounds.
MAX_SPACE_FILE_BYTES = 64 * 1024
MAX_CHOICES_PER_LEVER = 256
AUTO = "auto"


def _check_lever(cls: type, value: Any, info: ValidationInfo) -> Any:
    lever = LEVERS[str(info.field_name)]
    if value is None:
        return value
    if isinstance(value, str):
        if value != AUTO:
            raise ValueError(f"must be a list of choices or '{AUTO}'")
        return value
    if len(value) > MAX_CHOICES_PER_LEVER:
        raise ValueError(f"{len(value)} choices; give at most {MAX_CHOICES_PER_LEVER}")
    return lever.check_choices(value)


def _check_batch_limit(cls: type, value: int | None) -> int | None:
    if value is not None and value <= 0:
        raise ValueError("must be a positive integer")
    return value


class SpaceFile(BaseModel):
    """The YAML schema: each lever (``autotune.levers``) maps to a list of strictly typed choices (YAML's
    ``true`` is not a batch size of 1, nor ``1`` a boolean), or ``auto`` where the lever has an ``auto``
    list. A lever left out means ``auto``, its default alone (``Lever.in_every_space``), or nothing:
    the trial keeps the model's or the Trainer's own behaviour. ``tests/levers/test_lever_home.py``
    checks every field against its lever (name, type, default)."""

    model_config = ConfigDict(extra="forbid")

    micro_batch: list[StrictInt] | StrictStr = AUTO
    grad_accum: list[StrictInt] = [1]
    checkpointing: list[StrictBool] = [False]
    dtype: list[StrictStr] | StrictStr = ["fp32"]
    optim: list[StrictStr] = ["adamw_torch"]
    dataloader_workers: list[StrictInt] = [0]
    pin_memory: list[StrictBool] = [True]
    compile: list[StrictStr] | StrictStr = ["off"]
    attn_implementation: list[StrictStr] | None = None
    liger: list[StrictBool] | None = None
    padding: list[StrictStr] | None = None
    sampling: list[StrictStr] | None = None
    empty_cache_steps: list[StrictInt] | None = None
    weight_dtype: list[StrictStr] = ["fp32"]
    zero: list[StrictStr] | StrictStr = AUTO
    fsdp: list[StrictStr] | None = None
    packing: list[StrictStr] | None = None
    activation_offloading: list[StrictBool] | None = None
    precompute_ref_log_probs: list[StrictBool] | None = None
    # Constraints on micro_batch x grad_accum (not levers): --global-batch / --max-global-batch override.
    global_batch: StrictInt | None = None
    max_global_batch: StrictInt | None = None
    # Levers whose listed choices that are slow on the device (``Lever.slow_on``) are left out, with a
    # note, as ``auto`` leaves them out (not a lever): the LLM space lists ``compile: ["off", inductor]``,
    # which keeps the GPU space what it is (``auto`` would add the CUDA-graph modes), and leaves
    # inductor out on a CPU, where it costs more than a trial measures (issue 38, 10).
    leave_out_slow: list[StrictStr] = []

    check_lever = field_validator(*LEVERS)(_check_lever)
    check_batch_limit = field_validator(*BATCH_LIMITS)(_check_batch_limit)

    @field_validator("leave_out_slow")
    @classmethod
    def _check_leave_out_slow(cls, names: list[str]) -> list[str]:
        unknown = [name for name in names if name not in LEVERS]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a lever (see search_spaces/README.md)")
        return names

    def auto_levers(self) -> set[str]:
        """The levers the file leaves at ``auto`` (written, or left out where ``auto`` is the default)."""
        return {name for name in LEVERS if getattr(self, name) == AUTO}


def read_space_file(path: str) -> SpaceFile:
    """The space file, read within :data:`MAX_SPACE_FILE_BYTES` and validated.

    Raises:
        AutotuneError: Unreadable, too large, not UTF-8 text, not valid YAML, not a mapping, or a
            key or choice the levers do not allow (naming the key and the choice).
    """
    text = read_user_file(path, "--space", "UTF-8 YAML", MAX_SPACE_FILE_BYTES, "a space lists a few choices per lever")
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AutotuneError(f"--space {path}: not valid YAML ({_yaml_problem(exc)})") from None
    if not isinstance(raw, dict):
        raise AutotuneError(f"--space {path}: expected a mapping of lever -> list of choices")
    try:
        return SpaceFile.model_validate(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        # loc is (lever, [union branch such as "list[int]"], [index of the choice]): name the lever
        # and the offending choice, not pydantic's path through the type.
        key = str(error["loc"][0]) if error["loc"] else "(top level)"
        message = "unknown lever (see search_spaces/README.md)" if error["type"] == "extra_forbidden" else error["msg"]
        if isinstance(error["loc"][-1], int):
            message = f"choice {error['input']!r}: {message}"
        raise AutotuneError(f"--space {path}: {key}: {message.removeprefix('Value error, ')}") from None


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What the YAML parser found wrong, and where (line and column, 1-based)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem
