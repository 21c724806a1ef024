"""FLOPs per training sample: model FLOPs (useful work) and hardware FLOPs (work actually done).

Model FLOPs rank configurations; hardware FLOPs add the forward pass that activation
checkpointing recomputes, so recomputation can never make a configuration look better.
"""

from __future__ import annotations

from autotune.models import ModelSpec


def model_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """Useful training FLOPs per token: forward + backward, no recomputation.

    PaLM (Chowdhery et al. 2022), appendix B: ``6N + 12 * L * H * Q * T`` per token, where N is the
    number of non-embedding parameters, L layers, H heads, Q head dim (H * Q = hidden size) and T
    the sequence length. ``6N`` is 2 FLOPs per multiply-add for the forward and twice that for the
    backward; the second term is the attention score and value matmuls (QK^T and AV, 2 * 2 * T * h
    per layer and token forward, times 3 for forward + backward). Like PaLM and Megatron, causal
    masking is not halved, so decoder figures compare with published MFU numbers. Encoders attend
    to the full sequence anyway.

    N here includes a language-model head tied to the token embedding (``6 * h * V`` per token):
    that matrix multiplies every token even though its weight is shared with a lookup table.
    """
    num_compute_params = spec.num_non_embedding_params
    attention = 12 * spec.num_layers * spec.hidden_size * seq_len
    return 6 * num_compute_params + attention


def recompute_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """FLOPs that full activation checkpointing adds per token: one more forward of every block.

    Forward cost is a third of training cost (2N of 6N; 4 * L * h * T of the attention term), per
    the ML Engineering book's 8N-vs-6N rule. Only the blocks are recomputed, not the embedding or head.
    """
    return 2 * spec.num_block_params + 4 * spec.num_layers * spec.hidden_size * seq_len


def model_flops_per_sample(spec: ModelSpec, seq_len: int) -> float:
    """Useful training FLOPs for one sequence of ``seq_len`` tokens."""
    return model_flops_per_token(spec, seq_len) * seq_len


def hardware_flops_per_sample(spec: ModelSpec, seq_len: int, checkpointing: bool) -> float:
    """FLOPs the device executes for one sequence, counting recomputation under checkpointing."""
    flops = model_flops_per_token(spec, seq_len)
    if checkpointing:
        flops += recompute_flops_per_token(spec, seq_len)
    return flops * seq_len


