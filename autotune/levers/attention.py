"""The ``attn_implementation`` lever: the attention kernel the model is built with."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._hooks import MemoryTraits
from autotune.levers._lever import Lever
from autotune.levers._pairs import PairRule

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec
    from autotune.spec.models import ModelSpec

# What transformers 5 offers for training (transformers/modeling_utils.py: AttentionInterface
# ._global_mapping, plus "eager"; "paged|eager" serves generation only). The installed version is
# checked against this list in tests/levers/test_levers.py.
ATTN_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
# The FlashAttention implementations transformers offers (modeling_utils.py: AttentionInterface).
FLASH_ATTENTIONS = ("flash_attention_2", "flash_attention_3")
# Attention kernels that keep no s x s scores (tiled: FlashAttention, Dao et al. 2022; flex attention).
FUSED_ATTENTIONS = (*FLASH_ATTENTIONS, "flex_attention")
# The package each flash implementation imports (transformers/utils/import_utils.py:
# is_flash_attn_2_available / is_flash_attn_3_available).
_FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}


def _unavailable_on(value: str, device: DeviceSpec) -> str:
    """Flash kernels need CUDA and their package (FlashAttention 3: Hopper); flex attention a GPU."""
    if value == "flash_attention_2":
        return flash_attention_2_unavailable(device) or ""
    if value in FLASH_ATTENTIONS:
        package = _FLASH_PACKAGES[value]
        if device.kind != "cuda" or importlib.util.find_spec(package) is None:
            return f"it needs a CUDA device and the {package} package"
        if value == "flash_attention_3" and (device.compute_capability or (0, 0)) < (9, 0):
            return "FlashAttention 3 runs on Hopper (compute capability 9.0) and newer"
    if value == "flex_attention" and device.kind != "cuda":
        # transformers/integrations/flex_attention.py compiles flex_attention; its fused kernels are
        # generated for GPUs, and on the CPU the training backward is not fused.
        return "its compiled kernels need a CUDA device"
    return ""


def flash_attention_2_unavailable(device: DeviceSpec) -> str | None:
    """Why ``flash_attention_2`` cannot run on ``device`` here; ``None`` where it can.

    flash-attn 2 runs on Ampere and newer GPUs only (its README: "Ampere, Ada, or Hopper GPUs"), and
    its CUDA extension is compiled against one torch: a wheel built for another raises ImportError
    ("undefined symbol") on import, which transformers' ``is_flash_attn_2_available`` (a package
    look-up, transformers/utils/import_utils.py) does not catch. So the package is imported here.
    """
    if device.kind != "cuda":
        return "it needs a CUDA device"
    if device.compute_capability is not None and device.compute_capability < (8, 0):
        return f"flash-attn 2 needs an Ampere or newer GPU; {device.name} is compute capability {device.compute_capability[0]}.{device.compute_capability[1]}"
    return _flash_attn_import_error()


@functools.lru_cache(maxsize=1)
def _flash_attn_import_error() -> str | None:
    if importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed"
    try:
        importlib.import_module("flash_attn")
    except Exception as exc:  # noqa: BLE001 - ImportError/OSError of an extension built for another torch
        return f"flash_attn does not import against the installed torch ({type(exc).__name__}: {str(exc)[:120]})"
    return None


def _unavailable_for_model(
    value: str, model: ModelSpec, _choices: Mapping[str, list[Any]], _base_args: Mapping[str, Any]
) -> str:
    """Why ``model`` cannot be built with ``value`` (first line of transformers' error); '' if it can.

    Asks transformers itself: the model is built on the meta device (no memory), which runs the same
    check as ``from_pretrained(attn_implementation=...)``. That build imports the architecture's modeling
    code, about 2.4 s of CPU at every search start on a 2-core machine: the answer is kept on disk
    (``autotune.spec.derived_cache``: per config, task, kernel and installed torch and transformers), except
    for the flash kernels, whose answer also follows from their own package (``_FLASH_PACKAGES``).
    """
    if value in FLASH_ATTENTIONS:
        return _built_on_meta(value, model.hf_config, model.task)
    from autotune.spec.derived_cache import cached

    key = {"config": model.hf_config, "task": model.task, "attn_implementation": value}
    return str(cached("attention-build", key, __file__, lambda: _built_on_meta(value, model.hf_config, model.task)))


def _built_on_meta(value: str, hf_config: Mapping[str, Any], task: str) -> str:
    """The first line of transformers' error building the model with ``value`` on the meta device; '' if it builds."""
    import torch

    from autotune.spec.models import build_model

    try:
        with torch.device("meta"):
            build_model(hf_config, task, **_to_model_build(value))
    except (ValueError, ImportError) as exc:
        return str(exc).strip().splitlines()[0][:200]
    return ""


def _flash_conflict(attention: str | None, dtype: str) -> str:
    """Flash attention computes in fp16/bf16 only: transformers/integrations/flash_attention.py
    (get_target_dtype) casts fp32 queries to the autocast dtype, and without autocast (fp32, tf32) to
    the weights' fp32, which the flash kernels reject."""
    if attention in FLASH_ATTENTIONS and dtype in ("fp32", "tf32"):
        return f"{attention} computes in fp16/bf16 only"
    return ""


FLASH_NEEDS_HALF_PRECISION = PairRule(
    levers=("attn_implementation", "dtype"), conflict=_flash_conflict, fix="add sdpa, or a 16-bit dtype"
)


def _to_model_build(value: str | None) -> dict[str, Any]:
    """``from_config(attn_implementation=...)``; nothing for the model's default."""
    return {"attn_implementation": value} if value is not None else {}


def _attention_memory(value: str | None, traits: MemoryTraits) -> MemoryTraits:
    """Eager keeps the ``a x s x s`` scores; the tiled kernels keep none, and the flash kernels keep
    flattened samples apart from their position ids (no mask); ``None`` is the model's default."""
    if value is None:
        return traits
    kind = "tiled" if value in FUSED_ATTENTIONS else "materialized" if value == "eager" else "default"
    return dataclasses.replace(traits, attention=kind, reads_boundaries=value in FLASH_ATTENTIONS)


ATTN_IMPLEMENTATION = Lever(
    name="attn_implementation",
    value_type=str,
    default=None,  # the model's default (sdpa where the architecture supports it)
    doc="the attention kernel the model is built with (from_config(attn_implementation=...))",
    choices=ATTN_IMPLEMENTATIONS,
    in_every_space=False,
    acts_on="model",
    to_model_build=_to_model_build,
    label=lambda value: f"attn={value}" if value else "",
    export_note=lambda value: (
        (
            f"the winner's model was built with attn_implementation={value!r}: pass it to from_pretrained or "
            "from_config (a model argument; TrainingArguments has no field for it)"
        )
        if value
        else ""
    ),
    unavailable_on=_unavailable_on,
    unavailable_for_model=_unavailable_for_model,
    memory_parts=("activations",),
    memory=_attention_memory,
    best_practice=lambda device, choices: ["flash_attention_2", "sdpa"],
    nearest={None: ("sdpa",)},  # transformers' default where the model supports it
)
