"""The language-model head's tensors at their peak: the logits and the loss's fp32 copies, or TRL's fused and
chunked head, or a fused loss's own (``traits.logits``). One part of a trial's peak (``_parts.estimate_peak``)."""

from __future__ import annotations

from autotune.levers import MemoryTraits, MicroBatchShape
from autotune.spec.models import ModelSpec


def logits_bytes(
    model: ModelSpec,
    traits: MemoryTraits,
    seq_len: int,
    shape: MicroBatchShape | None = None,
    device_kind: str = "cuda",
) -> int:
    """The language-model head's logits and the loss's tensors at their peak: ``12 b s V`` bytes.

    transformers' loss upcasts the logits to fp32, cross-entropy keeps its fp32 log-softmax for the
    backward, and the backward makes an fp32 gradient of the same size: three fp32 ``b x s x V``
    tensors at once (measured on the CPU: 3.0 x 4 bytes per logit, in fp32 and bf16 alike; the
    16-bit logits of mixed precision are freed before the backward). Classification heads produce
    ``b x labels``: nothing to count. Not scaled by the fit: the count is exact.

    Under TRL's SFTTrainer every model's head is fused and chunked (``ModelSpec.fused_lm_head``):
    :func:`fused_lm_head_bytes`, whatever the levers say (TRL applies Liger's layer kernels only). A
    fused loss that never makes the ``b s V`` logits otherwise counts its own tensors
    (``traits.logits``: Liger's fused linear cross-entropy, ``autotune.levers.kernels``).
    """
    if model.task not in ("causal-lm", "masked-lm"):
        return 0
    tokens = (shape or MicroBatchShape(rows=traits.rows, row_tokens=seq_len)).tokens
    if model.fused_lm_head:
        return fused_lm_head_bytes(model, tokens, device_kind)
    if traits.logits is not None:
        return traits.logits(model, tokens)
    return 3 * 4 * tokens * model.vocab_size


# TRL's chunked log-probabilities (trl/kernels/chunked_logprob.py): tiles of at most this many tokens
# (TOKEN_CHUNK_SIZE) by this many vocabulary columns (trl/trainer/utils.py:1506).
FUSED_HEAD_TILE_TOKENS = 4096
FUSED_HEAD_TILE_COLUMNS = 32768
# fp32 tile-sized tensors alive at once: on CUDA the Triton kernels read the tile's matmul output and
# write its gradient in place. Off CUDA the torch fallback's backward (``_backward_tile``,
# chunked_logprob.py:261-293) holds, at ``grad += g * (is_target.float() - p)``, the scaled tile ``y``, ``z``,
# ``log_p``, ``p``, ``grad`` and that line's three temporaries, beside the tile itself: 8 counted here
# (it was 4, the forward's count). Measured on the CPU (2026-11-29, llama-tiny, bf16 autocast, LoRA, seq
# 256, micro-batch 8: the prior 1.0 GiB low under SFTTrainer, 1.9 GiB under DPOTrainer's two rows a pair,
# 4.1 and 3.9 tiles), within 1.2 % with 8; the head alone, forward and backward, held 8.8 tiles
# (tests/estimate/test_fused_head_memory.py).
FUSED_HEAD_TILE_COPIES = {"cuda": 2, "cpu": 8}


def fused_lm_head_bytes(model: ModelSpec, tokens: int, device_kind: str) -> int:
    """TRL's fused language-model head at its peak: one tile of ``min(tokens, 4096)`` tokens by
    ``min(V, 32768)`` columns, in fp32, :data:`FUSED_HEAD_TILE_COPIES` times, and the per-token fp32
    outputs it keeps for the backward (log-probability, entropy, running max and sums: 8 floats a token)."""
    tile = min(tokens, FUSED_HEAD_TILE_TOKENS) * min(model.vocab_size, FUSED_HEAD_TILE_COLUMNS)
    return 4 * (FUSED_HEAD_TILE_COPIES.get(device_kind, 2) * tile + 8 * tokens)
