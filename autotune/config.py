"""A trial's knobs, and the one mapping from knobs to ``TrainingArguments`` keyword arguments.

The runner trains with exactly :func:`training_arguments_kwargs` (plus measurement-only arguments
such as ``max_steps``), and ``autotune export`` writes exactly the same dict: what was measured is
what the user gets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

DTYPES = ("fp32", "tf32", "fp16", "bf16")


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """One candidate training configuration: the values of every knob.

    Attributes:
        micro_batch: ``per_device_train_batch_size``.
        grad_accum: ``gradient_accumulation_steps``.
        checkpointing: Activation (gradient) checkpointing on or off.
        dtype: ``fp32``, ``tf32`` (fp32 storage, TF32 matmuls), ``fp16`` or ``bf16`` (mixed precision).
        optim: A ``transformers`` optimizer name (``adamw_torch_fused``, ``adafactor``, ...).
        dataloader_workers: ``dataloader_num_workers``.
        pin_memory: ``dataloader_pin_memory``.
        compile: ``off``, or the ``torch.compile`` backend to use (``inductor``, ...).
        attn_implementation: ``sdpa``, ``eager``, ``flash_attention_2``; ``None`` keeps the model default.
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

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step on one device."""
        return self.micro_batch * self.grad_accum

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> TrialConfig:
        """Build from an Optuna trial's params; knobs the space does not search keep their default."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in params.items() if k in known})

    def to_params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def short(self) -> str:
        """A compact one-line description for tables and logs."""
        parts = [f"mb={self.micro_batch}", f"ga={self.grad_accum}", self.dtype, self.optim]
        if self.checkpointing:
            parts.append("ckpt")
        if self.compile != "off":
            parts.append(f"compile={self.compile}")
        if self.dataloader_workers:
            parts.append(f"workers={self.dataloader_workers}")
        if self.attn_implementation:
            parts.append(f"attn={self.attn_implementation}")
        return " ".join(parts)


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
    kwargs: dict[str, Any] = dict(base_args or {})
    kwargs.update(
        per_device_train_batch_size=config.micro_batch,
        gradient_accumulation_steps=config.grad_accum,
        optim=config.optim,
        dataloader_num_workers=config.dataloader_workers,
        dataloader_pin_memory=config.pin_memory,
    )
    kwargs[checkpointing_field()] = config.checkpointing
    if config.dtype == "bf16":
        kwargs["bf16"] = True
    elif config.dtype == "fp16":
        kwargs["fp16"] = True
    elif config.dtype == "tf32":
        kwargs["tf32"] = True
    if config.compile != "off":
        kwargs["torch_compile"] = True
        kwargs["torch_compile_backend"] = config.compile
    if device_kind == "cpu":
        kwargs["use_cpu"] = True
    return kwargs


def checkpointing_field() -> str:
    """``activation_checkpointing`` in transformers 5 (``gradient_checkpointing`` is its deprecated alias)."""
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
