"""The registry: every lever in ``TrialConfig`` field order, the rules between two levers, and the order
in which an ``auto`` space is narrowed by the memory prior."""

from __future__ import annotations

from autotune.levers._lever import Lever
from autotune.levers.attention import (
    ATTN_IMPLEMENTATION,
    flash_needs_half_precision,
)
from autotune.levers.batch import (
    GRAD_ACCUM,
    MICRO_BATCH,
)
from autotune.levers.batching import PADDING, SAMPLING
from autotune.levers.compile import (
    COMPILE,
)
from autotune.levers.dataloader import DATALOADER_WORKERS, PIN_MEMORY
from autotune.levers.distributed import (
    ZERO,
    zero_with_other_levers,
)
from autotune.levers.fsdp import FSDP, fsdp_or_zero
from autotune.levers.kernels import LIGER
from autotune.levers.memory_savers import ACTIVATION_OFFLOADING, CHECKPOINTING, EMPTY_CACHE_STEPS
from autotune.levers.optimizer import OPTIM
from autotune.levers.packing import PACKING
from autotune.levers.precision import (
    DTYPE,
    WEIGHT_DTYPE,
    bf16_weights_need_bf16_autocast,
)
from autotune.levers.reference import PRECOMPUTE_REF_LOG_PROBS

# In the order of TrialConfig's fields and of a space's levers (the order the sampler walks them).
LEVERS: dict[str, Lever] = {
    lever.name: lever
    for lever in (
        MICRO_BATCH,
        GRAD_ACCUM,
        CHECKPOINTING,
        DTYPE,
        OPTIM,
        DATALOADER_WORKERS,
        PIN_MEMORY,
        COMPILE,
        ATTN_IMPLEMENTATION,
        LIGER,
        PADDING,
        SAMPLING,
        EMPTY_CACHE_STEPS,
        WEIGHT_DTYPE,
        ZERO,
        FSDP,
        PACKING,
        ACTIVATION_OFFLOADING,
        PRECOMPUTE_REF_LOG_PROBS,
    )
}

# Rules between two levers' choices, applied to a space once every lever's own filters ran.
# bf16 weights first: narrowing dtype to bf16 can keep flash attention in the space. ZeRO's rules
# before them: a ZeRO space drops bf16 weights before they narrow dtype.
COMBINATION_RULES = (zero_with_other_levers, fsdp_or_zero, bf16_weights_need_bf16_autocast, flash_needs_half_precision)

# The levers whose ``auto`` the memory prior narrows (``Lever.narrow_auto``), in order, before the
# combination rules: ZeRO first (whether the space needs it changes which micro-batches fit, and the
# rules between ZeRO and other levers must see only the ZeRO values kept), then the micro-batches.
NARROWED_BY_MEMORY = (ZERO, MICRO_BATCH)
