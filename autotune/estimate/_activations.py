"""The activations of one configuration: what autograd keeps for each layer, for the whole model at the
peak, and what TRL's activation offloading moves to the host (a part of the estimator's arithmetic,
``_parts.py``, which adds them up).
"""

from __future__ import annotations

from collections.abc import Sequence

from autotune.estimate._experts import folded_expert_weight_bytes, routed_expert_bytes_per_token
from autotune.estimate._zero import compute_weight_bytes
from autotune.levers import MemoryTraits, MicroBatchShape
from autotune.spec.models import ModelSpec

# Under full checkpointing, layers' worth of activations alive in the backward pass. On CUDA the layer
# being recomputed (1): with what the block's layout keeps counted (saved_layer_bytes), its transient
# gradient tensors fit in the count's margin (the H200's checkpointed trials, docs/estimator.md,
# "Activations"; 2 before the layout was counted). On the CPU, measured on bert-tiny/bert-mini (L = 2, 4),
# 2.5: malloc does not reuse the previous layer's freed recompute buffers at once (docs/benchmarks.md).
CHECKPOINT_WORKING_LAYERS = {"cpu": 2.5, "cuda": 1.0}
# Config keys of the attention-probability dropout, by architecture family.
_ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attn_pdrop", "attention_dropout", "attn_dropout")


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

    What the layers keep (:func:`kept_layer_bytes`), and under checkpointing the working layers of its
    backward (one recomputed, with its gradients); under TRL's activation offloading the working layers
    alone (what the layers keep is on the host: :func:`offloaded_activation_bytes`). Embeddings: int64 ids (and
    position ids), summed embeddings, layer norm input and dropout mask. A flattened batch under a mask-based
    kernel adds its ``T x T`` boolean mask (:func:`packed_mask_bytes`).
    """
    shape = shape or MicroBatchShape(rows=traits.rows, row_tokens=seq_len)
    _, r = activation_element_bytes(traits.half_autocast, compute_weight_bytes(traits))
    layer = saved_layer_bytes(model, traits, seq_len, device_kind, shape)
    embeddings = (2 * 8 + (2 * r + 1) * model.hidden_size) * shape.tokens + packed_mask_bytes(traits, shape)
    working = CHECKPOINT_WORKING_LAYERS[device_kind] * (layer + folded_expert_weight_bytes(model, traits)[1])
    if traits.activations_offloaded:
        # TRL's offloading (trl/models/activation_offloading.py) moves every saved tensor to pinned host
        # memory as the forward makes it and brings each back for its layer's backward: the device
        # holds about the working layers of checkpointing's backward (counted so, a bound).
        return int(working + embeddings)
    kept = kept_layer_bytes(model, traits, seq_len, device_kind, shape)
    return int(kept + working + embeddings) if traits.recompute else kept + embeddings


def kept_layer_bytes(
    model: ModelSpec, traits: MemoryTraits, seq_len: int, device_kind: str, shape: MicroBatchShape
) -> int:
    """What the layers keep for the backward at its start: under full checkpointing (one checkpoint per layer,
    as HF's ``activation_checkpointing`` does) each layer's input ``r sbh``; else every layer's saved tensors,
    one layer's worth more for the gradient tensors alive while its backward runs, and any folded expert
    weights."""
    if traits.recompute:
        r = activation_element_bytes(traits.half_autocast, compute_weight_bytes(traits))[1]
        return model.num_layers * r * shape.tokens * model.hidden_size
    layer = saved_layer_bytes(model, traits, seq_len, device_kind, shape)
    return (model.num_layers + 1) * layer + folded_expert_weight_bytes(model, traits)[0]


def offloaded_activation_bytes(
    model: ModelSpec, traits: MemoryTraits, seq_len: int, device_kind: str, shape: MicroBatchShape
) -> int:
    """What TRL's activation offloading keeps in pinned host memory: what the layers keep
    (:func:`kept_layer_bytes`; a bound: tensors under 1 KiB and the output head's stay on the device,
    trl/models/activation_offloading.py ``min_offload_size``, ``NoOpManager``); 0 without it."""
    return kept_layer_bytes(model, traits, seq_len, device_kind, shape) if traits.activations_offloaded else 0


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
