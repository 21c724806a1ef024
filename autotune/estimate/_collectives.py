"""What the ranks of one trial send each other every optimizer step, and how much of it the compute hides
(docs/estimator.md, "The ranks' collectives"); and how often ZeRO reduces the gradients, with DeepSpeed's own passes
over them at each reduction (:func:`zero_reductions`, :func:`zero_rank_share`).

Each collective moves ``S`` bytes (the whole tensor, as NCCL's tests count it) and costs
``S x c x (N - 1) / N`` over the bus bandwidth of ``N`` ranks, with ``c = 2`` for an all-reduce and 1 for an
all-gather or a reduce-scatter (NVIDIA/nccl-tests doc/PERFORMANCE.md, "Bus bandwidth"). This module counts
the ``S``, by kind; ``_speed_time.predict_speed`` applies the ranks and the device's bus bandwidths. Per
optimizer step of ``k`` micro-batches:

* **plain DDP**: one all-reduce of the gradients, in the parameters' dtype, at the last micro-batch: the Trainer
  runs the others under accelerate's ``no_sync`` (transformers/trainer.py, ``_inner_training_loop``: "We sync the
  gradients in the following cases: ... 2. Using deepspeed 3. when we are at the last batch sample");
* **ZeRO-1**: a reduce-scatter of the 16-bit gradients at the accumulation boundary and an all-gather of the
  updated 16-bit partitions after the step; **ZeRO-2** reduces at every micro-batch ("ZeRO stage >= 2
  communicates during non gradient accumulation boundaries as well", deepspeed/runtime/engine.py
  ``allreduce_gradients``, DeepSpeed 0.19); **ZeRO-3** gathers every parameter, frozen ones too, for each
  micro-batch's forward and again for its backward and reduce-scatters the gradients there, with no gather
  after the step (Rajbhandari et al. 2019, section 7: ``2Ψ`` for stages 1-2, ``3Ψ`` for stage 3);
* **FSDP**: each micro-batch gathers the parameters in the compute dtype for its forward, and under full shard
  again for its backward; the gradients are reduce-scattered once a step (``no_sync`` applies), in the compute
  dtype (accelerate's FSDP2 mixed precision: ``reduce_dtype`` is the ``param_dtype``).

How much of it runs behind the compute (:attr:`Collectives.hidden_share`, a share of the step's matmul time):
DDP reduces its buckets as the last micro-batch's backward makes them (Li et al. 2020, "PyTorch Distributed",
section 3.2.3): up to that backward, two thirds of its matmuls. ZeRO-3 (``overlap_comm`` is on for stage 3 alone:
deepspeed/runtime/zero/config.py ``overlap_comm_valid``) and FSDP prefetch the next block's gather during the
current block's compute: up to the whole step's. ZeRO-1 and -2 without ``overlap_comm``: nothing. On a CPU
nothing: gloo's copies run on the cores the compute uses.
"""

from __future__ import annotations

import dataclasses

from autotune.levers import MemoryTraits
from autotune.spec.models import ModelSpec

# The share of a micro-batch's matmul FLOPs in its backward (``4N`` of ``6N`` per token).
BACKWARD_SHARE = 2 / 3
# DeepSpeed's ZeRO optimizer (stages 1-3 without offload) passes over the gradients this many more times per
# reduction than plain training, each read and written (torch's profiler over a Trainer's ZeRO-1 steps against plain
# ones: ``aten::copy_``, ``cat``, ``div_``; ``_speed_time.ZERO_S_PER_PARAM`` says where): over the whole gradient,
# its copy into the reduction bucket and its average there (deepspeed/runtime/zero/stage_1_and_2.py
# ``average_tensor``); over the rank's own partition, its copy out of the bucket, the partition's flatten for the
# step and the updated fp32 master copied back to the 16-bit weights (``step``). On CUDA, memory-bound bytes; on a
# CPU timed whole.
ZERO_WHOLE_PASSES, ZERO_PARTITION_PASSES = 2, 3


@dataclasses.dataclass(frozen=True)
class Collectives:
    """One rank's collectives in one optimizer step, before the ranks' ``(N - 1) / N``.

    Attributes:
        all_reduce_bytes: What the all-reduces move (``S``, each counted twice by the bus bandwidth).
        shard_bytes: What the all-gathers and reduce-scatters move (``S``).
        hidden_share: The share of the step's matmul time they can run behind (0: none).
    """

    all_reduce_bytes: float = 0.0
    shard_bytes: float = 0.0
    hidden_share: float = 0.0


NONE = Collectives()


def gradient_bytes_per_param(traits: MemoryTraits) -> int:
    """The bytes of a gradient ZeRO and FSDP reduce: 16-bit under half autocast or 16-bit weights (DeepSpeed's bf16
    and fp16 modes keep 16-bit gradients beside the fp32 master; FSDP2 reduces in the ``param_dtype``), else fp32."""
    return 2 if traits.half_autocast or traits.weight_bytes == 2 else 4


def zero_reductions(traits: MemoryTraits, micro_batches: int) -> int:
    """How many times DeepSpeed's ZeRO optimizer reduces the gradients in an optimizer step: once at the accumulation
    boundary at stage 1, at every micro-batch at stages 2 and 3 (deepspeed/runtime/engine.py
    ``allreduce_gradients``); none without ZeRO."""
    if not traits.zero_stage:
        return 0
    return 1 if traits.zero_stage == 1 else micro_batches


def step_collectives(
    model: ModelSpec, traits: MemoryTraits, micro_batches: int, gradient_bytes: int, device_kind: str
) -> Collectives:
    """The collectives of one optimizer step of ``micro_batches`` micro-batches (``gradient_bytes``: the plain run's
    gradients, ``_parts.model_state_bytes``, which DDP all-reduces as they are)."""
    k = micro_batches
    compute_bytes = gradient_bytes_per_param(traits)
    trained, every = compute_bytes * model.optimized_params, compute_bytes * model.num_params
    overlaps = device_kind == "cuda"
    if traits.zero_stage == 3:
        return Collectives(shard_bytes=k * (2 * every + trained), hidden_share=1.0 if overlaps else 0.0)
    if traits.zero_stage:
        return Collectives(shard_bytes=zero_reductions(traits, k) * trained + trained)
    if traits.fsdp_reshards is not None:
        gathers = 2 if traits.fsdp_reshards else 1
        return Collectives(shard_bytes=k * gathers * every + trained, hidden_share=1.0 if overlaps else 0.0)
    return Collectives(all_reduce_bytes=gradient_bytes, hidden_share=BACKWARD_SHARE / k if overlaps else 0.0)


def zero_rank_share(ranks: int) -> float:
    """What one rank of ``ranks`` does of DeepSpeed's own passes over the gradients, against a single rank: the whole
    gradient's passes each, its partition's a ``1 / ranks`` share (measured on the AVX2 EPYC, bert-small, fp32: a rank
    of two 0.21 s a step slower than plain DDP, one rank alone 0.30 s; this says 0.7)."""
    return (ZERO_WHOLE_PASSES + ZERO_PARTITION_PASSES / ranks) / (ZERO_WHOLE_PASSES + ZERO_PARTITION_PASSES)
