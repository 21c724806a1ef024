"""The registry: every lever in ``TrialConfig`` field order, the rules between two levers, and the order
in which an ``auto`` space is narrowed by the memory prior."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.levers._lever import Lever
from autotune.levers._pairs import PairRule, conflict, count_runnable, narrow_pairs
from autotune.levers.attention import ATTN_IMPLEMENTATION, FLASH_NEEDS_HALF_PRECISION
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
from autotune.levers.precision import BF16_WEIGHTS_NEED_BF16_AUTOCAST, DTYPE, WEIGHT_DTYPE
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

# Values of two levers that cannot train in one config: judged config by config (the sampler leaves out
# only the configs that pair them), and a value that runs with no choice of its pair is removed from the
# space (autotune.levers._pairs).
PAIR_RULES: tuple[PairRule, ...] = (BF16_WEIGHTS_NEED_BF16_AUTOCAST, FLASH_NEEDS_HALF_PRECISION)


def pair_rules(choices: dict[str, list[Any]], notes: list[str], source: str) -> dict[str, list[Any]]:
    """The pair rules applied to a whole space (:func:`autotune.levers._pairs.narrow_pairs`)."""
    return narrow_pairs(choices, notes, source, PAIR_RULES)


def config_conflict(params: Mapping[str, Any]) -> str:
    """Why one config cannot train (two of its values break a pair rule), or "" where it can."""
    return conflict(params, PAIR_RULES)


def runnable_count(choices: Mapping[str, list[Any]]) -> int:
    """How many configs of a space train: its product less the pairs the rules leave out."""
    return count_runnable(choices, PAIR_RULES)


# Rules between two levers' choices, applied to a space once every lever's own filters ran. ZeRO's
# rules first: a ZeRO space drops bf16 weights before the pair rules judge them.
COMBINATION_RULES = (zero_with_other_levers, fsdp_or_zero, pair_rules)

# The levers whose ``auto`` the memory prior narrows (``Lever.narrow_auto``), in order, before the
# combination rules: ZeRO first (whether the space needs it changes which micro-batches fit, and the
# rules between ZeRO and other levers must see only the ZeRO values kept), then the micro-batches.
NARROWED_BY_MEMORY = (ZERO, MICRO_BATCH)
