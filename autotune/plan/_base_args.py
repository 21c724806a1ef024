"""``--base-args``: the TrainingArguments the user fixes, read and checked once, in the parent."""

from __future__ import annotations

import dataclasses
import difflib
import json
import tempfile
from typing import Any

from autotune.errors import AutotuneError
from autotune.levers import DEVICE_JUDGED_FIELDS, LEVERS
from autotune.spec.files import read_user_file

# Fields autotune decides itself; a --base-args file may not set them.
REFUSED_BASE_FIELDS = {
    "output_dir": "the export leaves it to you: TrainingArguments(output_dir=..., **args)",
    "use_cpu": "autotune sets it from --device / --gpu",
    "auto_find_batch_size": "it shrinks the batch on OOM inside the Trainer; autotune measures batch sizes instead",
}


def load_base_args(path: str) -> dict[str, Any]:
    """Read and check a ``--base-args`` JSON file of TrainingArguments the user fixes.

    Every key must be a ``TrainingArguments`` field, and ``TrainingArguments`` must accept the
    values (checked here, in the parent, so that no trial fails on them).

    Raises:
        AutotuneError: Unreadable or not a JSON object, an unknown or refused field, or a value
            ``TrainingArguments`` rejects; one line naming the field.
    """
    from transformers import TrainingArguments

    text = read_user_file(path, "--base-args", "UTF-8 JSON")
    try:
        base_args = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AutotuneError(f"--base-args {path}: not valid JSON ({exc})") from None
    if not isinstance(base_args, dict):
        raise AutotuneError(f"--base-args {path}: expected a JSON object of TrainingArguments fields")
    fields = [f.name for f in dataclasses.fields(TrainingArguments) if f.init]
    for key in base_args:
        if key in REFUSED_BASE_FIELDS:
            raise AutotuneError(f"--base-args {path}: remove {key}: {REFUSED_BASE_FIELDS[key]}")
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            if key in LEVERS and LEVERS[key].acts_on != "training_args":
                what = "a model argument" if LEVERS[key].acts_on == "model" else "the data collator's choice"
                hint = f" (it is {what}: search it with {key} in the --space YAML)"
            raise AutotuneError(f"--base-args {path}: {key} is not a TrainingArguments field{hint}")
    check_base_arg_types(path, base_args)
    check_base_arg_knobs(path, base_args)
    # The precision fields are a lever's the device filter checks; TrainingArguments would judge them
    # against this (CPU) process rather than the device the trials run on.
    checked = {k: v for k, v in base_args.items() if k not in DEVICE_JUDGED_FIELDS}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            TrainingArguments(output_dir=scratch, use_cpu=True, **checked)
        except (ValueError, TypeError, ImportError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise AutotuneError(f"--base-args {path}: TrainingArguments rejects them: {reason[:300]}") from None
    return base_args


def check_base_arg_types(path: str, base_args: dict[str, Any]) -> None:
    """Each value has the type ``TrainingArguments`` declares for its field (``learning_rate: float``, ...).

    ``TrainingArguments`` is a dataclass and does not check types itself: ``"fast"`` as a learning
    rate passes its ``__init__`` and fails every trial inside the optimizer. Its own annotations,
    validated strictly by pydantic, are the source of truth (no list kept here).

    Raises:
        AutotuneError: The first value of the wrong type, with the type expected.
    """
    import typing

    from pydantic import TypeAdapter, ValidationError
    from transformers import TrainingArguments

    hints = typing.get_type_hints(TrainingArguments)
    for key, value in base_args.items():
        try:
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as exc:
            expected = getattr(hints[key], "__name__", None) or str(hints[key]).replace("typing.", "")
            reason = exc.errors()[0]["msg"]
            raise AutotuneError(f"--base-args {path}: {key} {value!r}: {reason} ({expected})") from None


def check_base_arg_knobs(path: str, base_args: dict[str, Any]) -> None:
    """Values that ``TrainingArguments`` accepts but with which no trial can train.

    A value below a lever's least (a zero batch or accumulation) passes ``TrainingArguments`` and
    fails in the Trainer; ``bf16`` and ``fp16`` together are refused by
    ``TrainingArguments.__post_init__`` (transformers ``training_args.py``: "At most one of fp16 and
    bf16 can be True"), whose dtype checks :func:`load_base_args` skips because they judge the
    parent's device, not the trials'.

    Raises:
        AutotuneError: The first such value, naming the field.
    """
    for lever in LEVERS.values():
        if lever.least is None:
            continue
        for field in lever.fields:
            value = base_args.get(field)
            if isinstance(value, (int, float)) and value < lever.least:
                raise AutotuneError(f"--base-args {path}: {field} {base_args[field]}: give {lever.least} or more")
    if base_args.get("bf16") and base_args.get("fp16"):
        raise AutotuneError(
            f"--base-args {path}: bf16 and fp16 are both true: keep one (or leave both out to search dtype)"
        )
