"""Every lever autotune searches, one entry each: the one home of a lever's rules.

A lever (:class:`Lever`) says what its choices are and how they are checked, where it runs (device,
packages, model, data), what it writes into ``TrainingArguments``, the model build, the batches or the
trainer (and back), how tables name it, and what its value means for memory. The rest of autotune
loops over :data:`LEVERS` and names no lever: ``TrialConfig`` has one field per lever
(``autotune.levers._trial_config``), the search-space YAML one key per lever (``autotune.space``), the
child builds the model, the batches and the trainer through the levers' hooks, the export writes what
the mapping writes, and the estimator reads :class:`MemoryTraits` and :class:`SpeedTraits` (``autotune.estimate``).

How to add a lever: docs/architecture.md, "Adding a lever".
"""

from __future__ import annotations

from autotune.levers._exports import NOTE, TOOL_FORMS, CannotExpress, Mapper, nothing, same
from autotune.levers._hooks import (
    PADDED,
    Batching,
    MemoryTraits,
    MicroBatchShape,
    SpaceMemory,
    SpeedTraits,
    TrainerParts,
)
from autotune.levers._lever import Lever
from autotune.levers._registry import COMBINATION_RULES, LEVERS, NARROWED_BY_MEMORY, config_conflict, runnable_count
from autotune.levers._trial_config import (
    TrialConfig,
    lever_tool_keys,
    lever_values_from_base_args,
    memory_traits,
    model_build_kwargs,
    speed_traits,
    trainer_parts,
    training_arguments_kwargs,
    trial_batching,
    with_levers_off_explicit,
)
from autotune.levers.batch import (
    BATCH_LIMITS,
    GLOBAL_BATCH_LEVERS,
    SMALL_AUTO_MICRO_BATCHES,
    constrain_global_batch,
    largest_global_batch,
    tensor_core_note,
)
from autotune.levers.compile import DYNAMIC_SHAPES_ENVIRONMENT, compile_environment
from autotune.levers.distributed import deepspeed_config, read_deepspeed_config, zero_offloads, zero_stage
from autotune.levers.optimizer import (
    BNB_OPTIMIZERS,
    STATE_BYTES_PER_PARAM,
    STATES_IN_PARAM_DTYPE,
    optimizer_in,
    update_ignores_gradient_scale,
)
from autotune.levers.precision import DTYPES, HALF_DTYPES, PRECISION_FIELDS, WEIGHT_TORCH_DTYPES

__all__ = [
    "DYNAMIC_SHAPES_ENVIRONMENT",
    "NOTE",
    "TOOL_FORMS",
    "CannotExpress",
    "Mapper",
    "lever_tool_keys",
    "nothing",
    "same",
    "BATCH_LIMITS",
    "BNB_OPTIMIZERS",
    "COMBINATION_RULES",
    "config_conflict",
    "runnable_count",
    "PRECISION_FIELDS",
    "DTYPES",
    "GLOBAL_BATCH_LEVERS",
    "HALF_DTYPES",
    "LEVERS",
    "NARROWED_BY_MEMORY",
    "PADDED",
    "SMALL_AUTO_MICRO_BATCHES",
    "STATES_IN_PARAM_DTYPE",
    "STATE_BYTES_PER_PARAM",
    "WEIGHT_TORCH_DTYPES",
    "Batching",
    "Lever",
    "MemoryTraits",
    "MicroBatchShape",
    "SpaceMemory",
    "SpeedTraits",
    "TrainerParts",
    "TrialConfig",
    "compile_environment",
    "constrain_global_batch",
    "deepspeed_config",
    "largest_global_batch",
    "lever_values_from_base_args",
    "memory_traits",
    "model_build_kwargs",
    "optimizer_in",
    "read_deepspeed_config",
    "speed_traits",
    "tensor_core_note",
    "trainer_parts",
    "training_arguments_kwargs",
    "with_levers_off_explicit",
    "trial_batching",
    "update_ignores_gradient_scale",
    "zero_offloads",
    "zero_stage",
]
