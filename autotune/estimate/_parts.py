"""The parts of one configuration's predicted peak memory (the estimator's arithmetic).

Each part is a function a user can check by hand; ``estimate_peak`` adds them up, with the corrections
of a :class:`~autotune.estimate._prior.MemoryFit` (the prior, or fitted on measured trials). The parts
read a configuration through its :class:`~autotune.levers.MemoryTraits` (each lever's own words for
what its value does to memory), never a lever by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.estimate._experts import folded_expert_weight_bytes, routed_expert_bytes_per_token
from autotune.estimate._fsdp import fsdp_state_bytes
from autotune.estimate._logits import logits_bytes
from autotune.estimate._prior import MemoryFit
from autotune.estimate._zero import DEEPSPEED_CPU_PROCESS_BYTES, compute_weight_bytes, zero_state_bytes
from autotune.levers import (
    BNB_OPTIMIZERS,
    STATE_BYTES_PER_PARAM,
    STATES_IN_PARAM_DTYPE,
    MemoryTraits,
    MicroBatchShape,
    TrialConfig,
    memory_traits,
)
from autotune.spec.models import ModelSpec

# Under full checkpointing, layers' worth of activations alive in the backward pass. On CUDA the layer
# being recomputed (1): with what the block's layout keeps counted (saved_layer_bytes), its transient
# gradient tensors fit in the count's margin (the H200's checkpointed trials, docs/estimator.md,
# "Activations"; 2 before the layout was counted). On the CPU, measured on bert-tiny/bert-mini (L = 2, 4),
# 2.5: malloc does not reuse the previous layer's freed recompute buffers at once (docs/benchmarks.md).
CHECKPOINT_WORKING_LAYERS = {"cpu": 2.5, "cuda": 1.0}
# A 4-bit (NF4) weight: half a byte, plus one fp32 absmax per block of 64 (bitsandbytes'
# ``quantize_4bit`` default blocksize; double quantization would shrink that to ~1/64 byte: a bound).
QUANTIZED_4BIT_BYTES = 0.5 + 4 / 64
# Config keys of the attention-probability dropout, by architecture family.
_ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout", "attn_dropout")


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak memory of one configuration, by part, in bytes."""

    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    context_bytes: int
    allocator_bytes: int = 0
    # What ZeRO offload keeps in host memory (not a part of the device's peak, except on the CPU,
    # where the host is the device's memory and the parts already hold it).
    host_bytes: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.parts().values())

    @property
    def model_state_bytes(self) -> int:
        """Weights, gradients and optimizer states: the parts that do not depend on the batch."""
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    def parts(self) -> dict[str, int]:
        return {
            "weights": self.weights_bytes,
            "gradients": self.gradients_bytes,
            "optimizer states": self.optimizer_bytes,
            "activations": self.activations_bytes,
            "logits": self.logits_bytes,
            "allocator": self.allocator_bytes,
            "context": self.context_bytes,
        }


def estimate_peak(
    model: ModelSpec,
    config: TrialConfig,
    seq_len: int,
    fit: MemoryFit,
    lengths: Sequence[int] | None = None,
) -> MemoryEstimate:
    """Predict a configuration's peak memory, as the trial's memory probe would measure it.

    Args:
        model: The model's shape.
        config: The lever values, read through their memory traits on the fit's device kind
            (:func:`autotune.levers.memory_traits`).
        seq_len: Tokens per sample.
        fit: The memory model's corrections for the device: its prior (``memory_prior``) or fitted.
            Its ``device_kind`` says what is predicted: ``cpu``, the peak resident set of the process
            tree; ``cuda``, device memory. Its ``ranks`` (``Workload.devices_per_trial``, set by
            ``Workload.memory_prior``) are the trial's, over which ZeRO partitions: the estimate is
            one rank's.
        lengths: Real token lengths of the user's samples (``--dataset``), which set the tokens of
            the fullest micro-batch where samples are not padded to ``seq_len``
            (:func:`micro_batch_shape`); ``None``: every sample is ``seq_len`` tokens (the bound).
    """
    device_kind = fit.device_kind
    traits = trainer_rows(model, memory_traits(config, device_kind))
    shape = micro_batch_shape(traits, seq_len, lengths)
    weights, gradients, optimizer = model_state_bytes(model, traits)
    weights += reference_weights_bytes(model, traits)
    host = 0
    if traits.zero_stage:
        zero = zero_state_bytes(model, traits, fit.ranks, device_kind)
        weights, gradients, optimizer, host = (
            zero.weights_bytes,
            zero.gradients_bytes,
            zero.optimizer_bytes,
            zero.host_bytes,
        )
    elif traits.fsdp_reshards is not None:
        weights, gradients, optimizer = fsdp_state_bytes(model, traits, fit.ranks, (weights, gradients, optimizer))
    else:  # ZeRO and FSDP reduce through their own collectives, not DDP's buckets
        gradients += ddp_bucket_bytes(gradients, fit.ranks)
    activations = int(activation_bytes(model, traits, seq_len, device_kind, shape) * fit.activation_scale)
    logits = logits_bytes(model, traits, seq_len, shape, device_kind)
    return MemoryEstimate(
        weights_bytes=weights,
        gradients_bytes=gradients,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        logits_bytes=logits,
        context_bytes=context_bytes(fit.context_bytes, traits, device_kind, weights),
        allocator_bytes=allocator_overhead_bytes(fit, activations + logits + gradients),
        host_bytes=host,
    )


def trainer_rows(model: ModelSpec, traits: MemoryTraits) -> MemoryTraits:
    """The traits with the rows the trainer puts in a micro-batch: ``rows_per_sample`` a sample (DPO: a pair's
    prompt + chosen and prompt + rejected rows, one forward: trl/trainer/dpo_trainer.py:146-210)."""
    if model.rows_per_sample == 1:
        return traits
    return dataclasses.replace(traits, rows=traits.rows * model.rows_per_sample)


def runs_reference(model: ModelSpec, traits: MemoryTraits) -> bool:
    """Whether each step runs a reference model's forward (DPO, unless its log-probabilities were precomputed)."""
    return model.holds_reference and not traits.reference_precomputed


def precomputes_reference(model: ModelSpec, traits: MemoryTraits) -> bool:
    """Whether the trainer runs the reference's forward over the whole train set once, before its first step
    (DPO's ``precompute_ref_log_probs``), instead of in every step."""
    return model.holds_reference and traits.reference_precomputed


def reference_weights_bytes(model: ModelSpec, traits: MemoryTraits) -> int:
    """The reference copy's weights: in the policy's dtype, no gradients or optimizer states (TRL loads it
    with the policy's dtype: trl/trainer/dpo_trainer.py:924); none under PEFT (the base with the adapters
    disabled is the reference) or a precomputed reference (docs/facts.md, "DPO")."""
    if not model.keeps_reference_copy(traits.reference_precomputed):
        return 0
    return int(model.num_params * traits.weight_bytes)


def ddp_bucket_bytes(gradients_bytes: int, ranks: int) -> int:
    """What plain DDP adds on each of ``ranks`` ranks: its gradient buckets, a second copy of the gradients.

    DDP's reducer all-reduces gradients through flat bucket tensors that hold every gradient once
    more (torch/nn/parallel/distributed.py, ``DistributedDataParallel``: "gradient_as_bucket_view ...
    can reduce peak memory usage, where the saved memory size will be equal to the total gradients
    size"). Neither transformers nor accelerate turn the view on (transformers/trainer.py passes
    ``find_unused_parameters``, ``bucket_cap_mb``, ``broadcast_buffers``, ``static_graph`` to
    accelerate's ``DistributedDataParallelKwargs``, whose ``gradient_as_bucket_view`` defaults to
    False), so a multi-rank trial holds the copy. One rank: no DDP, nothing.
    """
    return gradients_bytes if ranks > 1 else 0


def allocator_overhead_bytes(fit: MemoryFit, transient_bytes: int) -> int:
    """What the CUDA caching allocator reserves beyond the live tensors at the peak (0 on the CPU).

    The cuBLAS/cuBLASLt workspaces, plus a share of the memory allocated and freed every step
    (``transient_bytes``: activations, logits, gradients) left reserved by rounding and
    fragmentation (:data:`ALLOCATOR_FRAGMENTATION_SHARE`).
    """
    return fit.workspace_bytes + int(fit.allocator_share * transient_bytes)


def model_state_bytes(model: ModelSpec, traits: MemoryTraits) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) in bytes: the model states of docs/facts.md.

    fp32 weights: HF Trainer trains fp32 parameters under fp16/bf16 (autocast, mixed precision), so
    weights and gradients are 4 bytes per parameter whatever the autocast. Autocast casts each matmul
    weight to 16 bits once per forward and autograd keeps that copy for the backward (the input
    gradient needs it, frozen or not): 2 more bytes per compute parameter (lookup-only embeddings are
    not cast; 4-bit weights are dequantized again in the backward by bitsandbytes' ``MatMul4Bit``,
    nothing kept). Under checkpointing autograd keeps no copy: each layer casts its weights again when
    its backward recomputes it, one layer's worth at a time (measured on the H200, 2026-11-30: with the
    copies counted, Llama-3.2-1B's checkpointed peak was predicted 17 % high, 8 % without).
    bf16 weights: 2 bytes per weight and gradient, no copy.

    Under PEFT (``model.peft``) the base is frozen: its weights only (4-bit ones at
    :data:`QUANTIZED_4BIT_BYTES`); the adapters are fp32 whatever the base (peft's
    ``get_peft_model(autocast_adapter_dtype=True)`` casts bf16/fp16 adapters up), with fp32
    gradients and optimizer states.
    """
    n = model.num_params
    weight_bytes = traits.weight_bytes
    compute_params = model.num_non_embedding_params - model.other_modality_params  # a tower text never runs: no copy
    if model.peft is None:
        weights, gradients = weight_bytes * n, weight_bytes * model.trainable_params
    else:
        adapters, quantized = model.peft.adapter_params, model.peft.quantized_params
        weights = weight_bytes * (n - quantized) + int(QUANTIZED_4BIT_BYTES * quantized) + 4 * adapters
        gradients = 4 * adapters
        compute_params += adapters - quantized
    if traits.half_autocast and weight_bytes == 4 and not traits.recompute:
        weights += 2 * compute_params
    return weights, gradients, optimizer_state_bytes(model, traits.optimizer, weight_bytes)


def optimizer_state_bytes(model: ModelSpec, optim: str, weight_bytes: int = 4) -> int:
    """Bytes of optimizer state for the trainable parameters (``model.trainable_params``).

    8-bit optimizers keep 32-bit states for embeddings (HF Trainer registers ``nn.Embedding`` as
    32-bit with bitsandbytes, docs/facts.md). Adafactor (``beta1=None`` in HF) keeps, per matrix, one row
    and one column vector instead of a full second moment, and a full one for vectors. torch's
    optimizers keep their states in the parameter's dtype (:data:`STATES_IN_PARAM_DTYPE`): half the
    bytes under bf16 weights. PEFT adapters are fp32 low-rank matrices, no embedding table: their
    states count in full (Adafactor's as unfactored, a bound on a small part).
    """
    trainable = model.trainable_params
    if model.peft is not None:
        return int((4.0 if optim == "adafactor" else STATE_BYTES_PER_PARAM.get(optim, 8.0)) * trainable)
    if optim == "adafactor":
        return 4 * adafactor_state_elements(model)
    if optim in BNB_OPTIMIZERS:
        embedding = _embedding_table_params(model)
        return int(STATE_BYTES_PER_PARAM[optim] * (trainable - embedding) + 8 * embedding)
    in_param_dtype = optim in STATES_IN_PARAM_DTYPE and weight_bytes != 4
    scale = weight_bytes / 4 if in_param_dtype else 1.0
    return int(STATE_BYTES_PER_PARAM.get(optim, 8.0) * scale * trainable)


def adafactor_state_elements(model: ModelSpec) -> int:
    """Factored second-moment elements: rows + columns per matrix, all elements per vector.

    Per block: Q, K, V, output (h x h, or h x kv-width), FFN in and out (h x f, twice for gated
    FFNs is not distinguished: the term is small), plus biases and layer norms (~ 9h + f).
    Embedding tables: V + h, and the position table.
    """
    h, f, layers = model.hidden_size, model.intermediate_size, model.num_layers
    per_block = 4 * (h + h) + 2 * (h + f) + 9 * h + f
    tables = model.vocab_size + h + (model.max_positions + h if model.max_positions else 0)
    return layers * per_block + tables


def _embedding_table_params(model: ModelSpec) -> int:
    """Parameters in ``nn.Embedding`` tables, the token table included even when tied to the head."""
    token_table = model.vocab_size * model.hidden_size
    if model.num_embedding_params >= token_table:
        return model.num_embedding_params
    return model.num_embedding_params + token_table


def activation_element_bytes(half_autocast: bool, compute_weight_bytes: int = 4) -> tuple[int, int]:
    """(matmul-input bytes, residual-stream bytes) per saved element.

    Under autocast the matmul inputs autograd keeps are 16-bit copies, while the residual stream,
    layer-norm inputs and softmax outputs stay fp32 (autocast runs those ops in fp32). With 16-bit
    weights the embeddings and every layer's output are 16-bit: the residual stream is too.
    """
    if compute_weight_bytes == 2:
        return (2, 2)
    return (2, 4) if half_autocast else (4, 4)


def layer_activation_bytes(
    model: ModelSpec, traits: MemoryTraits, seq_len: int, device_kind: str, shape: MicroBatchShape | None = None
) -> int:
    """Bytes autograd keeps for one transformer layer, micro-batch included.

    Korthikanti et al. 2022, section 4.1, with ``p`` the matmul-input element size, ``r`` the
    residual/normalisation/softmax element size, ``q`` the attention element size, 1-byte dropout
    masks:

    * attention: QKV input ``p sbh``; Q, K, V ``3 q sbh`` (K and V narrower under grouped-query
      attention); output projection's input ``p sbh``; its dropout mask ``sbh``; scores: softmax
      output ``r as^2b``, dropout mask ``as^2b``, dropout output ``q as^2b``;
    * MLP: input ``p sbh``, activation-function input and second matmul's input ``2 p sbf``, dropout
      mask ``sbh``;
    * two layer norms' inputs ``2 r sbh``.

    With p = q = r = 2 and f = 4h this is the paper's ``sbh(34 + 5as/h)``. Fused attention (SDPA's
    flash / memory-efficient kernels) keeps no ``s x s`` tensor; autotune counts them for eager
    attention, and on the CPU where SDPA with dropout in training falls back to the math kernel.
    Measured on the CPU (docs/benchmarks.md): autocast runs attention in fp32 (q = 4 under bf16)
    and the score dropout mask is kept as a float tensor (4 bytes, not 1).

    ``s x b`` is the micro-batch's tokens (:class:`MicroBatchShape`): the scores are ``s^2`` per
    row, so a flattened (padding-free) row of ``T`` tokens keeps ``a T^2`` scores where it keeps any,
    ``b`` times those of ``b`` rows of ``s = T / b``; a materialising kernel makes padding-free worse.
    """
    shape = shape or MicroBatchShape(rows=traits.rows, row_tokens=seq_len)
    p, r = activation_element_bytes(traits.half_autocast, compute_weight_bytes(traits))
    q = r if device_kind == "cpu" else p
    s, b = shape.row_tokens, shape.rows
    h, f = model.hidden_size, model.intermediate_size
    kv_fraction = model.num_kv_heads / model.num_heads  # grouped-query attention keeps smaller K, V
    per_token = p * h + (1 + 2 * kv_fraction) * q * h + p * h + h + p * h + 2 * p * f + h + 2 * r * h
    return int(per_token * s * b + attention_score_bytes(model, traits, device_kind, shape))


def attention_score_bytes(model: ModelSpec, traits: MemoryTraits, device_kind: str, shape: MicroBatchShape) -> int:
    """The ``a s^2 b`` part of :func:`layer_activation_bytes`: the scores a materialising kernel keeps (softmax
    output, dropout mask, dropout output); 0 where the kernel keeps none."""
    if not materializes_attention_scores(model, traits, device_kind):
        return 0
    p, r = activation_element_bytes(traits.half_autocast, compute_weight_bytes(traits))
    q = r if device_kind == "cpu" else p
    score_mask = q if device_kind == "cpu" else 1
    return int((r + score_mask + q) * model.num_heads * shape.row_tokens**2 * shape.rows)


def saved_layer_bytes(
    model: ModelSpec, traits: MemoryTraits, seq_len: int, device_kind: str, shape: MicroBatchShape | None = None
) -> int:
    """Bytes autograd keeps for one layer: Korthikanti's count (:func:`layer_activation_bytes`) with what the
    block's layout and the adapters change in it (:func:`layout_bytes_per_token`), for each token."""
    shape = shape or MicroBatchShape(rows=traits.rows, row_tokens=seq_len)
    per_token = layout_bytes_per_token(model, traits, device_kind)
    return max(layer_activation_bytes(model, traits, seq_len, device_kind, shape) + per_token * shape.tokens, 0)


def layout_bytes_per_token(model: ModelSpec, traits: MemoryTraits, device_kind: str) -> int:
    """What one layer keeps per token beyond (or, under adapters, short of) Korthikanti's block.

    Counted with saved-tensor hooks on decoder blocks (tests/estimate/test_saved_activations.py), from
    the block's :class:`~autotune.spec.models.BlockLayout`:

    * under autocast with fp32 weights, each projection reading an input casts and keeps its own 16-bit
      copy (three for separate Q, K, V; two for a gate and an up projection), where the count has one;
    * a gated MLP keeps its gate's output, the activation and the up projection's output (three ``p f``)
      where a two-matrix MLP keeps one;
    * transformers' RMSNorm keeps its fp32 input and the normalised input (two ``r h``) where LayerNorm
      keeps its input;
    * an activation written in Python keeps its intermediates (``activation_extra_tensors``: GPT-2's
      ``gelu_new``, three ``p f``);
    * fused block kernels (``traits.fused_block_kernels``: Liger's) keep a norm's input alone and the gated
      MLP's gate and up outputs, recomputing the activation: one ``r h`` a norm, three ``p f``;
    * a fused attention kernel (SDPA's flash or memory-efficient, FlashAttention) keeps its output for
      the backward, beside the output projection's own (contiguous) input.

    Under adapters (``--peft``) the base is frozen: a frozen linear keeps no input (its weight's gradient
    is never computed, and autograd saves what a gradient it computes needs: the torch docs' autograd notes,
    "Excluding subgraphs from backward"; the hooks count agrees), nor does a frozen
    RMSNorm's weight product; each adapter keeps its dropout mask (bool on CUDA; on the CPU the float
    mask of its fp32 input) and its 16-bit (fp32 without autocast) input copy, over
    ``PeftSpec.adapted_input_width``.
    """
    p, r = activation_element_bytes(traits.half_autocast, compute_weight_bytes(traits))
    layout = model.block_layout
    h, f = model.hidden_size, model.intermediate_size
    copies = traits.half_autocast and compute_weight_bytes(traits) == 4  # autocast casts each op's input anew
    attention_inputs = layout.attention_input_projections if copies else 1
    mlp_inputs = layout.mlp_input_projections if copies else 1
    # f-wide tensors a trainable MLP keeps (Korthikanti: 2); a fused gated kernel recomputes the activation,
    # a Python activation keeps its intermediates.
    mlp_saved: float = (3 if traits.fused_block_kernels else 4) if layout.gated_mlp else 2
    if not (layout.gated_mlp and traits.fused_block_kernels):
        mlp_saved += layout.activation_extra_tensors
    norm_saved = 2 if layout.rms_norm and not traits.fused_block_kernels else 1
    kernel_output = p * h if not materializes_attention_scores(model, traits, device_kind) else 0
    routed = routed_expert_bytes_per_token(model, p, compute_weight_bytes(traits), model.experts_get_weight_gradients)
    if model.peft is None:
        return int(
            (attention_inputs - 1) * p * h
            + (mlp_inputs - 1) * p * h
            + (mlp_saved - 2) * p * f
            + 2 * (norm_saved - 1) * r * h
            + kernel_output
            + routed
        )
    mask = 1 if device_kind == "cuda" else 4
    dropout = float(model.peft.adapter_config.get("lora_dropout", 0.0) or 0.0)
    adapter_copy = 2 if traits.half_autocast else 4
    adapters = ((mask if dropout > 0 else 0) + adapter_copy) * model.peft.adapted_input_width
    # Frozen: the QKV, output-projection and MLP inputs (3 p h), the MLP's second input (p f) and RMSNorm's
    # weight product are not kept; the gated MLP's three f-wide tensors (or the activation's input) are.
    frozen_mlp_saved = mlp_saved - 1
    return int(-3 * p * h + (frozen_mlp_saved - 2) * p * f + kernel_output + adapters + routed)


def materializes_attention_scores(model: ModelSpec, traits: MemoryTraits, device_kind: str) -> bool:
    """Whether the ``a x s x s`` attention scores are kept for the backward pass."""
    if traits.attention == "materialized":
        return True
    if traits.attention == "tiled":
        return False  # tiled kernels: the scores live in on-chip memory, a block at a time
    # SDPA (the transformers default where supported): fused kernels on CUDA; on the CPU the fused
    # kernel has no dropout, so training with attention dropout runs the math kernel.
    return device_kind == "cpu" and attention_dropout(model) > 0


def attention_dropout(model: ModelSpec) -> float:
    for key in _ATTENTION_DROPOUT_KEYS:
        value = model.text_config.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def activation_bytes(
    model: ModelSpec, traits: MemoryTraits, seq_len: int, device_kind: str, shape: MicroBatchShape | None = None
) -> int:
    """Activations of the whole model at the peak (start of the backward pass), before the fit.

    Without checkpointing: every layer's saved tensors, plus one layer's worth of gradient tensors
    alive while its backward runs. With full checkpointing (one checkpoint per layer, as HF's
    ``activation_checkpointing`` does): each layer's input ``r sbh``, plus one layer recomputed and
    its gradients. Embeddings: int64 ids (and position ids), summed embeddings, layer norm input and
    dropout mask. A flattened batch under a mask-based kernel adds its ``T x T`` boolean mask
    (:func:`packed_mask_bytes`).
    """
    shape = shape or MicroBatchShape(rows=traits.rows, row_tokens=seq_len)
    _, r = activation_element_bytes(traits.half_autocast, compute_weight_bytes(traits))
    tokens, h = shape.tokens, model.hidden_size
    layer = saved_layer_bytes(model, traits, seq_len, device_kind, shape)
    embeddings = (2 * 8 + (2 * r + 1) * h) * tokens + packed_mask_bytes(traits, shape)
    folded, folded_layer = folded_expert_weight_bytes(model, traits)
    working = CHECKPOINT_WORKING_LAYERS[device_kind] * (layer + folded_layer)
    if traits.activations_offloaded:
        # TRL's offloading (trl/models/activation_offloading.py) moves every saved tensor to pinned host
        # memory as the forward makes it and brings each back for its layer's backward: the device
        # holds about the working layers of checkpointing's backward (counted so, a bound).
        return int(working + embeddings)
    if traits.recompute:
        return int(model.num_layers * r * tokens * h + working + embeddings)
    return (model.num_layers + 1) * layer + folded + embeddings


def packed_mask_bytes(traits: MemoryTraits, shape: MicroBatchShape) -> int:
    """The block-diagonal mask of a flattened batch: ``T x T`` booleans, kept for the backward.

    transformers/masking_utils.py builds it from the position ids for every mask-based attention
    (eager, sdpa, flex's block mask is smaller: counted the same, a bound); flash kernels read the
    sequence boundaries instead and need none.
    """
    if not traits.batching.flattened or traits.reads_boundaries:
        return 0
    return shape.row_tokens * shape.row_tokens


def micro_batch_shape(traits: MemoryTraits, seq_len: int, lengths: Sequence[int] | None = None) -> MicroBatchShape:
    """The fullest micro-batch a trial can meet, which sets its peak memory: ``rows`` samples of
    ``seq_len`` where no lengths are known (synthetic tokens, or the bound), else the fullest one its
    batching makes of the data's lengths (``Batching.fullest``: padded to the longest, flattened, packed).
    A flattened batching without known lengths is one row of ``rows x seq_len`` tokens (its mask is
    that row's square)."""
    if lengths is None or not len(lengths):
        if traits.batching.flattened:
            return MicroBatchShape(rows=1, row_tokens=traits.rows * seq_len)
        return MicroBatchShape(rows=traits.rows, row_tokens=seq_len)
    return traits.batching.fullest(traits.rows, seq_len, lengths)


def context_bytes(per_process_bytes: int, traits: MemoryTraits, device_kind: str, weights_bytes: int) -> int:
    """What the process (tree) holds besides tensors of this configuration.

    On the CPU each dataloader worker is a fork of the trial process: its resident set counts the
    interpreter and the fp32 weights again (the probe sums resident sets over the tree). A CPU trial
    under ZeRO also holds DeepSpeed's modules and ops (:data:`DEEPSPEED_CPU_PROCESS_BYTES`), once.
    """
    deepspeed = DEEPSPEED_CPU_PROCESS_BYTES if device_kind == "cpu" and traits.zero_stage else 0
    workers = traits.forked_workers  # set on the CPU only (the dataloader lever moves memory there)
    return per_process_bytes * (1 + workers) + workers * weights_bytes + deepspeed
