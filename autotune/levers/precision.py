"""The precision levers: ``dtype``, the precision of the matmuls (mixed precision over fp32 master
weights), and ``weight_dtype``, the dtype the model's weights are built in."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import same_names
from autotune.levers._lever import Lever
from autotune.levers._pairs import PairRule

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

# fp32; tf32 (fp32 storage, TF32 matmuls); fp16 / bf16: autocast over fp32 master weights (HF Trainer).
DTYPES = ("fp32", "tf32", "fp16", "bf16")
HALF_DTYPES = ("fp16", "bf16")
# The TrainingArguments fields the ``dtype`` lever sets. TrainingArguments judges them against the device
# of the process that builds it (``__post_init__``: bf16 needs a GPU or CPU that runs it, tf32 an Ampere
# GPU); autotune judges them against the trials' device instead (``unavailable_on``).
PRECISION_FIELDS = ("bf16", "fp16", "tf32")
_FIELDS = PRECISION_FIELDS


def _to_training_args(value: str) -> dict[str, Any]:
    return {value: True} if value in _FIELDS else {}


def _from_training_args(args: Mapping[str, Any]) -> str:
    # bf16/fp16 are the mixed-precision modes; tf32 alone means fp32 storage with TF32 matmuls.
    set_true = [field for field in _FIELDS if args.get(field)]
    return set_true[0] if set_true else "fp32"


def _unavailable_on(value: str, device: DeviceSpec) -> str:
    if value not in device.supported_dtypes:
        return f"{device.label} ({device.name}) does not support it"
    return ""


def _dtype_best_practice(device: DeviceSpec, choices: Sequence[str]) -> list[str]:
    """The fastest dtype the device has matmul hardware for (a performance guide's first try)."""
    return [dtype for dtype in ("bf16", "fp16", "tf32", "fp32") if dtype in device.fast_dtypes]


def _emulated_on(value: str, device: DeviceSpec) -> str:
    return device.emulation_reason(value)


def _auto_dtypes(device: DeviceSpec) -> list[str]:
    """``dtype: auto``: the dtypes the device trains in; the device filter then leaves out those it
    only emulates (:attr:`Lever.slow_on`), with a note."""
    return [dtype for dtype in DTYPES if dtype in device.supported_dtypes]


DTYPE = Lever(
    name="dtype",
    value_type=str,
    default="fp32",
    doc="fp32, tf32 (TF32 matmuls), fp16 or bf16 (mixed precision); auto: those the device has matmul hardware for",
    choices=DTYPES,
    auto_choices=_auto_dtypes,
    absent_means_auto=False,
    fields=_FIELDS,
    tool_keys={tool: same_names(*_FIELDS) for tool in ("axolotl", "llama-factory")},
    to_training_args=_to_training_args,
    from_training_args=_from_training_args,
    label=lambda value: value,
    unavailable_on=_unavailable_on,
    slow_on=_emulated_on,
    memory_parts=("weights", "activations"),
    memory=lambda value, traits: dataclasses.replace(traits, half_autocast=value in HALF_DTYPES),
    best_practice=_dtype_best_practice,
    nearest={"fp32": ("tf32", "bf16", "fp16")},
    planner_column="dtype",
)


# The dtype the model's weights are built in (and so its gradients and, for torch's optimizers, its
# optimizer states: torch.optim.AdamW's exp_avg / exp_avg_sq are ``torch.zeros_like(p)``).
# fp16 is not offered: pure fp16 training needs fp32 master weights for loss scaling
# (torch.amp.GradScaler refuses fp16 gradients: "Attempting to unscale FP16 gradients").
WEIGHT_DTYPES = ("fp32", "bf16")
# What the export tells the user to pass to from_pretrained / from_config (transformers 5 names the
# argument ``dtype``; ``torch_dtype`` is its deprecated alias, modeling_utils.py ``_from_config``).
WEIGHT_TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
# Bytes per weight (its gradient and parameter-dtype optimizer states alike).
WEIGHT_BYTES = {"fp32": 4, "bf16": 2}


def _weight_dtype_unavailable_on(value: str, device: DeviceSpec) -> str:
    if value == "bf16" and "bf16" not in device.supported_dtypes:
        return f"{device.label} ({device.name}) has no bf16"
    return ""


def _bf16_weights_conflict(dtype: str, weight_dtype: str) -> str:
    """bf16 weights run with ``dtype: bf16`` only.

    With the weights in bf16 every matmul runs in bf16 whatever ``dtype`` says, so the only pair
    that means what it says is bf16 weights + bf16 autocast (the Trainer's ``bf16=True``:
    accelerate's autocast keeps the softmax, norms and loss in fp32): fp32/tf32 would run bf16
    matmuls under an fp32 name (the precision read back, the MFU peak and tf32 itself would be
    wrong), and fp16 autocast would cast bf16 weights into fp16's narrower range under a grad
    scaler meant for fp32 master weights.
    """
    if weight_dtype == "bf16" and dtype != "bf16":
        return "bf16 weights train with dtype bf16 (bf16 autocast) only"
    return ""


BF16_WEIGHTS_NEED_BF16_AUTOCAST = PairRule(
    levers=("dtype", "weight_dtype"), conflict=_bf16_weights_conflict, fix="add bf16 to dtype, or fp32 to weight_dtype"
)


WEIGHT_DTYPE = Lever(
    name="weight_dtype",
    value_type=str,
    default="fp32",
    doc="the dtype the model is built in: fp32 master weights, or bf16 weights, gradients and optimizer states",
    choices=WEIGHT_DTYPES,
    acts_on="model",
    # Always passed: without it from_config builds in the config's own dtype (autotune.spec.models.build_model).
    to_model_build=lambda value: {"dtype": WEIGHT_TORCH_DTYPES[value]},
    label=lambda value: "" if value == "fp32" else f"weights={value}",
    export_note=lambda value: (
        ""
        if value == "fp32"
        else (
            f"the winner's model was built in {value}: pass dtype=torch.{WEIGHT_TORCH_DTYPES[value]} to from_pretrained "
            "or from_config (torch_dtype= before transformers 5), and keep bf16=True; the optimizer then keeps its "
            "states in bf16 too"
        )
    ),
    unavailable_on=_weight_dtype_unavailable_on,
    slow_on=_emulated_on,
    memory_parts=("weights", "gradients", "optimizer states", "activations"),
    memory=lambda value, traits: dataclasses.replace(traits, weight_bytes=WEIGHT_BYTES[value]),
)
