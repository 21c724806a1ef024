"""FLOPs per training sample: model FLOPs (useful work) and hardware FLOPs (work actually done).

Model FLOPs rank configurations; hardware FLOPs add the forward pass that activation
checkpointing recomputes, so recomputation can never make a configuration look better.
The vocabulary follows Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models", section 6: model FLOPs utilisation (MFU) counts only the work the model
needs; hardware FLOPs utilisation (HFU) counts the recomputation too.

One formula serves both families, because both run the same blocks over every token:

* encoder (BERT, RoBERTa): bidirectional attention over the full sequence; a masked-LM head
  multiplies every token by the (tied) ``h x V`` output matrix;
* decoder (GPT-2, Llama): causal attention, counted unhalved (see below); the LM head, tied or
  not, multiplies every token by ``h x V``.

Heads that only see one token per sequence (BERT's pooler and classifier) are counted per token
like every other non-embedding parameter, as PaLM and Hugging Face count them: that overstates
bert-base's FLOPs by under 1 % and does not change any ranking (the factor is the same for
every configuration of one model and sequence length).
"""

from __future__ import annotations

from autotune.spec.config_reading import layer_mean
from autotune.spec.models import ModelSpec


def attention_width(spec: ModelSpec) -> int:
    """Query heads times head dimension: the width of the QK^T and AV matmuls.

    Equal to the hidden size for BERT, GPT-2 and Llama; some configs (Gemma) set ``head_dim``
    explicitly. Grouped-query attention shares K and V between heads, but every query head still
    multiplies its own scores, so the query head count is the one that matters.

    Multi-head latent attention (DeepSeek-V2/V3: transformers' ``modeling_deepseek_v3.py``) scores with
    ``qk_head_dim = qk_nope_head_dim + qk_rope_head_dim`` and weighs values of ``v_head_dim``, where the
    config's ``head_dim`` is the rotary part's alone: the width is their mean, so that ``QK^T`` and ``AV``
    together count as they run (torch's FlopCounterMode agrees within 1 %: tests/spec/test_experts.py).
    """
    config = spec.text_config
    value_dim = config.get("v_head_dim")
    query_dim = config.get("qk_head_dim") or (config.get("qk_nope_head_dim") or 0) + (
        config.get("qk_rope_head_dim") or 0
    )
    if value_dim and query_dim:
        return spec.num_heads * (int(query_dim) + int(value_dim)) // 2
    head_dim = layer_mean(config, "head_dim") or spec.head_dim  # Gemma 4's: 512 in one layer of six, else 256
    return int(spec.num_heads * head_dim)


def attention_flops_per_token(spec: ModelSpec, seq_len: float) -> float:
    """Training FLOPs per token of the attention score and value matmuls (QK^T and AV).

    PaLM (Chowdhery et al. 2022), appendix B: ``12 * L * H * Q * T``. Per layer and token the
    forward does ``T * H * Q`` multiply-adds for QK^T and as many for AV, ``4 * T * H * Q`` FLOPs;
    the backward costs twice the forward. Causal masking is not halved, as in PaLM and Megatron,
    so decoder figures compare with published MFU numbers.
    """
    return 12 * spec.num_layers * attention_width(spec) * seq_len


def model_flops_per_token(spec: ModelSpec, seq_len: float) -> float:
    """Useful training FLOPs per token: forward + backward, no recomputation.

    PaLM (Chowdhery et al. 2022), appendix B: ``6N + 12 * L * H * Q * T`` per token, where N is the
    number of non-embedding parameters, L layers, H heads, Q head dim and T the sequence length.
    ``6N`` is 2 FLOPs per multiply-add for the forward and twice that for the backward (Kaplan et
    al. 2020, section 2.1).

    N here includes a language-model head tied to the token embedding (``6 * h * V`` per token):
    that matrix multiplies every token even though its weight is shared with a lookup table.
    Hugging Face's ``Trainer.floating_point_ops`` (``6 * tokens * num_parameters(exclude_embeddings=
    True)``) leaves out exactly two terms: the attention term and the tied head.
    """
    return weight_flops_per_token(spec) + attention_flops_per_token(spec, seq_len)


def weight_flops_per_token(spec: ModelSpec) -> int:
    """Training FLOPs per token of the weight matmuls: ``6N``, or under PEFT ``4N + 6 N_adapter``.

    A frozen weight still costs its forward (``2N``) and the backward's input gradient (``2N``: the
    gradient must flow through it to the adapters below), but no weight gradient (the other
    ``2N``); the adapters cost the full ``6 N_adapter``. So LoRA costs about 2/3 of full fine-tuning's
    weight FLOPs (docs/facts.md, "LoRA"; the LoRA paper, Hu et al. 2021, section 4.2, measured a 25 %
    training speed-up on GPT-3 175B from it). The attention term is unchanged: its matmuls have
    no weights. With a 4-bit base (QLoRA) the same matmuls run after dequantization: same count.

    ``N`` is what one token multiplies: under routed experts (a mixture of experts) its ``k`` of ``E``
    experts, not all of them (``ModelSpec.active_non_embedding_params``; :mod:`autotune.spec.experts`).
    Adapters on the experts' 3-D weights (peft's ``ParamWrapper``) fold into the weight once a forward
    (``W + B A``) and the tokens multiply the folded weight: its gradient is computed, ``2`` more per active
    expert weight a token, and the adapters' own ``6 N_adapter`` is not a token's (its fold is a micro-batch's:
    ``estimate._experts.expert_adapter_fold_flops``).
    """
    if spec.peft is None:
        return 6 * spec.active_non_embedding_params
    adapted_experts = spec.experts.active_params if spec.experts and spec.experts_get_weight_gradients else 0
    token_adapters = spec.peft.adapter_params - spec.peft.expert_adapter_params
    return 4 * spec.active_non_embedding_params + 2 * adapted_experts + 6 * token_adapters


def recompute_flops_per_token(spec: ModelSpec, seq_len: float) -> float:
    """FLOPs that full activation checkpointing adds per token: one more forward of every block.

    Forward cost is a third of training cost (2N of 6N; ``4 * L * H * Q * T`` of the attention
    term): Narayanan et al. 2021, eq. 3 (96 instead of 72 with full recomputation), and the ML
    Engineering book's 8N-vs-6N rule. Hugging Face checkpoints each transformer block, so the
    blocks are recomputed and the embedding and head are not.
    """
    adapters = spec.peft.adapter_params if spec.peft is not None else 0  # recomputed with their blocks
    return 2 * (spec.active_block_params + adapters) + 4 * spec.num_layers * attention_width(spec) * seq_len


def model_flops_per_sample(spec: ModelSpec, seq_len: int) -> float:
    """Useful training FLOPs for one sequence of ``seq_len`` tokens (the ranking metric's numerator)."""
    return model_flops_per_token(spec, seq_len) * seq_len


def hardware_flops_per_sample(spec: ModelSpec, seq_len: float, checkpointing: bool) -> float:
    """FLOPs the device executes for one sequence, counting recomputation under checkpointing."""
    flops = model_flops_per_token(spec, seq_len)
    if checkpointing:
        flops += recompute_flops_per_token(spec, seq_len)
    return flops * seq_len


def utilisation(achieved_tflops: float, peak_tflops: float | None) -> float | None:
    """Achieved over peak TFLOPs (MFU for model TFLOPs, HFU for hardware TFLOPs).

    ``None`` where the peak is unknown: an unknown device gets no utilisation, never an invented one.
    """
    if not peak_tflops or peak_tflops <= 0:
        return None
    return achieved_tflops / peak_tflops


def model_tflops(
    spec: ModelSpec,
    seq_len: int,
    samples_per_s: float,
    real_tokens_per_s: float | None = None,
    context: float | None = None,
) -> float:
    """Useful TFLOPs per second: the ranking's figure.

    With synthetic tokens every token is real: ``samples/s x model_flops_per_sample``. With the
    user's data (``real_tokens_per_s`` given) padding is not useful work: only the real tokens
    count, every one forward and backward (a loss on the completion or the assistant's tokens only
    changes the labels, not this work). The attention term counts each sample over its own length:
    ``12 L H Q sum s_i^2`` for samples of ``s_i`` tokens, whether padded to their batch's longest or
    flattened and packed beside others, which is ``real tokens x context`` with ``context`` the
    token-weighted mean sample length ``sum s_i^2 / sum s_i`` the trial read from its batches
    (``autotune.runner``); without it, ``seq_len`` (an upper bound).
    """
    if real_tokens_per_s is None:
        return samples_per_s * model_flops_per_sample(spec, seq_len) / 1e12
    return real_tokens_per_s * model_flops_per_token(spec, context or seq_len) / 1e12


def hardware_tflops(
    spec: ModelSpec,
    seq_len: int,
    samples_per_s: float,
    checkpointing: bool,
    real_tokens_per_s: float | None = None,
    context: float | None = None,
) -> float:
    """TFLOPs per second the device executed, recomputation included; with the user's data, on
    real tokens over their own lengths as :func:`model_tflops` counts them (the work spent on
    padding is not counted: a lower bound)."""
    if real_tokens_per_s is None:
        return samples_per_s * hardware_flops_per_sample(spec, seq_len, checkpointing) / 1e12
    attended = context or seq_len
    return real_tokens_per_s * hardware_flops_per_sample(spec, attended, checkpointing) / attended / 1e12
