"""The throughput prior: how long one optimizer step of a configuration takes on a device, before any trial.

A step's time is a sum of parts a user can check by hand (docs/estimator.md, "The throughput prior"):

* **compute**: the matmul FLOPs the device executes (:mod:`autotune.spec.flops`: ``6N`` per token, or
  ``4N + 6 N_adapter`` under PEFT, the attention term over the length each position attends to, and
  checkpointing's recomputed forward) over the peak of the dtype the matmuls run in times the share of it
  a training step's matmuls reach (:attr:`SpeedFit.achievable_fraction`);
* **memory**: memory-bound work over the memory bandwidth: the elementwise work around the matmuls
  (in eager mode every op's reads and writes, counted from the model's own code:
  :mod:`~autotune.estimate._elementwise`; where ``torch.compile`` or Liger's kernels fuse them, two passes over
  the memory model's per-layer activation bytes, :func:`~autotune.estimate._activations.layer_activation_bytes`:
  :func:`elementwise_layer_bytes`), the loss's logits (``V x tokens`` fp32 tensors, none where a fused loss keeps them in
  chunks), the weights each matmul reads, and the optimizer's step (bytes per parameter, counted from
  its implementation: ``autotune.levers.optimizer.STEP_BYTES_PER_PARAM``);
* **host**: what crosses the host link (TRL's activation offloading, ZeRO offload);
* **collectives**: what a trial's ranks send each other (:mod:`~autotune.estimate._collectives`) over the bus
  bandwidth between them, less what runs behind the compute;
* **overhead**: a launch (on the CPU, an op's dispatch) per kernel, and a fixed cost per optimizer step.

It reads a configuration through its :class:`~autotune.levers.MemoryTraits` and
:class:`~autotune.levers.SpeedTraits`, never a lever by name. :func:`step_work` counts a step's work
once per configuration; ``_speed_time.predict_speed`` turns it into time with a device's rates
(``SpeedFit``), so a calibrated fit re-ranks a space without counting again.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from autotune.estimate._activations import attention_score_bytes, layer_activation_bytes
from autotune.estimate._collectives import (
    NONE,
    ZERO_PARTITION_PASSES,
    ZERO_WHOLE_PASSES,
    Collectives,
    gradient_bytes_per_param,
    step_collectives,
    zero_reductions,
)
from autotune.estimate._elementwise import eager_layer_traffic
from autotune.estimate._experts import expert_adapter_fold_flops, routed_expert_fp32_flops_per_token
from autotune.estimate._packing import bfd_rows
from autotune.estimate._parts import (
    QUANTIZED_4BIT_BYTES,
    model_state_bytes,
    precomputes_reference,
    runs_reference,
    trainer_rows,
)
from autotune.estimate._zero import compute_weight_bytes
from autotune.levers import (
    Batching,
    MemoryTraits,
    MicroBatchShape,
    SpeedTraits,
    TrialConfig,
    memory_traits,
    speed_traits,
)
from autotune.spec.flops import (
    attention_flops_per_token,
    model_flops_per_token,
    recompute_flops_per_token,
    weight_flops_per_token,
)
from autotune.spec.models import ModelSpec

# Each saved activation is written in the forward and read in the backward, and its gradient written and
# read in the backward: four passes over the memory model's saved bytes per layer, the least eager mode can
# move (what it moves is counted from the model's code, ``_elementwise.py``; these passes stand in where it
# cannot be, and for materialised attention scores). Inductor fuses each elementwise chain into one kernel
# that writes only what leaves it (what the backward saves) and reads it back once: two passes.
# Checkpointing writes the forward's activations once more.
ELEMENTWISE_PASSES = 4
FUSED_ELEMENTWISE_PASSES = 2
# The loss over ``V x tokens`` logits on CUDA: transformers upcasts them to fp32, cross-entropy writes its fp32
# log-softmax and the backward an fp32 gradient of the same size (the memory model's three fp32 tensors,
# ``_logits.logits_bytes``), each written once and read once: 6 passes of 4 bytes. On a CPU the same loss is
# not bound by memory but by its ``exp`` and ``log``: timed per logit instead (:attr:`StepWork.loss_logits`).
LOSS_BYTES_PER_LOGIT = 6 * 4
# TRL's fused head off CUDA (trl/kernels/chunked_logprob.py: ``_use_triton`` is CUDA/XPU only) folds each
# ``tokens x 32k`` tile in torch ops: ``_forward_tile`` with DPOTrainer's outputs (log-probabilities, entropy, mean
# logits, top-1: the matmul's write, the upcast, two scalings, the sum, the top-1 mask, max, shift, exp, sum, ``e * z``:
# about 20 passes) and ``_backward_tile`` (the recomputed tile, upcast, scalings, ``log_p``, ``exp``, the target mask
# and ``grad``'s five ops: about 27). Off CUDA every position of the padded batch is projected, padding and prompt
# included ("On Triton devices, only the valid positions are scored. Elsewhere ... every position is scored
# instead": ``compact = _use_triton(...)``, trl/trainer/utils.py:1640-1642, TRL 1.16), so it follows the batch's
# computed tokens, and a smaller micro-batch that pads less does less. Its training pass is timed per logit
# (``_speed_time.HEAD_S_PER_LOGIT``: on a CPU its ``exp`` and ``log`` bound it, not its 47 passes' bytes); the
# reference's forward-only head (log-probabilities only, about 12 passes) is still counted in bytes. On CUDA the
# Triton kernels fold the tile as the matmul writes it: nothing beyond the matmul, as Liger's.
FUSED_HEAD_FALLBACK_REFERENCE_BYTES_PER_LOGIT = 12 * 4
# Its backward's two matmuls per tile (the hidden states' gradient and, where the head trains, the head's
# own) run in fp32 off CUDA whatever the autocast dtype: ``_addmm_fp32`` keeps 16-bit inputs only on CUDA
# (``torch.addmm(..., out_dtype=torch.float32)``) and elsewhere casts the tile and its operand up
# (``acc.addmm_(a.float(), b.float())``, trl/kernels/chunked_logprob.py, TRL 1.16). So under bf16 the CPU
# runs 2 or 4 of the head's 6 FLOPs per weight at the fp32 rate: on a 32k-vocabulary, 64-wide model most of
# a step's matmul FLOPs.
FUSED_HEAD_FALLBACK_FP32_BACKWARD = ("bf16", "fp16")
# What the Trainer does to the gradients every optimizer step whatever the optimizer: clipping at
# ``max_grad_norm`` (1.0 by default; torch.nn.utils.clip_grad_norm_ reads every gradient for the norm, then
# scales it in place): 3 passes of the gradient's bytes per parameter.
CLIP_PASSES = 3
# Kernels (CPU: ops) per transformer layer per micro-batch in eager mode: about 35 in a block's forward
# (transformers' modeling_llama.py: two RMSNorms of 6 ops, 4 projections, rotary ~10, attention, reshapes,
# 2 residual adds, 5 in the MLP), about twice that in its backward. Inductor fuses the elementwise ones:
# about a third are left (the matmuls, attention and the fused kernels between them). Checkpointing runs the
# block's forward again inside the backward: its ops are dispatched again.
FORWARD_OPS_PER_LAYER = 35
OPS_PER_LAYER = 100
FUSED_OPS_SHARE = 1 / 3
# Parameter tensors per layer, for a per-tensor optimizer (a block's projections, norms and biases).
TENSORS_PER_LAYER = 12
# Where a config keeps each dropout's probability (the first key present counts): on the attention
# probabilities, on a layer's two residual outputs (attention's and the MLP's), on the embeddings (BERT drops
# them at its hidden rate). BERT and GPT-2 default to 0.1; Llama, Qwen and Mistral have only an attention
# dropout, 0.0 by default.
ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout")
HIDDEN_DROPOUT_KEYS = ("hidden_dropout_prob", "resid_pdrop", "hidden_dropout", "dropout")
EMBEDDING_DROPOUT_KEYS = ("embd_pdrop", "embedding_dropout", "hidden_dropout_prob")


# The one key whose probability the attention function reads from a float the model keeps, not from an
# ``nn.Dropout`` module: Llama, Qwen, Mistral, Gemma, Phi-3 (``self.attention_dropout = config.attention_dropout``,
# 193 modeling files of transformers 5.24; 11, Falcon and BLOOM among them, wrap it in a module). A trainer that
# sets every dropout module's ``p`` to 0 (``ModelSpec.dropout_modules_off``) leaves it on.
FLOAT_DROPOUT_KEYS = ("attention_dropout",)


def _dropout_probability(model: ModelSpec, keys: tuple[str, ...]) -> float:
    for key in keys:
        value = model.text_config.get(key)
        if isinstance(value, int | float):
            return 0.0 if model.dropout_modules_off and key not in FLOAT_DROPOUT_KEYS else float(value)
    return 0.0


def dropout_elements_per_token(model: ModelSpec, attended_context: float) -> float:
    """Elements a training forward draws a dropout mask for, per token: each layer's attention probabilities
    (``heads x`` the positions a token attends over) and its two residual outputs (``2 h``), and the embeddings
    (``h``), each only where the model's config gives it a probability above 0 (Llama's, Qwen's: none) and the
    trainer leaves it on (``ModelSpec.dropout_modules_off``)."""
    per_layer = 0.0
    if _dropout_probability(model, ATTENTION_DROPOUT_KEYS) > 0:
        per_layer += model.num_heads * attended_context
    if _dropout_probability(model, HIDDEN_DROPOUT_KEYS) > 0:
        per_layer += 2 * model.hidden_size
    embeddings = model.hidden_size if _dropout_probability(model, EMBEDDING_DROPOUT_KEYS) > 0 else 0.0
    return model.num_layers * per_layer + embeddings


@dataclasses.dataclass(frozen=True)
class TypicalBatch:
    """A typical micro-batch of a batching: how many samples, and which tokens the matmuls run over.

    Attributes:
        samples: Samples per micro-batch.
        computed_tokens: Positions the matmuls run over, padding included.
        real_tokens: The samples' own tokens (the useful work).
        model_context: The token-weighted mean sample length (``sum s_i^2 / sum s_i``): the model FLOPs'
            attention term, as the trial counts it (``autotune.spec.flops.model_tflops``).
        attended_context: How many positions each position attends over in the kernel that runs: the
            padded length, a flattened row's whole length under a mask-based kernel, the sample's own
            under a kernel that reads the boundaries.
    """

    samples: float
    computed_tokens: float
    real_tokens: float
    model_context: float
    attended_context: float


def pads_each_batch_to_longest(batching: Batching, trainer_pads_to_longest: bool) -> bool:
    """Whether a micro-batch is padded to its longest sample: a batching lever's (``padding: longest``), or the
    trainer's own collator where no batching lever shapes the batch (TRL's: ``ModelSpec.pads_to_longest``).
    Then a smaller micro-batch of samples that differ in length computes less padding per real token."""
    if batching.pads_samples:
        return trainer_pads_to_longest
    return batching.varies and not batching.flattened and not batching.packs


def typical_micro_batch(
    traits: MemoryTraits, seq_len: int, lengths: Sequence[int] | None = None, trainer_pads_to_longest: bool = False
) -> TypicalBatch:
    """The typical micro-batch of ``traits.rows`` rows under ``traits.batching``; ``lengths``: the user's
    samples' token lengths (``None``: every sample ``seq_len`` tokens, synthetic data);
    ``trainer_pads_to_longest``: the trainer's collator pads the batch to its longest row where
    ``traits.batching`` would pad each sample to ``seq_len`` (:func:`pads_each_batch_to_longest`)."""
    rows, batching = traits.rows, traits.batching
    clipped = [min(int(n), seq_len) for n in lengths or () if n > 0]
    if not clipped:
        computed = float(rows * seq_len)
        attended = computed if batching.flattened and not traits.reads_boundaries else float(seq_len)
        return TypicalBatch(rows, computed, computed, float(seq_len), attended)
    mean = statistics.fmean(clipped)
    context = sum(n * n for n in clipped) / sum(clipped)
    if batching.packs:  # TRL's bfd rows: full only where short samples fill them (_packing.bfd_rows)
        fill, samples_per_row = bfd_rows(tuple(clipped), seq_len)
        computed = rows * fill
        attended = context if traits.reads_boundaries else computed
        return TypicalBatch(rows * samples_per_row, computed, computed, context, attended)
    if batching.flattened:
        computed = rows * mean
        return TypicalBatch(rows, computed, computed, context, context if traits.reads_boundaries else computed)
    if not pads_each_batch_to_longest(batching, trainer_pads_to_longest):
        return TypicalBatch(rows, float(rows * seq_len), rows * mean, context, float(seq_len))
    chunks = [clipped[i : i + rows] for i in range(0, len(clipped) - rows + 1, rows)] or [clipped]
    longest = statistics.fmean(max(chunk) for chunk in chunks)  # each batch padded to its longest
    return TypicalBatch(rows, rows * longest, rows * mean, context, longest)


@dataclasses.dataclass(frozen=True)
class StepWork:
    """What one optimizer step of a configuration does, before a device's rates turn it into time.

    Attributes:
        matmul_flops: Matmul FLOPs executed in ``matmul_dtype``, recomputation included (hardware FLOPs).
        matmul_dtype: The dtype the matmuls run in (its peak bounds them).
        matmul_inner: The weight matmuls' inner size (the model's width): on a device calibrated at narrow
            inner sizes, the rate is read there (:meth:`SpeedFit.matmul_rate_tflops`).
        fp32_matmul_flops: Matmul FLOPs that run in fp32 whatever ``matmul_dtype`` (TRL's fused head's backward
            off CUDA: :data:`FUSED_HEAD_FALLBACK_FP32_BACKWARD`).
        memory_bytes: Memory-bound traffic (elementwise work, loss, weights read, optimizer step).
        host_bytes: Bytes over the host link (offloading).
        launches: Kernel launches (CPU: op dispatches).
        dropout_elements: Elements dropout draws a random mask for (:func:`dropout_elements_per_token`; again
            in a recomputed forward): on a CPU, time of their own (``SpeedFit.dropout_s_per_element``).
        loss_logits: Off CUDA, the logits the plain loss takes its log-softmax over and back
            (:func:`plain_loss_logits`), timed per logit (``SpeedFit.loss_s_per_logit``); on CUDA they are
            bytes in ``memory_bytes`` (:data:`LOSS_BYTES_PER_LOGIT`).
        head_logits: Off CUDA, the logits TRL's chunked head folds in torch ops in training
            (:func:`fused_head_fallback_logits`), timed per logit (``SpeedFit.head_s_per_logit``).
        micro_batches: Micro-batches per step.
        samples: Samples per step.
        real_tokens: The samples' own tokens per step.
        model_flops: Useful FLOPs per step (the model TFLOPs' and MFU's numerator).
        setup_matmul_flops_per_sample: The trainer's pass over the data before its first step, matmul FLOPs a
            sample (DPO's ``precompute_ref_log_probs``: the reference's forward over each pair, in micro-batches
            of the same size and padding); 0: no such pass.
        setup_memory_bytes_per_sample: That pass's memory-bound traffic a sample (off CUDA, TRL's head's passes
            over the logits: :func:`reference_forward`, the count each step's reference forward uses too).
        run_passes: How many times the user's run goes over its data, over which that pass is counted
            (``autotune.spec.measure.over_the_run``, as a trial counts it); 1 where unknown.
        collectives: What the trial's ranks send each other in the step (:mod:`~autotune.estimate._collectives`).
        zero_params: Off CUDA, trained parameters times the reductions of DeepSpeed's ZeRO optimizer in the step,
            where its step runs on the device (no offload): its own passes over each gradient, timed per parameter
            (``SpeedFit.zero_s_per_param``); on one rank (``_collectives.zero_rank_share``: a rank of several).
        zero_bytes: On CUDA, the bytes of those passes on one rank (``_collectives.ZERO_WHOLE_PASSES``,
            ``ZERO_PARTITION_PASSES``), memory-bound.
        ranks: The ranks one trial spans, each training this work (``--devices-per-trial``).
    """

    matmul_flops: float
    matmul_dtype: str
    memory_bytes: float
    host_bytes: float
    launches: float
    micro_batches: int
    samples: float
    real_tokens: float
    model_flops: float
    matmul_inner: int = 0
    fp32_matmul_flops: float = 0.0
    dropout_elements: float = 0.0
    loss_logits: float = 0.0
    head_logits: float = 0.0
    setup_matmul_flops_per_sample: float = 0.0
    setup_memory_bytes_per_sample: float = 0.0
    run_passes: float = 1.0
    collectives: Collectives = NONE
    zero_params: float = 0.0
    zero_bytes: float = 0.0
    ranks: int = 1


def step_work(
    model: ModelSpec,
    config: TrialConfig,
    seq_len: int,
    device_kind: str,
    matmul_dtype: str,
    lengths: Sequence[int] | None = None,
) -> StepWork:
    """Count one optimizer step of ``config`` (one rank's share where a trial spans several: their number is the
    caller's, ``StepWork.ranks``).

    Args:
        model: The model's shape (its ``peft``: the frozen base's ``4N``).
        config: The lever values, read through their memory and speed traits on ``device_kind``.
        seq_len: Tokens per sample (the padded length, the packed row's length).
        device_kind: ``cpu`` or ``cuda``.
        matmul_dtype: The dtype the matmuls run in (``Workload.peak_dtype``: tf32 for fp32 with TF32 on).
        lengths: The user's samples' token lengths (``--dataset``); ``None``: synthetic, every sample full.
    """
    traits, speed = trainer_rows(model, memory_traits(config, device_kind)), speed_traits(config)
    batch = typical_micro_batch(traits, seq_len, lengths, model.pads_to_longest)
    k = speed.micro_batches
    per_token = weight_flops_per_token(model) + attention_flops_per_token(model, batch.attended_context)
    if traits.recompute:
        per_token += recompute_flops_per_token(model, batch.attended_context)
    # The reference's forward (DPO): in every step, or once over the data before training (precomputed).
    reference_flops, reference_bytes = reference_forward(model, batch, device_kind)
    each_step = runs_reference(model, traits)
    layers = model.num_layers
    rows = 1 if traits.batching.flattened else traits.rows  # a flattened micro-batch is one row
    shape = MicroBatchShape(rows=rows, row_tokens=max(round(batch.computed_tokens / rows), 1))
    layer = layer_activation_bytes(model, traits, seq_len, device_kind, shape)
    loss_logits = plain_loss_logits(model, traits, batch.computed_tokens)
    head_logits = fused_head_fallback_logits(model, batch.computed_tokens, device_kind)
    elementwise = layers * elementwise_layer_bytes(model, traits, speed, device_kind, shape, layer)
    trainable = model.trainable_params
    parameter_scale = traits.weight_bytes / 4
    memory_per_batch = (
        elementwise
        + (LOSS_BYTES_PER_LOGIT * loss_logits if device_kind == "cuda" else 0.0)
        + weight_read_bytes(model, traits)
        + (reference_bytes if each_step else 0.0)
    )
    optimizer_scale = parameter_scale if speed.optimizer_states_in_param_dtype else 1.0
    optimizer = trainable * (speed.optimizer_step_bytes * optimizer_scale + CLIP_PASSES * 4 * parameter_scale)
    zero_params = 0.0 if traits.zero_offload else zero_reductions(traits, k) * trainable
    passes = ZERO_WHOLE_PASSES + ZERO_PARTITION_PASSES
    zero_bytes = zero_params * passes * 2 * gradient_bytes_per_param(traits) if device_kind == "cuda" else 0.0
    host = 0.0
    if traits.activations_offloaded:  # every saved tensor to the host in the forward and back for the backward
        host += 2 * layers * layer * k
    if traits.zero_offload:  # gradients down, updated 16-bit weights up, the step on the host
        host += trainable * (4 + 2) + optimizer
        optimizer = 0.0
    ops_per_layer = OPS_PER_LAYER + (FORWARD_OPS_PER_LAYER if traits.recompute else 0)
    launches_per_batch = (
        0.0 if speed.graphs else ops_per_layer * layers * (FUSED_OPS_SHARE if speed.fuses_elementwise else 1.0)
    )
    tensors = TENSORS_PER_LAYER * layers + 5
    fp32_flops = k * fused_head_fp32_backward_flops(model, batch.computed_tokens, device_kind, matmul_dtype)
    fp32_flops += k * batch.computed_tokens * routed_expert_fp32_flops_per_token(model, traits)
    fold, fold_fp32 = expert_adapter_fold_flops(model, traits)
    fp32_flops += k * fold_fp32
    setup_flops = setup_bytes = 0.0
    if precomputes_reference(model, traits):  # batched as training batches (trl: per_device_train_batch_size)
        samples_per_batch = batch.samples / model.rows_per_sample
        setup_flops, setup_bytes = reference_flops / samples_per_batch, reference_bytes / samples_per_batch
    forwards = 2 if traits.recompute else 1  # a recomputed forward draws its masks again
    dropout = k * forwards * batch.computed_tokens * dropout_elements_per_token(model, batch.attended_context)
    return StepWork(
        dropout_elements=dropout,
        loss_logits=0.0 if device_kind == "cuda" else k * loss_logits,
        head_logits=k * head_logits,
        matmul_flops=k * (batch.computed_tokens * per_token + (reference_flops if each_step else 0.0) + fold)
        - fp32_flops,
        matmul_dtype=matmul_dtype,
        matmul_inner=model.hidden_size,
        fp32_matmul_flops=fp32_flops,
        memory_bytes=k * memory_per_batch + optimizer,
        host_bytes=host,
        launches=k * launches_per_batch + speed.optimizer_kernels_per_tensor * tensors,
        micro_batches=k,
        samples=k * batch.samples / model.rows_per_sample,
        real_tokens=k * batch.real_tokens,
        model_flops=k * batch.real_tokens * model_flops_per_token(model, batch.model_context),
        setup_matmul_flops_per_sample=setup_flops,
        setup_memory_bytes_per_sample=setup_bytes,
        collectives=step_collectives(model, traits, k, model_state_bytes(model, traits)[1], device_kind),
        zero_params=0.0 if device_kind == "cuda" else zero_params,
        zero_bytes=zero_bytes,
    )


def elementwise_layer_bytes(
    model: ModelSpec, traits: MemoryTraits, speed: SpeedTraits, device_kind: str, shape: MicroBatchShape, saved: int
) -> float:
    """The bytes one layer's elementwise ops read and write in a micro-batch (``saved``: what the layer keeps for
    its backward, :func:`~autotune.estimate._activations.layer_activation_bytes`).

    Fused (``torch.compile``'s inductor, or Liger's kernels for the norms, rotary and the gated activation): each
    chain of ops writes what leaves it and reads it back once, :data:`FUSED_ELEMENTWISE_PASSES` over ``saved``. In
    eager mode every op reads and writes its tensors: counted from the model's own code per token
    (:func:`~autotune.estimate._elementwise.eager_layer_traffic`), the materialised attention scores
    (``a s^2`` per row, which that count leaves out) at :data:`ELEMENTWISE_PASSES`; where the model cannot be
    counted, :data:`ELEMENTWISE_PASSES` over ``saved``. A recomputed forward (checkpointing) moves its forward's
    bytes once more."""
    recompute = 1 if traits.recompute else 0
    if speed.fuses_elementwise or traits.fused_block_kernels:
        return saved * (FUSED_ELEMENTWISE_PASSES + recompute)
    traffic = eager_layer_traffic(model, compute_weight_bytes(traits), traits.half_autocast)
    if traffic is None:
        return saved * (ELEMENTWISE_PASSES + recompute)
    tokens = shape.rows * shape.row_tokens
    scores = attention_score_bytes(model, traits, device_kind, shape)
    return tokens * (traffic.forward * (1 + recompute) + traffic.backward) + scores * (ELEMENTWISE_PASSES + recompute)


def plain_loss_logits(model: ModelSpec, traits: MemoryTraits, tokens: float) -> float:
    """The ``V x tokens`` logits the plain loss goes over; none for a classification head, and none where a
    fused loss (Liger's, TRL's chunked head) keeps the logits in tiles it consumes at once (its own count:
    :func:`fused_head_fallback_logits`)."""
    if model.task not in ("causal-lm", "masked-lm") or model.fused_lm_head or traits.logits is not None:
        return 0.0
    return tokens * model.vocab_size


def reference_forward(model: ModelSpec, batch: TypicalBatch, device_kind: str) -> tuple[float, float]:
    """The reference model's forward over one micro-batch (DPO; ``(0, 0)`` without a reference), the one count
    of it whether each step runs it or the trainer runs it once over the data before training
    (``precompute_ref_log_probs``): its matmul FLOPs (no gradient; under PEFT the base with the adapters
    disabled) and, off CUDA, TRL's head's torch passes over the batch's logits for its log-probabilities
    (:data:`FUSED_HEAD_FALLBACK_REFERENCE_BYTES_PER_LOGIT`)."""
    if not model.holds_reference:
        return 0.0, 0.0
    flops = batch.computed_tokens * recompute_flops_per_token(
        dataclasses.replace(model, peft=None), batch.attended_context
    )
    head = 0.0
    if model.fused_lm_head and device_kind != "cuda":
        head = FUSED_HEAD_FALLBACK_REFERENCE_BYTES_PER_LOGIT * batch.computed_tokens * model.vocab_size
    return flops, head


def fused_head_fallback_logits(model: ModelSpec, tokens: float, device_kind: str) -> float:
    """The ``V x tokens`` logits TRL's fused head folds in torch ops off CUDA, over every padded position
    (``tokens``: the batch's computed tokens; TRL's batches padded to their longest); none on CUDA, nor without
    TRL's head. Counted at the memory bandwidth as 188 bytes a logit until 2026-11-30, it put the CPU's SFT trials
    4.7x fast in real tokens/s (median of 8; docs/benchmarks.md, "The throughput prior")."""
    if not model.fused_lm_head or device_kind == "cuda":
        return 0.0
    return tokens * model.vocab_size


def fused_head_fp32_backward_flops(model: ModelSpec, tokens: float, device_kind: str, matmul_dtype: str) -> float:
    """The FLOPs of TRL's fused head's backward that run in fp32 off CUDA under 16-bit autocast
    (:data:`FUSED_HEAD_FALLBACK_FP32_BACKWARD`): the hidden states' gradient (``2 V h`` per projected token:
    off CUDA every position of the padded batch) and, unless the head is frozen under PEFT, the head's own
    (``2 V h``); none on CUDA or in fp32."""
    if not model.fused_lm_head or device_kind == "cuda" or matmul_dtype not in FUSED_HEAD_FALLBACK_FP32_BACKWARD:
        return 0.0
    per_token = (2 if model.peft is not None else 4) * model.vocab_size * model.hidden_size
    return per_token * tokens


def weight_read_bytes(model: ModelSpec, traits: MemoryTraits) -> float:
    """The bytes the matmuls' weights move per micro-batch, in the bytes they run in.

    A trained weight is read in the forward and for the backward's input gradient, and its gradient is written
    (three passes); a frozen one (the base under PEFT) only read (two); a recomputed forward reads each once more.
    Under 16-bit autocast over fp32 weights each forward writes the 16-bit copy from the fp32 weight it reads. A
    4-bit base weight (QLoRA) is dequantized at each use, in the backward again (bitsandbytes' ``MatMul4Bit``):
    read at its 4-bit size (:data:`~autotune.estimate._parts.QUANTIZED_4BIT_BYTES`), written at 16 bits and read
    there by the matmul, and has no autocast copy. (Until 2026-12-01 a frozen weight counted the gradient's pass,
    and a 4-bit one the fp32 weight's autocast copy: QLoRA's weights at 12 bytes a parameter a micro-batch, 9.1
    as they run.)"""
    params = model.num_non_embedding_params
    recompute = 1 if traits.recompute else 0
    frozen = model.peft is not None
    quantized = model.peft.quantized_params if model.peft is not None else 0
    passes = (2 if frozen else 3) + recompute
    dense = params - quantized
    if traits.half_autocast and traits.weight_bytes == 4:
        dense_bytes = dense * (2 * passes + (4 + 2) * (1 + recompute))
    else:
        dense_bytes = dense * traits.weight_bytes * passes
    dequantized = quantized * (2 + recompute) * (QUANTIZED_4BIT_BYTES + 2 + 2)
    return dense_bytes + dequantized
