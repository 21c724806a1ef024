"""Dataloader levers: worker processes and pinned host memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from autotune.levers._exports import same_names
from autotune.levers._lever import Lever

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec


def _workers_best_practice(device: DeviceSpec, choices: Sequence[int]) -> list[int]:
    """On a GPU, workers overlap data loading with compute (the fewest the space offers above 0); on
    the CPU, they compete with training for the same cores."""
    return sorted(w for w in choices if w > 0) if device.kind == "cuda" else [0]


DATALOADER_WORKERS = Lever(
    name="dataloader_workers",
    value_type=int,
    default=0,
    doc="dataloader_num_workers",
    least=0,
    fields=("dataloader_num_workers",),
    tool_keys={tool: same_names("dataloader_num_workers") for tool in ("axolotl", "llama-factory")},
    to_training_args=lambda value: {"dataloader_num_workers": value},
    from_training_args=lambda args: int(args["dataloader_num_workers"]),
    label=lambda value: f"workers={value}" if value else "",
    # On the CPU each worker is a fork of the trial process whose resident set the probe counts
    # (autotune.estimate: context_bytes); on CUDA they hold no device memory.
    memory_parts=("context",),
    memory_device_kinds=("cpu",),
    memory=lambda value, traits: dataclasses.replace(traits, forked_workers=value),
    best_practice=_workers_best_practice,
)


def _pin_no_effect_on(value: bool, device: DeviceSpec) -> str:
    return "pinning only speeds up copies to a GPU" if value and device.kind == "cpu" else ""


PIN_MEMORY = Lever(
    name="pin_memory",
    value_type=bool,
    default=True,
    doc="dataloader_pin_memory",
    fields=("dataloader_pin_memory",),
    tool_keys={tool: same_names("dataloader_pin_memory") for tool in ("axolotl", "llama-factory")},
    to_training_args=lambda value: {"dataloader_pin_memory": value},
    from_training_args=lambda args: bool(args["dataloader_pin_memory"]),
    no_effect_on=_pin_no_effect_on,
    fallback=False,
    best_practice=lambda device, choices: [device.kind == "cuda"],  # pinned memory speeds copies to a GPU
)
