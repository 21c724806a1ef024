"""A trial's knobs (one field per lever), and the one mapping from knobs to ``TrainingArguments``.

The runner trains with exactly :func:`training_arguments_kwargs` (plus measurement-only arguments
such as ``max_steps``), and ``autotune export`` writes exactly the same dict: what was measured is
what the user gets. Each lever's own part of the mapping lives with the lever (``autotune.levers``).
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from typing import Any

from autotune.levers._registry import LEVERS
from autotune.levers.batch import BATCH_LIMIT_KNOBS
from autotune.levers.compile import split_compile


class _TrialConfigMethods:
    """What every trial config can say about itself; the fields come from :data:`LEVERS`."""

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step on one device."""
        return self.micro_batch * self.grad_accum  # type: ignore[attr-defined]

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrialConfig:
        """Build from an Optuna trial's params; knobs the space does not search keep their default.

        Under a ``global_batch`` or ``max_global_batch`` param (:data:`BATCH_LIMIT_KNOBS`), the
        accumulation is derived: the most micro-batches that fit, ``limit // micro_batch``.
        """
        values = {k: v for k, v in params.items() if k in LEVERS}
        for limit in BATCH_LIMIT_KNOBS:
            if limit in params:
                values["grad_accum"] = int(params[limit]) // int(
                    values.get("micro_batch", LEVERS["micro_batch"].default)
                )
        return cls(**values)

    def to_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def short(self) -> str:
        """A compact one-line description for tables and logs: the levers shown at every value
        (micro-batch, accumulation, dtype, optimizer) first, then every other lever not at its default."""
        always = [lever for lever in LEVERS.values() if lever.label(lever.default)]
        others = [lever for lever in LEVERS.values() if lever not in always]
        words = [lever.label(getattr(self, lever.name)) for lever in always + others]
        return " ".join(word for word in words if word)

    @property
    def compile_backend_and_mode(self) -> tuple[str | None, str | None]:
        """``compile`` split into (backend, mode): ``(None, None)`` for ``off``."""
        return split_compile(self.compile)  # type: ignore[attr-defined]


# One frozen field per lever, named as the lever, with its default: a lever added to
# autotune.levers is a field here without another line to write.
TrialConfig = dataclasses.make_dataclass(
    "TrialConfig",
    [
        (
            lever.name,
            lever.value_type if lever.default is not None else lever.value_type | None,
            dataclasses.field(default=lever.default),
        )
        for lever in LEVERS.values()
    ],
    bases=(_TrialConfigMethods,),
    frozen=True,
)
TrialConfig.__module__ = __name__  # pickled by name into each trial child (make_dataclass's module= is 3.12+)
TrialConfig.__doc__ = """One candidate training configuration: the value of every lever (``autotune.levers``)."""


def training_arguments_kwargs(
    config: TrialConfig, device_kind: str, base_args: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``TrainingArguments`` keyword arguments a trial config sets: the single mapping.

    Args:
        config: The trial's knobs.
        device_kind: ``cpu`` or ``cuda``: on ``cpu`` the arguments say ``use_cpu=True``.
        base_args: Arguments the user fixed (``--base-args``); knobs win only where the user did not
            fix the same field (conflicts are removed from the search space before this point).

    Returns:
        A dict that ``TrainingArguments(output_dir=..., **kwargs)`` accepts.
    """
    fixed = base_args or {}
    kwargs: dict[str, Any] = dict(fixed)
    for lever in LEVERS.values():
        # A field the user fixed keeps the user's value: the lever was fixed to the value that
        # reproduces it, and where the inverse is lossy (a DeepSpeed config holds more than its
        # ZeRO stage) the user's whole value is what they asked for.
        kwargs.update({k: v for k, v in lever.to_training_args(getattr(config, lever.name)).items() if k not in fixed})
    if device_kind == "cpu":
        kwargs["use_cpu"] = True
    return kwargs


def knob_values_from_base_args(base_args: dict[str, Any]) -> dict[str, Any]:
    """The knob values that reproduce what ``base_args`` fix: the inverse of the mapping above.

    For every lever one of whose ``fields`` the user set, the value for which
    :func:`training_arguments_kwargs` writes the same arguments (the user's other fields pass
    through unchanged). Levers the base arguments do not touch are absent.
    """
    return {
        lever.name: lever.from_training_args(base_args)
        for lever in LEVERS.values()
        if lever.from_training_args is not None and any(field in base_args for field in lever.fields)
    }


# Fields whose value TrainingArguments judges against the process that builds it (TF32 needs an
# Ampere GPU) or that pull in a whole integration (DeepSpeed, FSDP): left out of the comparison below,
# where they resolve no other lever field.
_NOT_COMPARED = ("tf32", "deepspeed", "fsdp", "fsdp_config", "use_cpu")


def with_levers_off_explicit(kwargs: dict[str, Any], arguments_class: type) -> dict[str, Any]:
    """``kwargs`` for ``arguments_class``, a ``TrainingArguments`` subclass whose defaults differ (TRL's
    ``SFTConfig``: bf16 on, gradient checkpointing on; trl/trainer/base_config.py:54-75, :107-108).

    A lever at its default writes nothing: it means ``TrainingArguments``' own value. Under a subclass
    that resolves a lever field otherwise, that field is written with ``TrainingArguments``' resolved
    value, so a config means the same run under either class (``fp32`` is no bf16 autocast, ``checkpointing:
    false`` no checkpointing). Both classes are built with the levers' own fields to resolve them
    (``bf16`` follows ``fp16`` in SFTConfig: ``bf16 = not fp16``).
    """
    from transformers import TrainingArguments

    if arguments_class is TrainingArguments:
        return kwargs
    declared = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    subclass_declared = {f.name: f.default for f in dataclasses.fields(arguments_class)}
    lever_fields = {field for lever in LEVERS.values() for field in lever.fields if field in declared}
    differing = sorted(f for f in lever_fields - set(kwargs) if declared[f] != subclass_declared.get(f))
    if not differing:
        return kwargs
    levers_only = {k: v for k, v in kwargs.items() if k in lever_fields and k not in _NOT_COMPARED}
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # transformers 5.24 warns that gradient_checkpointing is deprecated
        plain = TrainingArguments(output_dir=scratch, use_cpu=True, **levers_only)
        subclass = arguments_class(output_dir=scratch, use_cpu=True, **levers_only)
    explicit = {f: getattr(plain, f) for f in differing if getattr(plain, f) != getattr(subclass, f)}
    return {**kwargs, **explicit}
