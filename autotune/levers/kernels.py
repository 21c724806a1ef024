"""The ``liger`` lever: Liger's Triton kernels patched into the model by the Trainer."""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._hooks import MemoryTraits
from autotune.levers._lever import Lever

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec
    from autotune.spec.models import ModelSpec


def _unavailable_on(value: bool, device: DeviceSpec) -> str:
    """Liger's kernels are Triton kernels: a CUDA device and the liger-kernel package."""
    if not value:
        return ""
    if device.kind != "cuda":
        return "Liger's Triton kernels need a CUDA device"
    if importlib.util.find_spec("liger_kernel") is None:
        return "the liger-kernel package is not installed (pip install liger-kernel)"
    return ""


def liger_unsupported(model: ModelSpec) -> str:
    """Why Liger's kernels would not patch this model; '' if they would.

    liger_kernel/transformers/monkey_patch.py (``_apply_liger_kernel_to_instance``) patches the model
    types of its ``MODEL_TYPE_TO_APPLY_LIGER_FN`` table and only logs for any other: the trial would
    measure the plain model under another name. Read from the installed package.
    """
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError:
        return "the liger-kernel package is not installed (pip install liger-kernel)"
    model_type = model.model_type
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        return f"Liger has no kernels for model type {model_type!r}"
    return ""


def _unavailable_for_model(
    value: bool, model: ModelSpec, _choices: Mapping[str, list[Any]], _base_args: Mapping[str, Any]
) -> str:
    return liger_unsupported(model) if value else ""


def fused_linear_cross_entropy_bytes(model: ModelSpec, tokens: int) -> int:
    """What Liger's fused linear cross-entropy keeps of the loss at its peak: ``4 (3 b s h + V h)`` bytes.

    liger_kernel/ops/fused_linear_cross_entropy.py never makes the ``b s V`` logits: it computes them
    in chunks of ``next_power_of_2(bs / ceil(V / h))`` rows, about ``b s h`` logits (up to twice that
    after the rounding), and computes the gradients in the forward: the input's (``b s h``) and the
    head weight's (``V h``), fp32. Counted: ``4 (2 b s h + b s h + V h)`` bytes.
    """
    return 4 * (3 * tokens * model.hidden_size + model.vocab_size * model.hidden_size)


def _liger_memory(value: bool, traits: MemoryTraits) -> MemoryTraits:
    """The fused loss's tensors, and the layer kernels' fewer saved tensors: LigerRMSNormFunction keeps its
    input and the per-row rstd (liger_kernel/ops/rms_norm.py: ``ctx.save_for_backward(X, W, RSTD)``),
    LigerSiLUMulFunction the gate's and the up projection's outputs, recomputing the activation
    (liger_kernel/ops/swiglu.py: ``ctx.save_for_backward(a, b)``; liger-kernel 0.8.5)."""
    if not value:
        return traits
    return dataclasses.replace(traits, logits=fused_linear_cross_entropy_bytes, fused_block_kernels=True)


def _axolotl_liger(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if not value:
        return {}, []
    # TRL applies Liger's layer kernels only, never its fused cross-entropy (sft_trainer.py:1127-1140).
    return {
        "plugins": ["axolotl.integrations.liger.LigerPlugin"],
        "liger_rope": True,
        "liger_rms_norm": True,
        "liger_glu_activation": True,
    }, []


LIGER = Lever(
    name="liger",
    value_type=bool,
    default=False,
    doc="use_liger_kernel: fused linear cross-entropy, RMSNorm, RoPE, SwiGLU kernels",
    in_every_space=False,
    fields=("use_liger_kernel",),
    tool_keys={
        "axolotl": {"use_liger_kernel": _axolotl_liger},
        "llama-factory": {"use_liger_kernel": lambda value, args: ({"enable_liger_kernel": bool(value)}, [])},
    },
    # transformers/trainer.py (Trainer.__init__) calls integrations/liger.py: apply_liger_kernel(model).
    to_training_args=lambda value: {"use_liger_kernel": True} if value else {},
    from_training_args=lambda args: bool(args["use_liger_kernel"]),
    label=lambda value: "liger" if value else "",
    unavailable_on=_unavailable_on,
    unavailable_for_model=_unavailable_for_model,
    fallback=False,
    memory_parts=("logits", "activations"),
    memory=_liger_memory,
)
