"""A trial's lever values (``TrialConfig``, one field per lever), and the loops over the levers'
hooks that turn them into what each part acts on.

The runner trains with exactly :func:`training_arguments_kwargs` (plus measurement-only arguments
such as ``max_steps``), and ``autotune export`` writes exactly the same dict: what was measured is
what the user gets. The child builds the model with :func:`model_build_kwargs`, its batches with
:func:`trial_batching` and its trainer from :func:`trainer_parts`; the estimator reads
:func:`memory_traits` and the throughput prior :func:`speed_traits` too. Each lever's own part lives with the lever (``autotune.levers``); these loops
name none.
"""

from __future__ import annotations

import dataclasses
import tempfile
import warnings
from typing import Any

from autotune.levers._exports import Mapper
from autotune.levers._hooks import PADDED, TRANSFORMERS_TRAINER, Batching, MemoryTraits, SpeedTraits, TrainerParts
from autotune.levers._registry import LEVERS
from autotune.levers.batch import BATCH_LIMITS


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """One candidate training configuration: the value of every lever (``autotune.levers``).

    One field per lever of :data:`~autotune.levers.LEVERS`, in its order, typed and defaulted as the
    lever says (``tests/levers/test_lever_home.py`` checks that they match).
    """

    micro_batch: int = 8
    grad_accum: int = 1
    checkpointing: bool = False
    dtype: str = "fp32"
    optim: str = "adamw_torch"
    dataloader_workers: int = 0
    pin_memory: bool = True
    compile: str = "off"
    attn_implementation: str | None = None
    liger: bool = False
    padding: str = "max_length"
    sampling: str = "random"
    empty_cache_steps: int = 0
    weight_dtype: str = "fp32"
    zero: str = "off"
    fsdp: str = "off"
    packing: str = "off"
    activation_offloading: bool = False
    precompute_ref_log_probs: bool = False

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step on one device."""
        return self.micro_batch * self.grad_accum

    @property
    def precision(self) -> str:
        """The precision the matmuls are asked to run in (``fp32``, ``tf32``, ``fp16``, ``bf16``);
        what ran is read back by the child (``autotune.runner._precision``)."""
        return self.dtype

    @property
    def compiled_as(self) -> str | None:
        """How ``torch.compile`` compiles the model (``inductor``, ``inductor:max-autotune``, ...);
        ``None``: not compiled."""
        return None if self.compile == "off" else self.compile

    @property
    def recomputes_forward(self) -> bool:
        """Whether the backward pass recomputes each layer's forward (activation checkpointing)."""
        return self.checkpointing

    @property
    def shards_over_ranks(self) -> bool:
        """Whether the model's states are sharded over a process group (ZeRO, FSDP), even of one rank."""
        return self.zero != "off" or self.fsdp != "off"

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrialConfig:
        """Build from an Optuna trial's params; levers the space does not search keep their default.

        Under a ``global_batch`` or ``max_global_batch`` param (:data:`BATCH_LIMITS`), the
        accumulation is derived: the most micro-batches that fit, ``limit // micro_batch``.
        """
        values = {k: v for k, v in params.items() if k in LEVERS}
        for limit in BATCH_LIMITS:
            if limit in params:
                values["grad_accum"] = int(params[limit]) // int(
                    values.get("micro_batch", LEVERS["micro_batch"].default)
                )
        return cls(**values)

    def to_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        """A compact one-line description for tables and logs: the levers shown at every value
        (micro-batch, accumulation, dtype, optimizer) first, then every other lever not at its default."""
        always = [lever for lever in LEVERS.values() if lever.label(lever.default)]
        others = [lever for lever in LEVERS.values() if lever not in always]
        words = [lever.label(getattr(self, lever.name)) for lever in always + others]
        return " ".join(word for word in words if word)


def training_arguments_kwargs(
    config: TrialConfig, device_kind: str, base_args: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The ``TrainingArguments`` keyword arguments a trial config sets: the single mapping.

    Args:
        config: The trial's lever values.
        device_kind: ``cpu`` or ``cuda``: on ``cpu`` the arguments say ``use_cpu=True``.
        base_args: Arguments the user fixed (``--base-args``); levers win only where the user did not
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


def lever_values_from_base_args(base_args: dict[str, Any]) -> dict[str, Any]:
    """The lever values that reproduce what ``base_args`` fix: the inverse of the mapping above.

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


def model_build_kwargs(config: TrialConfig) -> dict[str, Any]:
    """The keyword arguments of the model's ``from_config`` the config's levers set (each lever's
    ``to_model_build``): what ``autotune.spec.models.build_model`` is called with in the child."""
    kwargs: dict[str, Any] = {}
    for lever in LEVERS.values():
        kwargs.update(lever.to_model_build(getattr(config, lever.name)))
    return kwargs


def trial_batching(config: TrialConfig) -> Batching:
    """How the config's samples become micro-batches: the one lever that shapes them, or padding to
    ``--seq-len``.

    Raises:
        ValueError: Two levers shape the batches (a lever's design error, caught by the lever tests).
    """
    shaped = [(lever.name, b) for lever in LEVERS.values() if (b := lever.to_batching(getattr(config, lever.name)))]
    if len(shaped) > 1:
        raise ValueError(f"levers {', '.join(name for name, _ in shaped)} both shape the batches")
    return shaped[0][1] if shaped else PADDED


def trainer_parts(config: TrialConfig, trainer: TrainerParts = TRANSFORMERS_TRAINER) -> TrainerParts:
    """The trainer the config trains through: the workload's (``trainer``: ``transformers``' ``Trainer``
    and ``TrainingArguments``, or TRL's ``SFTTrainer`` and ``SFTConfig`` under ``--trainer sft``), or the
    classes one lever may choose over the Trainer's, and every lever's keyword arguments for it.

    Raises:
        ValueError: Two levers choose the trainer, or a lever chooses one over the workload's.
    """

    def classes(parts: TrainerParts) -> tuple[str, str]:
        return parts.trainer, parts.arguments

    chosen = trainer
    kwargs: dict[str, Any] = dict(trainer.kwargs)
    for lever in LEVERS.values():
        parts = lever.to_trainer(getattr(config, lever.name))
        if parts is None:
            continue
        if classes(parts) != classes(TRANSFORMERS_TRAINER):
            if classes(chosen) != classes(TRANSFORMERS_TRAINER):
                raise ValueError(f"lever {lever.name} chooses a trainer, and the trial has its trainer already")
            chosen = parts
        kwargs.update(parts.kwargs)
    return dataclasses.replace(chosen, kwargs=kwargs)


def lever_tool_keys(tool: str) -> dict[str, Mapper]:
    """Every lever field as the tool ``tool`` says it (each lever's ``tool_keys``: a mapper to the tool's
    keys, or why it cannot), by field: what ``autotune.views.sft_tool_yaml`` reads."""
    return {field: mapper for lever in LEVERS.values() for field, mapper in lever.tool_keys.get(tool, {}).items()}


def memory_traits(config: TrialConfig, device_kind: str) -> MemoryTraits:
    """What the config's lever values mean for its memory on a ``device_kind`` device: each lever's
    ``memory`` hook, where the lever moves memory on that kind (``Lever.changes_memory_on``)."""
    traits = MemoryTraits()
    for lever in LEVERS.values():
        if lever.memory is not None and lever.changes_memory_on(device_kind):
            traits = lever.memory(getattr(config, lever.name), traits)
    return traits


def speed_traits(config: TrialConfig) -> SpeedTraits:
    """What the config's lever values mean for its step time beyond their memory traits: each lever's
    ``speed`` hook (``autotune.estimate``'s throughput prior reads both)."""
    traits = SpeedTraits()
    for lever in LEVERS.values():
        if lever.speed is not None:
            traits = lever.speed(getattr(config, lever.name), traits)
    return traits
