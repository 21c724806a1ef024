"""Models whose config is not one flat text model's: a multimodal config (Gemma 3: the language model under
``text_config``, a vision tower beside it, all built by ``AutoModelForCausalLM``) and a heterogeneous one (Gemma 4:
per-layer head sizes and key/value heads). Sized by their language model, counted as the trainer builds them, and
their FLOPs checked against torch's own count over a real forward and backward (tests/support/multimodal.py)."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autotune.estimate._parts import model_state_bytes
from autotune.levers import TrialConfig, memory_traits
from autotune.spec.flops import attention_width, model_flops_per_token
from autotune.spec.models import build_model, resolve_model
from tests.support.multimodal import write_tiny_gemma3, write_tiny_gemma4_text, write_tiny_mistral3

TOKENS = 64


def _counted_flops(spec, model) -> float:
    ids = torch.randint(0, spec.vocab_size, (1, TOKENS))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize(
    ("write", "model_type", "built"),
    [
        (write_tiny_gemma3, "gemma3", "Gemma3ForConditionalGeneration"),  # AutoModelForCausalLM builds it whole
        (write_tiny_mistral3, "mistral3", "Mistral3ForConditionalGeneration"),  # AutoModelForImageTextToText only
    ],
)
def test_a_multimodal_model_is_sized_by_its_language_model_and_its_vision_tower_is_weights_only(
    tmp_path, write, model_type, built
):
    spec = resolve_model(str(write(tmp_path / model_type)))
    assert (spec.model_type, spec.text_config_key, spec.family, spec.task) == (
        model_type,
        "text_config",
        "decoder",
        "causal-lm",
    )
    assert (spec.hidden_size, spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.vocab_size) == (64, 2, 4, 2, 512)
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task, attn_implementation="eager")
    assert type(model).__name__ == built  # what the trainer builds: the tower included
    towers = [model.model.vision_tower, model.model.multi_modal_projector]
    tower_params = sum(p.numel() for tower in towers for p in tower.parameters())
    assert spec.num_params == sum(p.numel() for p in model.parameters())
    assert spec.other_modality_params == tower_params > 0
    # A text batch never runs the tower: torch's count over a real step agrees with the language model's alone.
    measured = _counted_flops(spec, model)
    assert TOKENS * model_flops_per_token(spec, TOKENS) == pytest.approx(measured, rel=0.01)
    # The tower gets no gradient, so no optimizer state (torch's AdamW keeps none without one); ZeRO is handed all.
    assert {name for name, p in model.named_parameters() if p.grad is None} == {
        name for name, _ in model.named_parameters() if name.startswith(("model.vision_tower", "model.multi_modal"))
    }
    assert spec.trainable_params == spec.num_params - tower_params and spec.optimized_params == spec.num_params
    weights, gradients, _ = model_state_bytes(spec, memory_traits(TrialConfig(micro_batch=1), "cpu"))
    assert (weights, gradients) == (4 * spec.num_params, 4 * (spec.num_params - tower_params))


def test_a_heterogeneous_config_is_read_at_its_layers_mean(tmp_path):
    spec = resolve_model(str(write_tiny_gemma4_text(tmp_path / "gemma4")))
    assert spec.hf_config["per_layer_config"]  # transformers keeps the full-attention layer's own sizes there
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task, attn_implementation="eager")
    layers = model.model.layers
    # Five layers of 4 x 16 query width and one of 4 x 32; two key/value heads and one.
    assert attention_width(spec) == int(sum(layer.self_attn.q_proj.out_features for layer in layers) / len(layers))
    kv_heads = [
        layer.self_attn.k_proj.out_features * spec.num_heads // layer.self_attn.q_proj.out_features for layer in layers
    ]
    assert kv_heads == [2, 2, 2, 2, 2, 1]
    assert spec.num_kv_heads == round(sum(kv_heads) / len(layers))
    assert TOKENS * model_flops_per_token(spec, TOKENS) == pytest.approx(_counted_flops(spec, model), rel=0.01)


@pytest.mark.parametrize(
    "write", [write_tiny_gemma3, write_tiny_mistral3, write_tiny_gemma4_text], ids=["gemma3", "mistral3", "gemma4_text"]
)
def test_the_packing_probe_runs_on_a_multimodal_or_per_layer_model(tmp_path, write):
    """The probe that lets packing and padding-free be searched (``flattened_rows_leak``: a small copy of the
    model, a flattened row against each sample alone) builds these shapes too; it answered "could not check"
    before (a multimodal config has no top-level hidden_size; a per-layer attribute raises)."""
    from autotune.levers._samples_apart import flattened_rows_leak

    spec = resolve_model(str(write(tmp_path / "model")))
    for trainer in ("trainer", "sft"):
        assert flattened_rows_leak(spec, "sdpa", trainer) == ""
