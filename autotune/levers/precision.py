"""The ``dtype`` lever: the precision of the matmuls (mixed precision over fp32 master weights)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._lever import Lever

if TYPE_CHECKING:
    from autotune.devices import DeviceSpec

# fp32; tf32 (fp32 storage, TF32 matmuls); fp16 / bf16: autocast over fp32 master weights (HF Trainer).
DTYPES = ("fp32", "tf32", "fp16", "bf16")
HALF_DTYPES = ("fp16", "bf16")
_FIELDS = ("bf16", "fp16", "tf32")


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


DTYPE = Lever(
    name="dtype",
    value_type=str,
    default="fp32",
    doc="fp32, tf32 (TF32 matmuls), fp16 or bf16 (mixed precision)",
    choices=DTYPES,
    fields=_FIELDS,
    to_training_args=_to_training_args,
    from_training_args=_from_training_args,
    label=lambda value: value,
    unavailable_on=_unavailable_on,
    memory_parts=("weights", "activations"),
)
