"""DeepSpeed ZeRO's model states per rank, on the device and in host memory (docs/estimator.md, "ZeRO").

Rajbhandari et al. 2019 (arXiv:1910.02054), section 5: in mixed precision a parameter costs
``2 + 2 + K`` bytes (16-bit weight, 16-bit gradient, ``K = 12``: fp32 master copy and Adam's two fp32
moments); stage 1 divides the ``K`` bytes by the ranks ``N_d``, stage 2 the gradient too, stage 3
the weight too. Adapted to what DeepSpeed 0.19 allocates and to autotune's levers:

* the compute weights and gradients are in the autocast's dtype (``bf16``/``fp16``: 2 bytes,
  DeepSpeed casts the module, ``DeepSpeedEngine._configure_distributed_model``; ``fp32``/``tf32``: 4);
* DeepSpeed keeps an fp32 master partition for the optimizer (``single_partition_of_fp32_groups``
  in deepspeed/runtime/zero/stage_1_and_2.py, ``fp32_partitioned_groups_flat`` in stage3.py) even
  when the weights are fp32 (a clone), and an fp32 gradient partition for its step;
* the optimizer's states per parameter are :data:`STATE_BYTES_PER_PARAM` in fp32 (DeepSpeed hands it
  flat 1-D partitions: Adafactor cannot factor them and keeps a full second moment, 4 bytes);
* ``offload_optimizer`` keeps the master partition, the fp32 gradient partition and the states in
  host memory; ``offload_param`` (stage 3) the 16-bit parameter partitions too;
* DeepSpeed's buffers, read from the config ``autotune.levers.deepspeed_config`` writes, with the
  Trainer's ``auto`` values (transformers/integrations/deepspeed.py, ``trainer_config_finalize``):
  the gradient reduce bucket (``reduce_bucket_size = h^2`` elements), at stage 3 the prefetch
  bucket (``0.9 h^2``) and the parameters below
  ``stage3_param_persistence_threshold`` (``10 h`` elements: biases and norms), kept whole on every rank.
  A bucket is never larger than the model. Stages 1 and 2 all-gather the updated partitions into
  the flat 16-bit group in place, ``allgather_bucket_size`` elements at a time
  (stage_1_and_2.py ``all_gather_dp_groups``): no buffer of its own, nothing counted;
* torch's AdamW (``adamw_torch``) steps the whole flat fp32 partition in one call, so on the CPU its
  step's temporaries are the partition's size (:data:`ADAMW_STEP_TEMPORARY_BYTES`), where without
  ZeRO they are one parameter's; DeepSpeed's CPU Adam (offload) and the fused kernel make none;
* on the CPU, what importing and starting DeepSpeed adds to the process
  (:data:`DEEPSPEED_CPU_PROCESS_BYTES`, a part of the context).
"""

from __future__ import annotations

import dataclasses

from autotune.levers import STATE_BYTES_PER_PARAM, MemoryTraits, deepspeed_config
from autotune.spec.models import ModelSpec

# fp32 master weights and fp32 gradient partition, per trainable parameter (both partitioned).
MASTER_BYTES = 4
FP32_GRAD_BYTES = 4
# Temporaries of one step of torch's AdamW on the CPU, per parameter it steps at once: the
# single-tensor implementation (the CPU's: torch/optim/optimizer.py ``_default_to_fused_or_foreach``
# picks foreach kernels for CUDA tensors only) computes ``denom = (exp_avg_sq.sqrt() /
# bias_correction2_sqrt).add_(eps)`` (torch/optim/adam.py ``_single_tensor_adam``): two fp32
# temporaries alive at once. DeepSpeed hands the optimizer one flat partition, so that is the whole
# partition at once (without ZeRO, one parameter at a time). Measured on this CPU (torch 2.13): AdamW
# over one flat fp32 tensor of 28.8 M elements raised the process's high-water mark 220 MiB (8.0 bytes
# each) above its resident set after the step; 110 MiB with ``foreach=True``, 0 with ``fused=True``
# (``adamw_torch_fused``). On CUDA (foreach: one list of ``torch._foreach_sqrt``, 4 bytes) it is left to
# the CUDA prior's allocator share until a GPU measures it.
ADAMW_STEP_TEMPORARY_BYTES = 8
# What DeepSpeed adds to a CPU trial process before it holds any state: resident set of a fresh
# interpreter with torch and transformers imported (476 MiB), measured here (deepspeed 0.19.8, gloo,
# one rank): +25 MiB ``import deepspeed``, +6 MiB ``deepspeed.init_distributed`` (its gloo group and
# the ``deepspeed_shm_comm`` op, which it loads on the CPU: deepspeed/comm/torch.py ``build_shm_op``),
# +1 MiB the ``cpu_adam`` op of offload. A term of the context beside the base process's.
DEEPSPEED_CPU_PROCESS_BYTES = 32 * 1024**2


@dataclasses.dataclass(frozen=True)
class ZeroStates:
    """One rank's model states under ZeRO, in bytes: on the device and in host memory."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    host_bytes: int


def compute_weight_bytes(traits: MemoryTraits) -> int:
    """Bytes per weight the model computes with: its weights', or under ZeRO with 16-bit autocast the
    16-bit module DeepSpeed makes (its activations are 16-bit like bf16 weights')."""
    if traits.zero_stage and traits.half_autocast:
        return 2
    return traits.weight_bytes


def zero_optimizer_state_bytes_per_param(optim: str) -> float:
    """fp32 state bytes per parameter of a flat partition (Adafactor unfactored)."""
    return 4.0 if optim == "adafactor" else STATE_BYTES_PER_PARAM.get(optim, 8.0)


def deepspeed_buffer_elements(model: ModelSpec, stage: int) -> tuple[int, int]:
    """(gradient-bucket elements, weight-buffer elements) DeepSpeed allocates beyond the partitions.

    Read from :func:`autotune.levers.deepspeed_config`'s keys, with the Trainer's fills for ``auto``.
    Stage 1/2: the reduce bucket (the all-gather writes in place). Stage 3: the reduce bucket, the
    prefetch bucket and the persistent small parameters (every layer's biases and norms,
    ``9 h + f`` per layer, counted whole on every rank).
    """
    zero = (deepspeed_config(str(stage)) or {})["zero_optimization"]
    h, n = model.hidden_size, model.num_params
    reduce_bucket = _filled(zero["reduce_bucket_size"], h * h)
    if stage < 3:
        return min(reduce_bucket, n), 0
    prefetch = _filled(zero["stage3_prefetch_bucket_size"], int(0.9 * h * h))
    persistent = model.num_layers * (9 * h + model.intermediate_size)
    return min(reduce_bucket, n), min(prefetch + persistent, n)


def _filled(value: object, trainer_fill: int) -> int:
    """A bucket size of the config: the Trainer's fill where it says ``auto``."""
    return trainer_fill if value == "auto" else int(value)  # type: ignore[call-overload]  # a DeepSpeed config value: a number or "auto"


def zero_state_bytes(model: ModelSpec, traits: MemoryTraits, ranks: int, device_kind: str) -> ZeroStates:
    """One rank's weights, gradients and optimizer states under ZeRO (``traits.zero_stage``) over ``ranks`` ranks.

    Per trainable parameter, with ``p`` the compute dtype's bytes and ``S`` the optimizer's:

    ============  ============  ==========================  ===========================
    stage         weights       gradients                   optimizer states
    ============  ============  ==========================  ===========================
    1             ``p``         ``p + 4/N``                 ``(4 + S)/N``
    2             ``p``         ``(p + 4)/N``               ``(4 + S)/N``
    3             ``p/N``       ``(p + 4)/N``               ``(4 + S)/N``
    ============  ============  ==========================  ===========================

    plus the buffers (:func:`deepspeed_buffer_elements`, ``p`` bytes each) and, on the CPU under
    ``adamw_torch`` without offload, its step's temporaries over the partition
    (:data:`ADAMW_STEP_TEMPORARY_BYTES`, counted with the optimizer states). Offload moves the
    optimizer states and the fp32 gradient partition to host memory (the 16-bit gradients go there
    bucket by bucket: no 16-bit partition is kept), and at stage 3 the 16-bit weight partitions too.
    On the CPU the host is the device's memory: the offloaded bytes stay in the parts (the probe
    measures them there) and ``host_bytes`` says how many of them DeepSpeed calls offloaded.
    Frozen parameters (PEFT) count as weights only.
    """
    stage, offload = traits.zero_stage, traits.zero_offload
    p = 2 if traits.half_autocast else 4
    n_all, n_train = model.num_params, model.optimized_params  # ZeRO partitions every parameter it is handed
    grad_bucket, weight_buffer = deepspeed_buffer_elements(model, stage)
    weight_partition = p * n_all // ranks if stage == 3 else p * n_all
    half_grads = p * n_train // ranks if stage >= 2 else p * n_train
    fp32_grads = FP32_GRAD_BYTES * n_train // ranks
    optimizer = int((MASTER_BYTES + zero_optimizer_state_bytes_per_param(traits.optimizer)) * n_train / ranks)
    if traits.optimizer == "adamw_torch" and not offload and device_kind == "cpu":
        optimizer += ADAMW_STEP_TEMPORARY_BYTES * n_train // ranks
    host = 0
    if offload:
        # The reduce bucket is copied into the host's fp32 gradient partition as it fills
        # (stage_1_and_2.py ``async_inplace_copy_grad_to_fp32_buffer_from_gpu``): no 16-bit partition.
        half_grads = 0
        host = optimizer + fp32_grads + (weight_partition if stage == 3 else 0)
        if device_kind != "cpu":
            optimizer, fp32_grads = 0, 0
            weight_partition = 0 if stage == 3 else weight_partition
    return ZeroStates(
        weights_bytes=weight_partition + p * weight_buffer,
        gradients_bytes=half_grads + fp32_grads + p * grad_bucket,
        optimizer_bytes=optimizer,
        host_bytes=host,
    )
