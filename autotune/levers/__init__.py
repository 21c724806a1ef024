"""Every lever autotune searches, one entry each: the one home of a knob's rules.

A lever (:class:`Lever`) says what its choices are and how they are checked, where it runs (device,
packages, model, data), what it writes into ``TrainingArguments`` (or the model build, or the data
collator) and back, how tables name it, and which parts of the memory estimate it moves. The rest of
autotune loops over :data:`LEVERS`: ``TrialConfig`` has one field per lever (``autotune.config``),
the search-space YAML one key per lever (``autotune.space``), the export writes what the mapping
writes, and the estimator declares which levers it reads (``autotune.estimate``).

How to add a lever: docs/architecture.md, "Adding a lever".
"""

from __future__ import annotations

from autotune.levers._lever import ACTS_ON, MEMORY_PARTS, Lever
from autotune.levers.attention import (
    ATTN_IMPLEMENTATION,
    ATTN_IMPLEMENTATIONS,
    FLASH_ATTENTIONS,
    FUSED_ATTENTIONS,
    flash_attention_2_unavailable,
    flash_needs_half_precision,
)
from autotune.levers.batch import (
    BATCH_LIMIT_KNOBS,
    GRAD_ACCUM,
    MICRO_BATCH,
    SMALL_AUTO_MICRO_BATCHES,
    auto_micro_batches,
)
from autotune.levers.batching import PADDING, PADDINGS, SAMPLING, SAMPLINGS, padding_free_unsupported
from autotune.levers.compile import (
    COMPILE,
    COMPILE_CHOICES,
    COMPILE_MODE_SEPARATOR,
    CUDAGRAPH_COMPILE_MODES,
    split_compile,
)
from autotune.levers.dataloader import DATALOADER_WORKERS, PIN_MEMORY
from autotune.levers.distributed import (
    OFFLOAD_OPTIM,
    ZERO,
    ZERO_CHOICES,
    deepspeed_config,
    deepspeed_missing,
    read_deepspeed_config,
    zero_offloads,
    zero_stage,
    zero_with_other_levers,
)
from autotune.levers.fsdp import FSDP, FSDP_CHOICES, RESHARD_AFTER_FORWARD, fsdp_or_zero
from autotune.levers.kernels import LIGER, liger_unsupported
from autotune.levers.memory import CHECKPOINTING, EMPTY_CACHE_STEPS, checkpointing_field
from autotune.levers.optimizer import BNB_OPTIMIZERS, OPTIM, OPTIMIZERS, STATE_BYTES_PER_PARAM, STATES_IN_PARAM_DTYPE
from autotune.levers.precision import (
    DTYPE,
    DTYPES,
    HALF_DTYPES,
    WEIGHT_DTYPE,
    WEIGHT_DTYPES,
    WEIGHT_TORCH_DTYPES,
    bf16_weights_need_bf16_autocast,
)

# In the order of TrialConfig's fields and of a space's knobs (the order the sampler walks them).
LEVERS: dict[str, Lever] = {
    lever.name: lever
    for lever in (
        MICRO_BATCH, GRAD_ACCUM, CHECKPOINTING, DTYPE, OPTIM, DATALOADER_WORKERS, PIN_MEMORY, COMPILE,
        ATTN_IMPLEMENTATION, LIGER, PADDING, SAMPLING, EMPTY_CACHE_STEPS, WEIGHT_DTYPE, ZERO, FSDP,
    )
}

# Rules between two levers' choices, applied to a space once every lever's own filters ran.
# bf16 weights first: narrowing dtype to bf16 can keep flash attention in the space. ZeRO's rules
# before them: a ZeRO space drops bf16 weights before they narrow dtype.
COMBINATION_RULES = (zero_with_other_levers, fsdp_or_zero, bf16_weights_need_bf16_autocast, flash_needs_half_precision)

__all__ = [
    "ACTS_ON", "ATTN_IMPLEMENTATIONS", "BATCH_LIMIT_KNOBS", "BNB_OPTIMIZERS", "COMBINATION_RULES",
    "COMPILE_CHOICES", "COMPILE_MODE_SEPARATOR", "CUDAGRAPH_COMPILE_MODES", "DTYPES", "FLASH_ATTENTIONS",
    "FUSED_ATTENTIONS", "HALF_DTYPES", "LEVERS", "MEMORY_PARTS", "OPTIMIZERS", "PADDINGS", "SAMPLINGS",
    "SMALL_AUTO_MICRO_BATCHES", "STATE_BYTES_PER_PARAM", "STATES_IN_PARAM_DTYPE", "WEIGHT_DTYPES", "WEIGHT_TORCH_DTYPES", "Lever", "bf16_weights_need_bf16_autocast", "auto_micro_batches", "checkpointing_field", "flash_attention_2_unavailable",
    "liger_unsupported", "padding_free_unsupported", "split_compile",
    "FSDP", "FSDP_CHOICES", "RESHARD_AFTER_FORWARD", "fsdp_or_zero",
    "OFFLOAD_OPTIM", "ZERO_CHOICES", "deepspeed_config", "deepspeed_missing", "read_deepspeed_config", "zero_offloads", "zero_stage",
    "zero_with_other_levers",
]
