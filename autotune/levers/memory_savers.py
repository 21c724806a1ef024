"""Levers that trade time for memory: activation checkpointing, emptying the allocator's cache."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import same_names
from autotune.levers._lever import Lever
from autotune.trainers import get as trainer_named

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec


def checkpointing_field() -> str:
    """``activation_checkpointing`` in transformers 5 (``gradient_checkpointing`` is its deprecated alias).

    Kept on disk per installed versions (:mod:`autotune.spec.derived_cache`): it is read from the
    arguments class, whose import cost a search's parent 4-5 s of CPU at its end (the study note names
    the winner's arguments; py-spy of a one-trial CPU search, issue 29)."""
    from autotune.spec.derived_cache import cached

    return str(cached("checkpointing-field", {}, __file__, _checkpointing_field_of_transformers))


def _checkpointing_field_of_transformers() -> str:
    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def _checkpointing_from_training_args(args: Mapping[str, Any]) -> bool:
    return any(bool(args[field]) for field in CHECKPOINTING.fields if field in args)


def _axolotl_checkpointing(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if not value:
        return {"gradient_checkpointing": False}, []
    # Unset kwargs give axolotl's SFT use_reentrant=True (utils/config/__init__.py:395-401); the winner ran
    # transformers' default, use_reentrant=False (modeling_utils.py:3158), unless its arguments say otherwise.
    kwargs = args.get("activation_checkpointing_kwargs") or args.get("gradient_checkpointing_kwargs") or {}
    return {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False, **kwargs}}, []


def _lf_checkpointing(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # use_reentrant_gc defaults to true (model/model_utils/checkpointing.py:177-198); the winner ran
    # transformers' use_reentrant=False (modeling_utils.py:3158).
    kwargs = args.get("activation_checkpointing_kwargs") or args.get("gradient_checkpointing_kwargs") or {}
    if not value:
        return {"disable_gradient_checkpointing": True}, []
    return {"disable_gradient_checkpointing": False, "use_reentrant_gc": bool(kwargs.get("use_reentrant", False))}, []


CHECKPOINTING = Lever(
    name="checkpointing",
    value_type=bool,
    default=False,
    doc="activation (gradient) checkpointing",
    fields=("activation_checkpointing", "gradient_checkpointing"),
    tool_keys={
        "axolotl": {field: _axolotl_checkpointing for field in ("activation_checkpointing", "gradient_checkpointing")},
        # LLaMA-Factory turns checkpointing on itself and passes its own kwargs (hparams/model_args.py:145-152).
        "llama-factory": {field: _lf_checkpointing for field in ("activation_checkpointing", "gradient_checkpointing")},
    },
    to_training_args=lambda value: {checkpointing_field(): value},
    from_training_args=_checkpointing_from_training_args,
    label=lambda value: "ckpt" if value else "",
    memory_parts=("activations",),
    memory=lambda value, traits: dataclasses.replace(traits, recompute=value),
    best_practice=lambda device, choices: [False],
    last_resort=True,  # it costs a forward per step: the best-practice seed turns it on only where nothing fits
    planner_column="checkpointing",
)


def _empty_cache_unavailable_on(value: int, device: DeviceSpec) -> str:
    if value and device.kind == "cpu":
        # transformers/trainer.py calls accelerate/utils/memory.py: clear_device_cache, which empties
        # accelerator caches only: on the CPU the trial would measure 0 under another name.
        return "emptying the cache frees accelerator memory only"
    return ""


EMPTY_CACHE_STEPS = Lever(
    name="empty_cache_steps",
    value_type=int,
    default=0,
    doc="torch_empty_cache_steps: empty the allocator's cache every N optimizer steps (0: never)",
    least=0,
    in_every_space=False,
    fields=("torch_empty_cache_steps",),
    tool_keys={tool: same_names("torch_empty_cache_steps") for tool in ("axolotl", "llama-factory")},
    # transformers/trainer.py (training_step) -> accelerate/utils/memory.py: clear_device_cache.
    to_training_args=lambda value: {"torch_empty_cache_steps": value} if value else {},
    from_training_args=lambda args: int(args["torch_empty_cache_steps"] or 0),
    label=lambda value: f"empty_cache={value}" if value else "",
    unavailable_on=_empty_cache_unavailable_on,
    # It returns cached blocks to the device between steps: it does not change the tensors alive at
    # the peak, which is what the estimate counts.
)


def _offloading_unavailable_on(value: bool, device: DeviceSpec) -> str:
    if value and device.kind != "cuda":
        # trl/models/activation_offloading.py:151-152 asks torch.accelerator for the device to offload
        # from: without one SFTTrainer fails when it is built (sft_trainer.py:1189-1191; ran on the CPU).
        return "TRL's activation offloading moves activations from an accelerator to the host: it needs CUDA"
    return ""


def _offloading_unavailable_with_trainer(value: bool, trainer: str) -> str:
    if value and not trainer_named(trainer).offloads_activations:
        return "it is TRL's (SFTConfig.activation_offloading): train with --trainer sft"
    return ""


ACTIVATION_OFFLOADING = Lever(
    name="activation_offloading",
    value_type=bool,
    default=False,
    doc="--trainer sft: TRL's activation offloading, saved activations kept in pinned host memory (CUDA)",
    in_every_space=False,
    fields=("activation_offloading",),
    tool_keys={
        "axolotl": {
            "activation_offloading": lambda value, args: ({"activation_offloading": True} if value else {}, [])
        },
        "llama-factory": {
            "activation_offloading": lambda value, args: (
                ({}, ["LLaMA-Factory has no activation offloading key (use_unsloth_gc is a different mechanism)"])
                if value
                else ({}, [])
            )
        },
    },
    # trl/trainer/sft_trainer.py:1189-1193: training_step runs under the offloading context.
    to_training_args=lambda value: {"activation_offloading": True} if value else {},
    from_training_args=lambda args: bool(args["activation_offloading"]),
    label=lambda value: "offload-act" if value else "",
    unavailable_on=_offloading_unavailable_on,
    unavailable_with_trainer=_offloading_unavailable_with_trainer,
    fallback=False,
    memory_parts=("activations",),
    memory_device_kinds=("cuda",),
    memory=lambda value, traits: dataclasses.replace(traits, activations_offloaded=value),
)
