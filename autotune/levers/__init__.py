"""Every lever autotune searches, one entry each: the one home of a knob's rules.

A lever (:class:`Lever`) says what its choices are and how they are checked, where it runs (device,
packages, model, data), what it writes into ``TrainingArguments`` (or the model build, or the data
collator) and back, how tables name it, and which parts of the memory estimate it moves. The rest of
autotune loops over :data:`LEVERS`: ``TrialConfig`` has one field per lever (``autotune.levers._trial_config``),
the search-space YAML one key per lever (``autotune.space``), the export writes what the mapping
writes, and the estimator declares which levers it reads (``autotune.estimate``).

How to add a lever: docs/architecture.md, "Adding a lever".
"""

from __future__ import annotations

from autotune.levers._lever import Lever
from autotune.levers._registry import COMBINATION_RULES, LEVERS
from autotune.levers._trial_config import (
    TrialConfig,
    knob_values_from_base_args,
    training_arguments_kwargs,
    with_levers_off_explicit,
)
from autotune.levers.attention import FLASH_ATTENTIONS, FUSED_ATTENTIONS
from autotune.levers.batch import BATCH_LIMIT_KNOBS, SMALL_AUTO_MICRO_BATCHES
from autotune.levers.distributed import deepspeed_config, read_deepspeed_config, zero_offloads, zero_stage
from autotune.levers.fsdp import FSDP
from autotune.levers.optimizer import BNB_OPTIMIZERS, STATE_BYTES_PER_PARAM, STATES_IN_PARAM_DTYPE
from autotune.levers.precision import DTYPES, HALF_DTYPES, WEIGHT_TORCH_DTYPES

__all__ = [
    "BATCH_LIMIT_KNOBS",
    "BNB_OPTIMIZERS",
    "COMBINATION_RULES",
    "DTYPES",
    "FLASH_ATTENTIONS",
    "FSDP",
    "FUSED_ATTENTIONS",
    "HALF_DTYPES",
    "LEVERS",
    "Lever",
    "SMALL_AUTO_MICRO_BATCHES",
    "STATES_IN_PARAM_DTYPE",
    "STATE_BYTES_PER_PARAM",
    "TrialConfig",
    "WEIGHT_TORCH_DTYPES",
    "deepspeed_config",
    "knob_values_from_base_args",
    "read_deepspeed_config",
    "training_arguments_kwargs",
    "with_levers_off_explicit",
    "zero_offloads",
    "zero_stage",
]
