"""Batch levers: the micro-batch and gradient accumulation (samples per optimizer step)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.levers._lever import Lever

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

# Under a global-batch constraint the space holds one of these as a fixed (single-choice) knob, and
# accumulation is not searched but derived from it: ``limit // micro_batch``. Optuna samples knobs
# independently and cannot change a knob's choices between trials, so deriving one of the pair is
# how every trial gets an allowed product (see space.constrain_global_batch, search_spaces/README.md).
BATCH_LIMIT_KNOBS = ("global_batch", "max_global_batch")


# ``auto``'s micro-batches below 8: what a decoder LLM at 1k-8k tokens trains at on one GPU, with
# accumulation. They are searched only where the estimate says the larger ones do not fit
# (autotune.space: drop_unneeded_small_micro_batches). One sample is already ``seq_len`` rows of
# every projection's matmul, so the dimension tensor cores want aligned is tokens, not samples.
SMALL_AUTO_MICRO_BATCHES = (1, 2, 4)


def auto_micro_batches(device: DeviceSpec) -> list[int]:
    """``micro_batch: auto``: 1, 2 and 4 (kept only where needed, see :data:`SMALL_AUTO_MICRO_BATCHES`),
    then multiples of 8 (tensor cores want 8-aligned dims for fp16/bf16, per NVIDIA's deep learning
    performance guide); from 64 up, multiples of 64 on Ampere and newer, whose guide prefers 128-byte
    (64-element) alignment.
    """
    small = [*SMALL_AUTO_MICRO_BATCHES, 8, 16, 24, 32, 48]
    if device.kind == "cuda" and (device.compute_capability or (0, 0)) >= (8, 0):
        return small + [64, 128, 192, 256, 384, 512]
    return small + [64, 96, 128, 192, 256]


MICRO_BATCH = Lever(
    name="micro_batch",
    value_type=int,
    default=8,
    doc="per_device_train_batch_size (a list, or auto)",
    least=1,
    auto_choices=auto_micro_batches,
    fields=("per_device_train_batch_size",),
    to_training_args=lambda value: {"per_device_train_batch_size": value},
    from_training_args=lambda args: int(args["per_device_train_batch_size"]),
    label=lambda value: f"mb={value}",
    memory_parts=("activations", "logits"),
)

GRAD_ACCUM = Lever(
    name="grad_accum",
    value_type=int,
    default=1,
    doc="gradient_accumulation_steps",
    least=1,
    fields=("gradient_accumulation_steps",),
    to_training_args=lambda value: {"gradient_accumulation_steps": value},
    from_training_args=lambda args: int(args["gradient_accumulation_steps"]),
    label=lambda value: f"ga={value}",
)
