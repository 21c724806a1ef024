"""The parts of one configuration's predicted peak memory (the estimator's arithmetic).

Each part is a function a user can check by hand; ``estimate_peak`` adds them up, with the corrections
of a :class:`~autotune.estimate._prior.MemoryFit` (the prior, or fitted on measured trials). The parts
read a configuration through its :class:`~autotune.levers.MemoryTraits` (each lever's own words for
what its value does to memory), never a lever by name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.estimate._activations import activation_bytes, micro_batch_shape, offloaded_activation_bytes
from autotune.estimate._fsdp import fsdp_state_bytes
from autotune.estimate._logits import logits_bytes
from autotune.estimate._prior import MemoryFit
from autotune.estimate._zero import DEEPSPEED_CPU_PROCESS_BYTES, zero_state_bytes
from autotune.levers import (
    BNB_OPTIMIZERS,
    STATE_BYTES_PER_PARAM,
    STATES_IN_PARAM_DTYPE,
    MemoryTraits,
    TrialConfig,
    memory_traits,
)
from autotune.spec.ceiling import fits
from autotune.spec.models import ModelSpec

# A 4-bit (NF4) weight: half a byte, plus one fp32 absmax per block of 64 (bitsandbytes'
# ``quantize_4bit`` default blocksize; double quantization would shrink that to ~1/64 byte: a bound).
QUANTIZED_4BIT_BYTES = 0.5 + 4 / 64


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
    # What offload keeps in host memory, per rank: ZeRO offload's partitions and TRL's offloaded activations
    # (not a part of the device's peak, except on the CPU, where the host is the device's memory and the
    # parts already hold it). A trial's ranks share one host: :meth:`trial_host_bytes`.
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

    def trial_host_bytes(self, ranks: int) -> int:
        """The host memory a trial's offload needs: each of its ranks keeps ``host_bytes`` in one host's RAM."""
        return self.host_bytes * ranks

    def host_fits(self, host_ceiling_bytes: int | None, ranks: int) -> bool:
        """Whether what the trial's ranks offload fits the host RAM it may use (``None``: not checked, as for a
        GPU planned from its datasheet, whose host is not this one); the one rule, of the search and of
        ``autotune estimate``. No margin: ZeRO's part is an exact count of DeepSpeed's partitions, the
        offloaded activations' a bound."""
        return host_ceiling_bytes is None or fits(self.trial_host_bytes(ranks), host_ceiling_bytes)


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
    host += offloaded_activation_bytes(model, traits, seq_len, device_kind, shape)
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


def context_bytes(per_process_bytes: int, traits: MemoryTraits, device_kind: str, weights_bytes: int) -> int:
    """What the process (tree) holds besides tensors of this configuration.

    On the CPU each dataloader worker is a fork of the trial process: its resident set counts the
    interpreter and the fp32 weights again (the probe sums resident sets over the tree). A CPU trial
    under ZeRO also holds DeepSpeed's modules and ops (:data:`DEEPSPEED_CPU_PROCESS_BYTES`), once.
    """
    deepspeed = DEEPSPEED_CPU_PROCESS_BYTES if device_kind == "cpu" and traits.zero_stage else 0
    workers = traits.forked_workers  # set on the CPU only (the dataloader lever moves memory there)
    return per_process_bytes * (1 + workers) + workers * weights_bytes + deepspeed
