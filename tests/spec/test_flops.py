"""FLOPs per sample: hand-computed from the configs' numbers, and against Hugging Face's own count.

The expected values are written out from the config numbers here, never taken from autotune.spec.flops.
"""

from __future__ import annotations

import pytest
import torch

from autotune.spec.flops import (
    attention_flops_per_token,
    hardware_flops_per_sample,
    model_flops_per_sample,
    model_flops_per_token,
    recompute_flops_per_token,
    utilisation,
)
from autotune.spec.models import build_model, resolve_model


def bert_layer_params(h: int, f: int) -> int:
    """One BERT encoder layer: Q, K, V, O projections with biases, two LayerNorms, the FFN."""
    attention = 4 * (h * h + h)
    layer_norms = 2 * (2 * h)
    ffn = (h * f + f) + (f * h + h)
    return attention + layer_norms + ffn


def gpt2_block_params(h: int, f: int) -> int:
    """One GPT-2 block: ln_1, c_attn (h -> 3h), c_proj, ln_2, c_fc (h -> f), c_proj (f -> h)."""
    return 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * f + f) + (f * h + h)


def test_bert_base_masked_lm_model_flops_match_hand_computation():
    spec = resolve_model("bert-base-uncased", "masked-lm")
    h, layers, f, vocab, positions, seq = 768, 12, 3072, 30522, 512, 128
    blocks = layers * bert_layer_params(h, f)
    # Lookup-only tables: position (512 x 768) and token type (2 x 768). The word embedding is tied
    # to the MLM decoder, which multiplies every token, so it is compute.
    lookup_only = positions * h + 2 * h
    mlm_head = (h * h + h) + 2 * h + vocab  # transform dense, its LayerNorm, decoder bias (weight tied)
    compute_params = vocab * h + 2 * h + blocks + mlm_head  # tied word matrix, embedding LayerNorm
    assert spec.num_params == compute_params + lookup_only  # the model has exactly these parameters

    per_token = 6 * compute_params + 12 * layers * h * seq
    assert model_flops_per_token(spec, seq) == per_token
    assert model_flops_per_sample(spec, seq) == per_token * seq
    assert attention_flops_per_token(spec, seq) == 12 * 12 * 768 * 128
    # Checkpointing recomputes the blocks' forward: 2 FLOPs per block parameter + 4*L*h*T attention.
    recompute = 2 * blocks + 4 * layers * h * seq
    assert recompute_flops_per_token(spec, seq) == recompute
    assert hardware_flops_per_sample(spec, seq, checkpointing=True) == (per_token + recompute) * seq
    assert hardware_flops_per_sample(spec, seq, checkpointing=False) == per_token * seq


def test_gpt2_causal_lm_model_flops_match_hand_computation():
    spec = resolve_model("gpt2")
    h, layers, vocab, positions, seq = 768, 12, 50257, 1024, 1024
    f = 4 * h  # n_inner is null: GPT-2's FFN is 4h wide
    blocks = layers * gpt2_block_params(h, f)
    compute_params = vocab * h + blocks + 2 * h  # tied lm_head (no bias), the blocks, ln_f
    assert spec.num_params == compute_params + positions * h == 124_439_808  # GPT-2 small's known size

    per_token = 6 * compute_params + 12 * layers * h * seq
    assert model_flops_per_token(spec, seq) == per_token
    assert model_flops_per_sample(spec, seq) == per_token * seq
    recompute = 2 * blocks + 4 * layers * h * seq
    assert hardware_flops_per_sample(spec, seq, checkpointing=True) == (per_token + recompute) * seq


def _hf_floating_point_ops(model, input_ids: torch.Tensor, tmp_path) -> int:
    """Hugging Face's FLOPs count for one forward + backward over ``input_ids``.

    transformers 5 has it on the Trainer (``6 * tokens * num_parameters(exclude_embeddings=True)``);
    older versions had it on the model as well.
    """
    from transformers import Trainer, TrainingArguments

    if hasattr(model, "floating_point_ops"):
        return int(model.floating_point_ops({"input_ids": input_ids}))
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    return int(Trainer(model=model, args=args).floating_point_ops({"input_ids": input_ids}))


@pytest.mark.parametrize(
    ("name", "task", "tied_head"),
    [
        ("bert-tiny", "masked-lm", True),
        ("gpt2-tiny", "causal-lm", True),
        ("bert-tiny", "sequence-classification", False),
    ],
)
def test_difference_from_hugging_face_is_exactly_the_terms_it_omits(name, task, tied_head, tmp_path):
    spec = resolve_model(name, task)
    config = spec.hf_config
    h = config.get("hidden_size") or config["n_embd"]
    layers = config.get("num_hidden_layers") or config["n_layer"]
    vocab = config["vocab_size"]
    batch, seq = 3, 16
    model = build_model(config, task)
    input_ids = torch.zeros(batch, seq, dtype=torch.long)

    theirs = _hf_floating_point_ops(model, input_ids, tmp_path)
    ours = model_flops_per_sample(spec, seq) * batch

    tokens = batch * seq
    attention = 12 * layers * h * seq * tokens  # QK^T and AV, forward + backward
    tied_head = 6 * vocab * h * tokens if tied_head else 0  # the output matrix HF counts as an embedding
    assert ours - theirs == attention + tied_head


def test_recomputation_never_raises_model_flops(bert_tiny):
    # Model FLOPs (the ranking metric's numerator) do not know about checkpointing at all; the
    # hardware figure is strictly larger with it.
    seq = 64
    plain = hardware_flops_per_sample(bert_tiny, seq, checkpointing=False)
    recomputed = hardware_flops_per_sample(bert_tiny, seq, checkpointing=True)
    assert plain == model_flops_per_sample(bert_tiny, seq)
    assert recomputed > plain
    # One extra forward of the blocks is a third of their training cost: at most 4/3 overall.
    assert recomputed < plain * 4 / 3 + 1


def test_utilisation_needs_a_known_peak():
    assert utilisation(100.0, 400.0) == 0.25
    assert utilisation(100.0, None) is None
    assert utilisation(100.0, 0.0) is None


def test_real_tokens_attend_over_their_own_samples_not_the_rows(gpt2_tiny):
    """With the user's data each sample's attention counts over its own length, whether padded to its
    batch's longest or packed beside others: ``12 L H Q sum s_i^2``, i.e. real tokens x the context
    ``sum s_i^2 / sum s_i`` the trial read; every real token counts ``6N`` (the loss's labels do not)."""
    from autotune.spec.flops import attention_width, hardware_tflops, model_tflops, weight_flops_per_token

    lengths = [10, 30, 60]
    tokens, squares = sum(lengths), sum(n * n for n in lengths)
    expected = (
        tokens * weight_flops_per_token(gpt2_tiny) + 12 * gpt2_tiny.num_layers * attention_width(gpt2_tiny) * squares
    )
    context = squares / tokens
    assert model_tflops(gpt2_tiny, 128, 0.0, tokens, context) * 1e12 == pytest.approx(expected)
    # Without a context the row's length is the bound, above every packing of the same samples.
    assert model_tflops(gpt2_tiny, 128, 0.0, tokens) > model_tflops(gpt2_tiny, 128, 0.0, tokens, context)
    no_ckpt = hardware_tflops(gpt2_tiny, 128, 0.0, False, tokens, context)
    assert no_ckpt == pytest.approx(model_tflops(gpt2_tiny, 128, 0.0, tokens, context))
    assert hardware_tflops(gpt2_tiny, 128, 0.0, True, tokens, context) > no_ckpt
