"""``--base-args``: the TrainingArguments the user fixes, read and checked once, in the parent."""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import tempfile
from typing import Any

from autotune.errors import AutotuneError, first_line
from autotune.levers import LEVERS, PRECISION_FIELDS, read_deepspeed_config
from autotune.spec.files import read_user_file
from autotune.trainers import DEFAULT, arguments_class, owner_of_field
from autotune.trainers import get as trainer_named

# Fields autotune decides itself; a --base-args file may not set them.
REFUSED_BASE_FIELDS = {
    "output_dir": "the export leaves it to you: TrainingArguments(output_dir=..., **args)",
    "use_cpu": "autotune sets it from --device / --gpu",
    "auto_find_batch_size": "it shrinks the batch on OOM inside the Trainer; autotune measures batch sizes instead",
}

# A credential is never stored in the study (a database a team shares), the report or the export.
# Which fields hold one is transformers' own rule: the TrainingArguments fields whose name ends with
# "_token", which TrainingArguments hides when it prints or serialises itself (transformers/training_args.py,
# ``__str__`` and ``to_dict``). Today that is ``hub_token``, which the Hub client reads from HF_TOKEN. The
# rule is read on TrainingArguments' own fields, not on a subclass's: TRL's SFTConfig adds ``eos_token`` and
# ``pad_token``, a token's text (trl/trainer/sft_config.py), which are no credential.
CREDENTIAL_SUFFIX = "_token"
CREDENTIAL_ENVIRONMENT = "HF_TOKEN"


def is_inline_json(value: str) -> bool:
    """``--base-args '{"learning_rate": 1e-4}'``: a JSON object given on the command line, not a file's path (a file
    of that name, however unlikely, still wins)."""
    return value.lstrip().startswith("{") and not os.path.lexists(value)


def load_base_args(path: str, trainer: str = DEFAULT.name) -> dict[str, Any]:
    """Read and check ``--base-args``, the arguments the user fixes: a JSON file, or a JSON object given inline.

    Every key must be a field of the trainer's arguments class (``TrainingArguments``; under
    ``--trainer sft`` TRL's ``SFTConfig``), and that class must accept the values (checked here, in
    the parent, by building it, so that no trial fails on them).

    Raises:
        AutotuneError: Unreadable or not a JSON object, an unknown or refused field, or a value
            the arguments class rejects; one line naming the field.
    """
    arguments_type = arguments_class(trainer)
    class_name = arguments_type.__name__
    refused_fields = {**REFUSED_BASE_FIELDS, **trainer_named(trainer).refused_fields}
    text = path if is_inline_json(path) else read_user_file(path, "--base-args", "UTF-8 JSON")
    try:
        base_args = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AutotuneError(f"--base-args {path}: not valid JSON ({exc})") from None
    if not isinstance(base_args, dict):
        raise AutotuneError(f"--base-args {path}: expected a JSON object of {class_name} fields")
    fields = [f.name for f in dataclasses.fields(arguments_type) if f.init]
    for key in base_args:
        if key in refused_fields:
            raise AutotuneError(f"--base-args {path}: remove {key}: {refused_fields[key]}")
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            if key in LEVERS and LEVERS[key].acts_on != "training_args":
                what = "a model argument" if LEVERS[key].acts_on == "model" else "the data collator's choice"
                hint = f" (it is {what}: search it with {key} in the --space YAML)"
            if (owner := owner_of_field(key, trainer)) is not None:
                hint = f" (it is {owner.arguments_named} field: train with --trainer {owner.name})"
            raise AutotuneError(f"--base-args {path}: {key} is not a {class_name} field{hint}")
        if key in credential_fields():
            raise AutotuneError(
                f"--base-args {path}: remove {key}: a credential is never stored in the study or the export; set the "
                f"{CREDENTIAL_ENVIRONMENT} environment variable instead (trials never reach the Hub)"
            )
    check_base_arg_types(path, base_args, arguments_type)
    check_base_arg_choices(path, base_args, arguments_type)
    check_finite(path, base_args)
    check_base_arg_knobs(path, base_args)
    if base_args.get("deepspeed"):
        check_finite(path, read_deepspeed_config(base_args["deepspeed"]), "deepspeed")
    if base_args.get("torch_compile_backend") is not None:
        check_compile_backend(path, str(base_args["torch_compile_backend"]))
    # The precision fields are a lever's the device filter checks; TrainingArguments would judge them
    # against this (CPU) process rather than the device the trials run on.
    checked = {k: v for k, v in base_args.items() if k not in PRECISION_FIELDS}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            arguments = arguments_type(output_dir=scratch, use_cpu=True, **checked)
        except Exception as exc:  # noqa: BLE001 - whatever __post_init__ raises (ValueError, AttributeError, ...) is the user's value
            raise AutotuneError(f"--base-args {path}: {class_name} rejects them: {first_line(exc)}") from None
    if base_args.get("deepspeed"):
        check_deepspeed(path, base_args, arguments)
    return base_args


def credential_fields() -> frozenset[str]:
    """The arguments fields that hold a credential (:data:`CREDENTIAL_SUFFIX` on ``TrainingArguments``' own fields)."""
    from transformers import TrainingArguments

    return frozenset(f.name for f in dataclasses.fields(TrainingArguments) if f.name.endswith(CREDENTIAL_SUFFIX))


def check_base_arg_types(path: str, base_args: dict[str, Any], arguments: type | None = None) -> None:
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

    hints = typing.get_type_hints(arguments or TrainingArguments)
    for key, value in base_args.items():
        try:
            TypeAdapter(hints[key]).validate_python(value, strict=True)
        except ValidationError as exc:
            expected = getattr(hints[key], "__name__", None) or str(hints[key]).replace("typing.", "")
            reason = exc.errors()[0]["msg"]
            raise AutotuneError(f"--base-args {path}: {key} {value!r}: {reason} ({expected})") from None


def check_base_arg_choices(path: str, base_args: dict[str, Any], arguments: type) -> None:
    """Each value is one of the choices its field declares (``field(metadata={"choices": ...})``, what
    ``HfArgumentParser`` and the ``trl sft`` command line enforce). Neither class checks them itself:
    ``SFTConfig(loss_type="mse")`` is built, and every trial would fail when SFTTrainer starts
    (trl/trainer/sft_trainer.py:1042-1043).

    Raises:
        AutotuneError: The first value outside its field's choices, with the choices.
    """
    for field in dataclasses.fields(arguments):
        choices = field.metadata.get("choices")
        if field.name in base_args and choices is not None and base_args[field.name] not in list(choices):
            raise AutotuneError(
                f"--base-args {path}: {field.name} {base_args[field.name]!r}: give one of {', '.join(map(str, choices))}"
            )


def check_base_arg_knobs(path: str, base_args: dict[str, Any]) -> None:
    """Values that ``TrainingArguments`` accepts but with which no trial can train, or that autotune refuses.

    A lever value the lever refuses (``Lever.refused``: TRL's wrapped packing, which lets samples
    attend across their boundary) is refused here too, with its reason.

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
    for lever in LEVERS.values():
        if lever.refused and lever.from_training_args and any(field in base_args for field in lever.fields):
            value = lever.from_training_args(base_args)
            if value in lever.refused:
                raise AutotuneError(f"--base-args {path}: {lever.name} {value} is refused: {lever.refused[value]}")
    if base_args.get("bf16") and base_args.get("fp16"):
        raise AutotuneError(
            f"--base-args {path}: bf16 and fp16 are both true: keep one (or leave both out to search dtype)"
        )


def check_finite(path: str, values: Any, field: str = "") -> None:
    """Every number in ``values`` (nested in objects and lists) is finite.

    JSON as Python reads it takes ``NaN`` and ``Infinity``, and ``1e400`` becomes infinity: a
    learning rate of either trains nothing (the optimizer refuses NaN; infinity diverges), and
    ``TrainingArguments`` checks neither.

    Raises:
        AutotuneError: The first number that is not finite, naming its field.
    """
    if isinstance(values, dict):
        for key, value in values.items():
            check_finite(path, value, f"{field}.{key}" if field else str(key))
    elif isinstance(values, list):
        for index, value in enumerate(values):
            check_finite(path, value, f"{field}[{index}]")
    elif isinstance(values, (int, float)) and not isinstance(values, bool):
        try:
            finite = math.isfinite(values)
        except OverflowError:  # an integer too large for a float
            finite = False
        if not finite:
            raise AutotuneError(
                f"--base-args {path}: {field} {values}: not a finite number (NaN, Infinity and 1e400 are not numbers a run trains with)"
            )


def check_compile_backend(path: str, backend: str) -> None:
    """``torch_compile_backend`` names a backend the Trainer can hand to torch.compile here.

    The Trainer passes it to accelerate's ``TorchDynamoPlugin`` (transformers/trainer.py), which
    takes only the names of accelerate's ``DynamoBackend``; torch.compile then looks it up among the
    backends torch registered (``torch._dynamo.list_backends``). Both must know it.

    Raises:
        AutotuneError: An unknown backend, with the known ones.
    """
    import torch._dynamo
    from accelerate.utils import DynamoBackend

    known = sorted({b.name.lower() for b in DynamoBackend} & set(torch._dynamo.list_backends(exclude_tags=())))
    if backend not in known:
        raise AutotuneError(
            f"--base-args {path}: torch_compile_backend {backend!r} is not a torch.compile backend here: give one of {', '.join(known)}"
        )


# The DeepSpeed entries that follow knobs autotune searches (the Trainer fills them from each trial's
# arguments where they say "auto": transformers/integrations/deepspeed.py, ``trainer_config_process``),
# and the --base-args fields that fix those knobs. The dtype fields are left out of the parent's
# TrainingArguments (see load_base_args), so their entries are compared with the base args here.
DEEPSPEED_BATCH_KEYS = ("train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "train_batch_size")
BATCH_FIELDS = ("per_device_train_batch_size", "gradient_accumulation_steps")
DEEPSPEED_DTYPE_KEYS = ("fp16", "bf16")
# The entries the Trainer fills once it has the model and the step count (``trainer_config_finalize``).
DEEPSPEED_FINALIZED_KEYS = (
    ("zero_optimization", "reduce_bucket_size"),
    ("zero_optimization", "stage3_prefetch_bucket_size"),
    ("zero_optimization", "stage3_param_persistence_threshold"),
    ("scheduler", "params", "total_num_steps"),
    ("scheduler", "params", "warmup_num_steps"),
)


def check_deepspeed(path: str, base_args: dict[str, Any], arguments: Any) -> None:
    """DeepSpeed accepts the ``deepspeed`` config as a trial would hand it over, checked before any trial.

    ``arguments`` (the ``TrainingArguments`` built from the base args) carries the Trainer's copy of
    the config with the "auto" entries filled from them, and the entries that contradict them
    (``hf_deepspeed_config.mismatches``, which the Trainer raises only when a trial starts). The
    filled config then goes through DeepSpeed's own reading of it (``DeepSpeedConfig``: its pydantic
    models and its batch and stage assertions), with a world of one rank.

    Raises:
        AutotuneError: An entry fixed while autotune searches its lever, an entry that contradicts
            the arguments, or a config DeepSpeed rejects; one line naming it.
    """
    import copy
    import logging

    given = read_deepspeed_config(base_args["deepspeed"])
    if not {"train_micro_batch_size_per_gpu", "train_batch_size"} & given.keys():
        # DeepSpeed asserts one of them when a trial starts (deepspeed/runtime/config.py,
        # ``_configure_train_batch_size``), after the model is built: every trial would fail.
        entries = ", ".join(f'"{key}": "auto"' for key in DEEPSPEED_BATCH_KEYS)
        raise AutotuneError(
            f"--base-args {path}: deepspeed gives neither train_micro_batch_size_per_gpu nor train_batch_size, which DeepSpeed "
            f"needs: add {entries} (the Trainer fills them for each trial)"
        )
    for key in DEEPSPEED_BATCH_KEYS:
        if given.get(key) not in (None, "auto") and not all(field in base_args for field in BATCH_FIELDS):
            raise AutotuneError(
                f'--base-args {path}: deepspeed {key} is {given[key]}, but autotune searches the batch: write "auto" there '
                f"(the Trainer fills it for each trial), or fix {' and '.join(BATCH_FIELDS)} in --base-args too"
            )
    dtype_fixed = any(field in base_args for field in PRECISION_FIELDS)
    for key in DEEPSPEED_DTYPE_KEYS:
        section = given.get(key)
        enabled = section.get("enabled") if isinstance(section, dict) else None
        if enabled in (None, "auto"):
            continue
        if not dtype_fixed:
            raise AutotuneError(
                f'--base-args {path}: deepspeed {key}.enabled is {enabled}, but autotune searches dtype: write "auto" there, '
                f"or fix {key} in --base-args too"
            )
        if bool(enabled) != bool(base_args.get(key)):
            raise AutotuneError(
                f"--base-args {path}: deepspeed {key}.enabled is {enabled}, --base-args {key} is {bool(base_args.get(key))}: give the same"
            )
    trainer_copy = arguments.hf_deepspeed_config
    contradictions = [
        m.lstrip("- ")
        for m in trainer_copy.mismatches
        if not m.startswith(tuple(f"- ds {k}." for k in DEEPSPEED_DTYPE_KEYS))
    ]
    if contradictions:
        raise AutotuneError(
            f'--base-args {path}: deepspeed contradicts the arguments ({"; ".join(contradictions)}): write "auto" there, or the same value'
        )
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.utils import logger as deepspeed_logger

    config = copy.deepcopy(trainer_copy.config)
    for keys in DEEPSPEED_FINALIZED_KEYS:
        node = config
        for key in keys[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict) and node.get(keys[-1]) == "auto":
            node[keys[-1]] = 1  # any positive number: the Trainer puts the model's figure there
    level = deepspeed_logger.level
    deepspeed_logger.setLevel(logging.ERROR)
    try:
        DeepSpeedConfig(config)
    except Exception as exc:  # noqa: BLE001 - pydantic, assertions, ValueError: DeepSpeed rejects it
        read_errors = getattr(exc, "errors", None)
        errors = read_errors() if callable(read_errors) else None  # pydantic: which entry, and why
        reason = f"{'.'.join(map(str, errors[0]['loc']))}: {errors[0]['msg']}" if errors else first_line(exc)
        raise AutotuneError(f"--base-args {path}: DeepSpeed rejects the deepspeed config: {reason}") from None
    finally:
        deepspeed_logger.setLevel(level)
