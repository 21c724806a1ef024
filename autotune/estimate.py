"""Analytical peak-memory model of one training configuration, calibrated online from measured trials.

The estimate is a sum of parts a user can check by hand:

* **weights**: fp32 parameters (HF Trainer keeps fp32 master weights under fp16/bf16 mixed
  precision), plus the half-precision copies autocast makes of every matmul weight and keeps for
  the backward pass;
* **gradients**: one fp32 gradient per parameter;
* **optimizer states**: bytes per parameter per optimizer (docs/facts.md: AdamW 8; 8-bit AdamW 2 with
  embeddings kept 32-bit; Adafactor's factored second moment; SGD without momentum 0);
* **activations**: what autograd keeps per transformer layer, after Korthikanti et al. 2022
  ("Reducing Activation Recomputation in Large Transformer Models", section 4.1), generalised to
  the FFN width and to the element size of each saved tensor; with full (per-layer) checkpointing
  only each layer's input is kept, plus one layer recomputed in the backward pass;
* **logits**: the language-model head's ``b * s * V`` logits and the loss's fp32 copies (with Liger's
  fused linear cross-entropy, a chunk of about ``b * s * h`` instead);
* **allocator**: on CUDA, what the caching allocator reserves beyond the live tensors (cuBLAS and
  cuBLASLt workspaces, block rounding, fragmentation), so that the total predicts ``nvidia-smi``'s
  figure for the process (docs/estimator.md, "The CUDA prior"); 0 on the CPU;
* **context**: what the process holds before training. On CUDA the CUDA context and the kernels
  loaded into it, by GPU generation (docs/estimator.md); on the CPU the measured figure is the
  resident set of the whole process tree, which includes the interpreter with torch and
  transformers imported (and one copy of it per dataloader worker, since forked workers map the
  same pages).

The levers of search_spaces/README.md change these parts: a fused attention kernel (flash, flex,
SDPA's fused kernels on CUDA) keeps no ``s x s`` scores; Liger keeps no ``b x s x V`` logits; the
``padding`` knob changes the tokens of the fullest micro-batch (:func:`micro_batch_shape`), and a
flattened batch under a mask-based kernel adds its ``T x T`` mask. Length grouping and emptying the
cache change typical steps and the allocator's cache, not the tensors alive at the peak.

The model is a prior. :func:`fit_calibration` fits two explainable corrections from a study's
measured peaks, by least squares: the context (an offset) and one scale on the activations (the
least certain part; model states and logits are exact counts).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import Any

from autotune.config import FLASH_ATTENTIONS, TrialConfig
from autotune.models import ModelSpec
from autotune.units import GiB

MiB = 1024**2

# A forkserver trial child's resident set before it builds a model (python + torch + transformers
# imported), measured here (docs/benchmarks.md).
CPU_CHILD_START_RSS_BYTES = int(0.40 * GiB)
# The library pages a fresh process maps and a forkserver child does not, which the CPU probe adds
# (devices.unmapped_import_file_bytes): 114 MiB measured here.
CPU_UNMAPPED_LIBRARY_BYTES = int(0.10 * GiB)
# Before any trial is measured. CUDA: a generation's context (CUDA_CONTEXT_BYTES) where the
# compute capability is known, else the Ampere figure.
PRIOR_CONTEXT_BYTES = {"cpu": CPU_CHILD_START_RSS_BYTES + CPU_UNMAPPED_LIBRARY_BYTES, "cuda": int(0.6 * GiB)}

# The CUDA prior: what nvidia-smi shows for a training process beyond its live tensors. Evidence for
# each figure, and the prior's expected error, in docs/estimator.md ("The CUDA prior").
# The CUDA context with the kernels a training run loads into it, by the compute capability's major
# version: about 300-400 MB right after initialisation with lazy module loading (CUDA >= 11.7, the
# default in PyTorch; pytorch/pytorch#107667, #109888), more once cuBLAS, cuDNN and torch's training
# kernels are loaded; newer architectures carry larger kernel images.
CUDA_CONTEXT_BYTES = {7: int(0.5 * GiB), 8: int(0.6 * GiB), 9: int(0.7 * GiB)}
# cuBLAS's workspace per handle, allocated through the caching allocator: torch's default
# CUBLAS_WORKSPACE_CONFIG is ":4096:8" (32 MiB) on Hopper and newer, ":4096:2:16:8" (8 MiB + 128 KiB)
# before (aten/src/ATen/cuda/CublasHandlePool.cpp, getChosenWorkspaceSize, following the cuBLAS docs'
# cublasSetWorkspace advice). cuBLASLt gets a workspace of the same size: two per process.
CUBLAS_WORKSPACE_BYTES = {7: 4096 * 1024 * 2 + 16 * 1024 * 8, 8: 4096 * 1024 * 2 + 16 * 1024 * 8, 9: 4096 * 1024 * 8}
CUBLAS_WORKSPACES = 2
# Reserved over allocated at the peak, as a share of the memory that is allocated and freed every
# step (activations, logits, gradients): freed blocks split by later requests, 2 MiB rounding of
# large blocks, 1-10 MiB requests carved from 20 MiB segments, small ones from 2 MiB segments
# (torch/include/c10/core/AllocatorConfig.h: kSmallBuffer, kMinLargeAlloc, kRoundLarge). With
# expandable_segments the allocator maps 2 MiB pages into one growing segment and little is left
# between blocks (pytorch/pytorch#96995).
ALLOCATOR_FRAGMENTATION_SHARE = {"default": 0.15, "expandable_segments": 0.05}
# CPU resident memory runs ahead of the tensors alive: freed blocks stay in malloc's arenas. The
# prior activation scale says so (fitted on bert-mini, docs/benchmarks.md); calibration replaces it.
PRIOR_ACTIVATION_SCALE = {"cpu": 1.1, "cuda": 1.0}
# Calibrated scales outside this range mean the model is wrong for this setup, not that it needs
# stretching: the fit is clamped.
SCALE_BOUNDS = (0.5, 3.0)
# The fit needs this many measured trials, and this much spread in their activations, to
# estimate the scale; with fewer, only the context is fitted.
MIN_POINTS_FOR_SCALE = 3
MIN_RELATIVE_SPREAD_FOR_SCALE = 0.25
# ... and activations must be this share of the largest predicted peak, or their scale drowns in
# the noise of the other parts (a small LM is mostly logits).
MIN_ACTIVATION_SHARE_FOR_SCALE = 0.2

# Under full checkpointing, layers' worth of activations alive in the backward pass: the layer
# being recomputed and its gradients (2). On the CPU, measured on bert-tiny/bert-mini (L = 2, 4),
# resident memory holds half a layer more: malloc does not reuse the previous layer's freed
# recompute buffers at once (docs/benchmarks.md).
CHECKPOINT_WORKING_LAYERS = {"cpu": 2.5, "cuda": 2.0}
# Optimizer state bytes per parameter, for parameters in a matrix of >= 4096 elements (docs/facts.md;
# transformers' trainer_optimizer.py for which states each HF optimizer name creates).
_STATE_BYTES_PER_PARAM = {
    "adamw_torch": 8.0,  # exp_avg + exp_avg_sq, fp32
    "adamw_torch_fused": 8.0,
    "adamw_bnb_8bit": 2.0,  # two 8-bit states (block-wise quantisation adds ~1 %)
    "adamw_8bit": 2.0,
    "paged_adamw_8bit": 2.0,
    "lion_8bit": 1.0,  # one 8-bit momentum
    "sgd": 0.0,  # HF's "sgd" is torch.optim.SGD with momentum 0 unless --optim_args sets it
    "adagrad": 4.0,  # state_sum
    "rmsprop": 4.0,  # square_avg
}
_BNB_OPTIMIZERS = ("adamw_bnb_8bit", "adamw_8bit", "paged_adamw_8bit", "lion_8bit")
_HALF_DTYPES = ("fp16", "bf16")
# Config keys of the attention-probability dropout, by architecture family.
# Attention kernels that keep no s x s scores (tiled: FlashAttention, Dao et al. 2022; flex attention).
_FUSED_ATTENTIONS = (*FLASH_ATTENTIONS, "flex_attention")
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


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Corrections fitted from measured peaks: ``peak = context * processes + fixed + scale * activations``.

    Attributes:
        device_kind: ``cpu`` or ``cuda``.
        context_bytes: One process's baseline (CPU) or the CUDA context (GPU).
        activation_scale: Multiplies the activations (the model's least certain part).
        points: Measured trials the fit used (0: the priors).
        max_relative_error: Worst ``|predicted - measured| / measured`` over those trials after
            the fit; ``None`` with no points.
    """

    device_kind: str
    context_bytes: int
    activation_scale: float
    points: int = 0
    max_relative_error: float | None = None
    allocator_share: float = 0.0
    workspace_bytes: int = 0

    @classmethod
    def prior(
        cls, device_kind: str, compute_capability: tuple[int, int] | None = None, expandable_segments: bool = False
    ) -> Calibration:
        """The figures before any trial is measured.

        Args:
            device_kind: ``cpu`` or ``cuda``.
            compute_capability: On CUDA, the GPU's (its generation picks the context and the
                cuBLAS workspace); ``None``: the Ampere figures.
            expandable_segments: The allocator runs with ``expandable_segments:True``
                (``PYTORCH_ALLOC_CONF``), which leaves less fragmentation.
        """
        if device_kind != "cuda":
            return cls(device_kind, PRIOR_CONTEXT_BYTES[device_kind], PRIOR_ACTIVATION_SCALE[device_kind])
        major = min(max((compute_capability or (8, 0))[0], 7), 9)
        return cls(
            device_kind=device_kind,
            context_bytes=CUDA_CONTEXT_BYTES[major] if compute_capability else PRIOR_CONTEXT_BYTES["cuda"],
            activation_scale=PRIOR_ACTIVATION_SCALE[device_kind],
            allocator_share=ALLOCATOR_FRAGMENTATION_SHARE["expandable_segments" if expandable_segments else "default"],
            workspace_bytes=CUBLAS_WORKSPACES * CUBLAS_WORKSPACE_BYTES[major],
        )

    def describe(self) -> str:
        """One line a user can read: what the corrections are and where they come from."""
        context = f"context {self.context_bytes / GiB:.2f} GiB"
        scale = f"activation scale {self.activation_scale:.2f}"
        if self.allocator_share or self.workspace_bytes:
            scale += (
                f", allocator {self.allocator_share:.0%} of per-step memory + {self.workspace_bytes / MiB:.0f} MiB "
                "cuBLAS workspaces (docs/estimator.md)"
            )
        if not self.points:
            return f"prior ({context}, {scale}; not calibrated: no measured trial)"
        error = f", worst error {self.max_relative_error:.1%}" if self.max_relative_error is not None else ""
        return f"calibrated on {self.points} measured trial(s) ({context}, {scale}{error})"


def estimate_peak(
    model: ModelSpec,
    config: TrialConfig,
    seq_len: int,
    device_kind: str,
    calibration: Calibration | None = None,
    lengths: Sequence[int] | None = None,
) -> MemoryEstimate:
    """Predict a configuration's peak memory, as the trial's memory probe would measure it.

    Args:
        model: The model's shape.
        config: The knobs (micro-batch, checkpointing, dtype, optimizer, attention, workers).
        seq_len: Tokens per sample.
        device_kind: ``cpu`` (peak resident set of the process tree) or ``cuda`` (device memory).
        calibration: Fitted corrections; ``None`` uses the device's priors.
        lengths: Real token lengths of the user's samples (``--dataset``), which set the tokens of
            the fullest micro-batch under ``padding`` longest / padding_free
            (:func:`micro_batch_shape`); ``None``: every sample is ``seq_len`` tokens (the bound).
    """
    calibration = calibration or Calibration.prior(device_kind)
    shape = micro_batch_shape(config, seq_len, lengths)
    weights, gradients, optimizer = model_state_bytes(model, config)
    activations = int(activation_bytes(model, config, seq_len, device_kind, shape) * calibration.activation_scale)
    logits = logits_bytes(model, config, seq_len, shape)
    return MemoryEstimate(
        weights_bytes=weights,
        gradients_bytes=gradients,
        optimizer_bytes=optimizer,
        activations_bytes=activations,
        logits_bytes=logits,
        context_bytes=context_bytes(calibration.context_bytes, config, device_kind, weights),
        allocator_bytes=allocator_overhead_bytes(calibration, activations + logits + gradients),
    )


def allocator_overhead_bytes(calibration: Calibration, transient_bytes: int) -> int:
    """What the CUDA caching allocator reserves beyond the live tensors at the peak (0 on the CPU).

    The cuBLAS/cuBLASLt workspaces, plus a share of the memory allocated and freed every step
    (``transient_bytes``: activations, logits, gradients) left reserved by rounding and
    fragmentation (:data:`ALLOCATOR_FRAGMENTATION_SHARE`).
    """
    return calibration.workspace_bytes + int(calibration.allocator_share * transient_bytes)


def model_state_bytes(model: ModelSpec, config: TrialConfig) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) in bytes: the model states of docs/facts.md.

    HF Trainer trains fp32 parameters under fp16/bf16 (autocast, mixed precision), so weights and
    gradients are 4 bytes per parameter in every dtype. Autocast casts each matmul weight to 16 bits
    once per forward and autograd keeps that copy for the backward: 2 more bytes per compute
    parameter (lookup-only embeddings are not cast).
    """
    n = model.num_params
    weights = 4 * n
    if config.dtype in _HALF_DTYPES:
        weights += 2 * model.num_non_embedding_params
    return weights, 4 * n, optimizer_state_bytes(model, config.optim)


def optimizer_state_bytes(model: ModelSpec, optim: str) -> int:
    """Bytes of optimizer state for the whole model.

    8-bit optimizers keep 32-bit states for embeddings (HF Trainer registers ``nn.Embedding`` as
    32-bit with bitsandbytes, docs/facts.md). Adafactor (``beta1=None`` in HF) keeps, per matrix, one row
    and one column vector instead of a full second moment, and a full one for vectors.
    """
    n = model.num_params
    if optim == "adafactor":
        return 4 * adafactor_state_elements(model)
    if optim in _BNB_OPTIMIZERS:
        embedding = _embedding_table_params(model)
        return int(_STATE_BYTES_PER_PARAM[optim] * (n - embedding) + 8 * embedding)
    return int(_STATE_BYTES_PER_PARAM.get(optim, 8.0) * n)


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


def activation_element_bytes(dtype: str) -> tuple[int, int]:
    """(matmul-input bytes, residual-stream bytes) per saved element.

    Under autocast the matmul inputs autograd keeps are 16-bit copies, while the residual stream,
    layer-norm inputs and softmax outputs stay fp32 (autocast runs those ops in fp32).
    """
    return (2, 4) if dtype in _HALF_DTYPES else (4, 4)


def layer_activation_bytes(
    model: ModelSpec, config: TrialConfig, seq_len: int, device_kind: str, shape: MicroBatchShape | None = None
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
    shape = shape or MicroBatchShape(rows=config.micro_batch, row_tokens=seq_len)
    p, r = activation_element_bytes(config.dtype)
    q = r if device_kind == "cpu" else p
    score_mask = q if device_kind == "cpu" else 1
    s, b = shape.row_tokens, shape.rows
    h, f, a = model.hidden_size, model.intermediate_size, model.num_heads
    kv_fraction = model.num_kv_heads / model.num_heads  # grouped-query attention keeps smaller K, V
    per_token = p * h + (1 + 2 * kv_fraction) * q * h + p * h + h + p * h + 2 * p * f + h + 2 * r * h
    scores = (r + score_mask + q) * a * s * s * b if materializes_attention_scores(model, config, device_kind) else 0
    return int(per_token * s * b + scores)


def materializes_attention_scores(model: ModelSpec, config: TrialConfig, device_kind: str) -> bool:
    """Whether the ``a x s x s`` attention scores are kept for the backward pass."""
    if config.attn_implementation == "eager":
        return True
    if config.attn_implementation in _FUSED_ATTENTIONS:
        return False  # tiled kernels: the scores live in on-chip memory, a block at a time
    # SDPA (the transformers default where supported): fused kernels on CUDA; on the CPU the fused
    # kernel has no dropout, so training with attention dropout runs the math kernel.
    return device_kind == "cpu" and attention_dropout(model) > 0


def attention_dropout(model: ModelSpec) -> float:
    for key in _ATTENTION_DROPOUT_KEYS:
        value = model.config.get(key)
        if isinstance(value, (int, float)):
            return float(value)
    return 0.0


def activation_bytes(
    model: ModelSpec, config: TrialConfig, seq_len: int, device_kind: str, shape: MicroBatchShape | None = None
) -> int:
    """Activations of the whole model at the peak (start of the backward pass), before calibration.

    Without checkpointing: every layer's saved tensors, plus one layer's worth of gradient tensors
    alive while its backward runs. With full checkpointing (one checkpoint per layer, as HF's
    ``activation_checkpointing`` does): each layer's input ``r sbh``, plus one layer recomputed and
    its gradients. Embeddings: int64 ids (and position ids), summed embeddings, layer norm input and
    dropout mask. A flattened batch under a mask-based kernel adds its ``T x T`` boolean mask
    (:func:`packed_mask_bytes`).
    """
    shape = shape or MicroBatchShape(rows=config.micro_batch, row_tokens=seq_len)
    _, r = activation_element_bytes(config.dtype)
    tokens, h = shape.tokens, model.hidden_size
    layer = layer_activation_bytes(model, config, seq_len, device_kind, shape)
    embeddings = (2 * 8 + (2 * r + 1) * h) * tokens + packed_mask_bytes(config, shape)
    if config.checkpointing:
        return int(model.num_layers * r * tokens * h + CHECKPOINT_WORKING_LAYERS[device_kind] * layer + embeddings)
    return (model.num_layers + 1) * layer + embeddings


def packed_mask_bytes(config: TrialConfig, shape: MicroBatchShape) -> int:
    """The block-diagonal mask of a flattened batch: ``T x T`` booleans, kept for the backward.

    transformers/masking_utils.py builds it from the position ids for every mask-based attention
    (eager, sdpa, flex's block mask is smaller: counted the same, a bound); flash kernels read the
    sequence boundaries instead and need none.
    """
    if config.padding != "padding_free" or config.attn_implementation in FLASH_ATTENTIONS:
        return 0
    return shape.row_tokens * shape.row_tokens


def logits_bytes(model: ModelSpec, config: TrialConfig, seq_len: int, shape: MicroBatchShape | None = None) -> int:
    """The language-model head's logits and the loss's tensors at their peak: ``12 b s V`` bytes.

    transformers' loss upcasts the logits to fp32, cross-entropy keeps its fp32 log-softmax for the
    backward, and the backward makes an fp32 gradient of the same size: three fp32 ``b x s x V``
    tensors at once (measured on the CPU: 3.0 x 4 bytes per logit, in fp32 and bf16 alike; the
    16-bit logits of mixed precision are freed before the backward). Classification heads produce
    ``b x labels``: nothing to count. Not scaled by calibration: the count is exact.

    Liger's fused linear cross-entropy (``liger``) never makes the ``b s V`` logits:
    liger_kernel/ops/fused_linear_cross_entropy.py computes them in chunks of
    ``next_power_of_2(bs / ceil(V / h))`` rows, about ``b s h`` logits (up to twice that after the
    rounding), and computes the gradients in the forward: the input's (``b s h``) and the head
    weight's (``V h``), fp32. Counted: ``4 (2 b s h + b s h + V h)`` bytes.
    """
    if model.task not in ("causal-lm", "masked-lm"):
        return 0
    tokens = (shape or MicroBatchShape(rows=config.micro_batch, row_tokens=seq_len)).tokens
    if config.liger:
        return 4 * (3 * tokens * model.hidden_size + model.vocab_size * model.hidden_size)
    return 3 * 4 * tokens * model.vocab_size


@dataclasses.dataclass(frozen=True)
class MicroBatchShape:
    """The tensor shape of one micro-batch: ``rows`` sequences of ``row_tokens`` positions."""

    rows: int
    row_tokens: int

    @property
    def tokens(self) -> int:
        return self.rows * self.row_tokens


def micro_batch_shape(config: TrialConfig, seq_len: int, lengths: Sequence[int] | None = None) -> MicroBatchShape:
    """The fullest micro-batch a trial can meet, which sets its peak memory.

    * ``max_length``, or no lengths known: ``b`` rows of ``seq_len``.
    * ``longest``: ``b`` rows of the longest sample (truncated to ``seq_len``): some batch holds it,
      and transformers' ``LengthGroupedSampler`` (trainer_pt_utils.py) even puts it first. So
      ``sampling: group_by_length`` changes the tokens of a typical step (speed), not the peak.
    * ``padding_free``: one row of the ``b`` longest samples' tokens (at most ``b x seq_len``).
    """
    b = config.micro_batch
    if lengths is None or config.padding == "max_length" or not len(lengths):
        return MicroBatchShape(rows=b, row_tokens=seq_len)
    capped = sorted((min(int(n), seq_len) for n in lengths), reverse=True)
    if config.padding == "longest":
        return MicroBatchShape(rows=b, row_tokens=capped[0])
    return MicroBatchShape(rows=1, row_tokens=sum(capped[:b]))


def context_bytes(per_process_bytes: int, config: TrialConfig, device_kind: str, weights_bytes: int) -> int:
    """What the process (tree) holds besides tensors of this configuration.

    On the CPU each dataloader worker is a fork of the trial process: its resident set counts the
    interpreter and the fp32 weights again (the probe sums resident sets over the tree).
    """
    if device_kind != "cpu" or config.dataloader_workers == 0:
        return per_process_bytes
    return per_process_bytes * (1 + config.dataloader_workers) + config.dataloader_workers * weights_bytes


@dataclasses.dataclass(frozen=True)
class MeasuredPeak:
    """One measured trial, as calibration sees it."""

    config: TrialConfig
    peak_bytes: int


def fit_calibration(
    model: ModelSpec,
    seq_len: int,
    device_kind: str,
    measured: Sequence[MeasuredPeak],
    prior: Calibration | None = None,
) -> Calibration:
    """Fit ``measured = context * processes + fixed + scale * activations`` by least squares.

    ``processes`` is 1 + dataloader workers on the CPU (1 on CUDA); ``fixed`` the model states, the
    logits and the weights each CPU worker maps; ``activations`` the uncalibrated activations. With
    fewer than :data:`MIN_POINTS_FOR_SCALE` points, or too little spread in the activations to tell
    a scale from an offset, the scale keeps its prior and only the context is fitted.
    """
    prior = prior or Calibration.prior(device_kind)
    if not measured:
        return prior
    rows = []  # (processes, uncalibrated activation bytes, measured - fixed bytes)
    for point in measured:
        uncalibrated = estimate_peak(model, point.config, seq_len, device_kind, dataclasses.replace(
            prior, context_bytes=0, activation_scale=1.0))
        processes = 1 + (point.config.dataloader_workers if device_kind == "cpu" else 0)
        # Model states, logits, the weights each CPU worker maps and the CUDA allocator's overhead
        # (at the prior's share) are not fitted.
        fixed = (
            uncalibrated.model_state_bytes + uncalibrated.logits_bytes + uncalibrated.context_bytes
            + uncalibrated.allocator_bytes
        )
        rows.append((processes, uncalibrated.activations_bytes, point.peak_bytes - fixed))
    activations = [a for _, a, _ in rows]
    spread = (max(activations) - min(activations)) / max(max(activations), 1)
    predicted = [estimate_peak(model, point.config, seq_len, device_kind, prior).total_bytes for point in measured]
    share = max(activations) / max(max(predicted), 1)
    if (
        len(rows) >= MIN_POINTS_FOR_SCALE
        and spread >= MIN_RELATIVE_SPREAD_FOR_SCALE
        and share >= MIN_ACTIVATION_SHARE_FOR_SCALE
    ):
        context, scale = _least_squares_two(rows)
        if not SCALE_BOUNDS[0] <= scale <= SCALE_BOUNDS[1] or context < 0:
            scale = min(max(scale, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])
            context = _context_given_scale(rows, scale)
    else:
        scale = prior.activation_scale
        context = _context_given_scale(rows, scale)
    fitted = dataclasses.replace(prior, context_bytes=int(max(context, 0)), activation_scale=scale, points=len(rows))
    errors = [
        abs(estimate_peak(model, p.config, seq_len, device_kind, fitted).total_bytes - p.peak_bytes) / p.peak_bytes
        for p in measured
        if p.peak_bytes > 0
    ]
    return dataclasses.replace(fitted, max_relative_error=max(errors) if errors else None)


def _least_squares_two(rows: list[tuple[int, int, int]]) -> tuple[float, float]:
    """Solve ``y = c * processes + s * activations`` in the least-squares sense (2 x 2 normal equations)."""
    spp = sum(p * p for p, _, _ in rows)
    spb = sum(p * b for p, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    spy = sum(p * y for p, _, y in rows)
    sby = sum(b * y for _, b, y in rows)
    determinant = spp * sbb - spb * spb
    if determinant == 0:
        return _context_given_scale(rows, 1.0), 1.0
    context = (spy * sbb - sby * spb) / determinant
    scale = (spp * sby - spb * spy) / determinant
    return context, scale


def _context_given_scale(rows: list[tuple[int, int, int]], scale: float) -> float:
    """Least-squares context once the scale is fixed: ``sum p (y - s b) / sum p^2``."""
    return sum(p * (y - scale * b) for p, b, y in rows) / sum(p * p for p, _, _ in rows)


# Knobs that change the estimate (the others: accumulation, pinning, compilation, do not;
# sampling changes typical steps, not the fullest one; empty_cache_steps returns cached blocks to
# the device between steps, not tensors alive at the peak, which is what this model counts).
_MEMORY_KNOBS = (
    "dtype", "optim", "checkpointing", "attn_implementation", "liger", "padding", "dataloader_workers", "micro_batch",
)


def memory_distinct_configs(choices: dict[str, list[Any]], device_kind: str) -> list[TrialConfig]:
    """One config per combination of the knobs the estimate depends on; other knobs at their first choice.

    Dataloader workers count on the CPU only (their resident sets add up there). Micro-batch varies
    fastest, so the rows of one setting read as a growing batch.
    """
    knobs = [k for k in _MEMORY_KNOBS if k in choices and (k != "dataloader_workers" or device_kind == "cpu")]
    base = {name: values[0] for name, values in choices.items()}
    configs = []
    for combination in itertools.product(*(choices[k] for k in knobs)):
        configs.append(TrialConfig.from_params({**base, **dict(zip(knobs, combination))}))
    return configs


def smallest_peak_bytes(model: ModelSpec, choices: dict[str, list[Any]], seq_len: int, device_kind: str) -> int:
    """The prior estimate of the space's least memory-hungry config: what any trial needs at least."""
    configs = memory_distinct_configs(choices, device_kind)
    return min(estimate_peak(model, config, seq_len, device_kind).total_bytes for config in configs)


@dataclasses.dataclass(frozen=True)
class EstimateRow:
    """One config's prediction against the ceiling (``autotune estimate``)."""

    config: TrialConfig
    estimate: MemoryEstimate
    fits: bool


def estimate_rows(
    model: ModelSpec,
    configs: Sequence[TrialConfig],
    seq_len: int,
    device_kind: str,
    calibration: Calibration,
    ceiling_bytes: int,
) -> list[EstimateRow]:
    """Predict every config's peak and judge it against the ceiling (:func:`autotune.ceiling.fits`)."""
    from autotune.ceiling import fits

    rows = []
    for config in configs:
        estimate = estimate_peak(model, config, seq_len, device_kind, calibration)
        rows.append(EstimateRow(config, estimate, fits(estimate.total_bytes, ceiling_bytes)))
    return rows


def largest_fitting(rows: Sequence[EstimateRow]) -> list[tuple[EstimateRow, bool]]:
    """For each setting of the other memory knobs (dtype x checkpointing x optimizer, ...), the row of
    the largest micro-batch predicted to fit; where none fits, the smallest, marked ``False``.

    Returns:
        (row, whether any micro-batch of that setting fits), in the order the settings first appear.
    """
    groups: dict[TrialConfig, list[EstimateRow]] = {}
    for row in rows:
        groups.setdefault(dataclasses.replace(row.config, micro_batch=1), []).append(row)
    chosen = []
    for members in groups.values():
        fitting = [row for row in members if row.fits]
        if fitting:
            chosen.append((max(fitting, key=lambda row: row.config.micro_batch), True))
        else:
            chosen.append((min(members, key=lambda row: row.config.micro_batch), False))
    return chosen


def estimate_json(rows: Sequence[EstimateRow], header: dict[str, Any]) -> str:
    """Every row as JSON for scripts: the config's knobs, each part in bytes, the total, whether it fits."""
    import json

    document = {
        **header,
        "rows": [
            {
                "config": row.config.to_params(),
                "parts_bytes": row.estimate.parts(),
                "total_bytes": row.estimate.total_bytes,
                "fits": row.fits,
            }
            for row in rows
        ],
    }
    return json.dumps(document, indent=2)


def expandable_segments_enabled(environ: dict[str, str]) -> bool:
    """Whether the allocator settings in ``environ`` turn expandable segments on (PYTORCH_ALLOC_CONF
    wins over PYTORCH_CUDA_ALLOC_CONF, torch/include/c10/core/AllocatorConfig.h)."""
    conf = environ.get("PYTORCH_ALLOC_CONF") or environ.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    return "expandable_segments:true" in conf.replace(" ", "").lower()
