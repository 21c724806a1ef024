"""The ``fsdp`` lever: PyTorch FSDP (Zhao et al. 2023, arXiv:2304.11277) through the Trainer's own
integration, on CUDA only.

transformers 5 (training_args.py ``_process_fsdp_args``) takes ``fsdp=True`` with everything else in
``fsdp_config``; FSDP2 (``fully_shard``) is its default ``version``, whose ``reshard_after_forward``
picks the strategy: ``True`` frees each block's gathered parameters after its forward and gathers them
again in backward (FULL_SHARD: parameters, gradients and optimizer states sharded, like ZeRO-3);
``False`` keeps them gathered from forward to backward (SHARD_GRAD_OP, like ZeRO-2). The legacy string
form (``fsdp="full_shard"``) is still read back from ``--base-args`` (``_apply_legacy_fsdp_to_config``).

Not on the CPU: accelerate turns FSDP on only for its multi-GPU kinds (accelerate/state.py,
``AcceleratorState.__init__``: the FSDP branch sits under ``distributed_type in [MULTI_GPU, ...]``,
``MULTI_CPU`` not among them), so a CPU trial would train plain DDP under FSDP's name
(checked here: docs/scale-out.md). ZeRO and FSDP both shard the model: one or the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import CannotExpress, same_names
from autotune.levers._hooks import MemoryTraits
from autotune.levers._lever import Lever
from autotune.levers.distributed import ZERO_CHOICES, ZeroClash, apply_zero_clashes

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

FSDP_CHOICES = ("off", "full_shard", "shard_grad_op")
# FSDP2's reshard_after_forward for each strategy (transformers' legacy translation: full_shard -> True,
# shard_grad_op -> False).
RESHARD_AFTER_FORWARD = {"full_shard": True, "shard_grad_op": False}


def fsdp_training_args(value: str) -> dict[str, Any]:
    """The ``TrainingArguments`` of an ``fsdp`` value: the one home of its keys."""
    if value == "off":
        return {}
    return {"fsdp": True, "fsdp_config": {"version": 2, "reshard_after_forward": RESHARD_AFTER_FORWARD[value]}}


def fsdp_from_training_args(args: Mapping[str, Any]) -> str:
    """The ``fsdp`` value ``--base-args`` asks for: ``fsdp=True`` + ``fsdp_config``, or the legacy string."""
    fsdp = args.get("fsdp")
    if not fsdp:
        return "off"
    if isinstance(fsdp, (str, list)):  # the legacy form: "full_shard auto_wrap" or a list of options
        words = fsdp.split() if isinstance(fsdp, str) else [str(word) for word in fsdp]
        return "shard_grad_op" if "shard_grad_op" in words else "full_shard"
    config = args.get("fsdp_config") or {}
    reshard = config.get("reshard_after_forward", True) if isinstance(config, dict) else True
    return "full_shard" if str(reshard).lower() == "true" else "shard_grad_op"


def _unavailable_on(value: str, device: DeviceSpec) -> str:
    if value == "off" or device.kind == "cuda":
        return ""
    return (
        "FSDP runs on CUDA only: accelerate turns it on only for multi-GPU kinds, so on the CPU the "
        "Trainer would train plain DDP (docs/scale-out.md)"
    )


def _fsdp_memory(value: str, traits: MemoryTraits) -> MemoryTraits:
    return dataclasses.replace(traits, fsdp_reshards=RESHARD_AFTER_FORWARD.get(value))


FSDP = Lever(
    name="fsdp",
    value_type=str,
    default="off",
    doc="PyTorch FSDP (CUDA): full_shard shards parameters, gradients and optimizer states over ranks; shard_grad_op all but parameters",
    choices=FSDP_CHOICES,
    in_every_space=False,  # searched where a space names it: off is the Trainer's own default
    fields=("fsdp", "fsdp_config"),
    tool_keys={
        # axolotl's FSDP keys are its own (fsdp_version, fsdp_config of its own fields): not mapped yet.
        "axolotl": {field: CannotExpress("axolotl has no key for it") for field in ("fsdp", "fsdp_config")},
        "llama-factory": same_names("fsdp", "fsdp_config"),
    },
    to_training_args=fsdp_training_args,
    from_training_args=fsdp_from_training_args,
    label=lambda value: "" if value == "off" else f"fsdp={value}",
    unavailable_on=_unavailable_on,
    fallback="off",
    memory_parts=("weights", "gradients", "optimizer states"),
    memory_device_kinds=("cuda",),
    memory=_fsdp_memory,
)


def fsdp_or_zero(choices: dict[str, list[Any]], notes: list[str], source: str) -> dict[str, list[Any]]:
    """FSDP and ZeRO both shard the model over the ranks: a config runs one of them, not both."""
    every_zero = tuple(v for v in ZERO_CHOICES if v != "off")
    sharded = tuple(v for v in FSDP_CHOICES if v != "off")
    clash = ZeroClash(every_zero, "fsdp", sharded, "ZeRO and FSDP both shard the model: a trial runs one of them")
    return apply_zero_clashes(choices, notes, (clash,))
