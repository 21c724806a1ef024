"""A mixture of experts: a token multiplies its ``k`` of ``E`` routed experts, as torch's own FLOP counter sees the
real model train, while the memory holds them all; read from each family's config (Mixtral, Qwen3-MoE, Qwen2-MoE's
shared expert, DeepSeek-V3's shared experts and dense first layer). Counting every parameter as a token's work, as
autotune did before, is 1.3-2.3x off on these models (Mixtral-8x7B 3.6x, Qwen3-30B-A3B 9x: tests/spec/test_models.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from autotune.errors import AutotuneError
from autotune.estimate._experts import expert_adapter_fold_flops, routed_expert_fp32_flops_per_token
from autotune.levers import TrialConfig, memory_traits
from autotune.spec.devices import cpu_device
from autotune.spec.flops import model_flops_per_token
from autotune.spec.models import build_model, resolve_model
from autotune.spec.peft import with_peft, wrap_with_adapters
from tests.support.moe import write_tiny_moe


@pytest.mark.parametrize(
    ("model_type", "tokens"), [("mixtral", 64), ("qwen3_moe", 64), ("qwen2_moe", 64), ("deepseek_v3", 256)]
)
def test_a_training_step_does_the_flops_of_the_experts_each_token_is_routed_to(model_type, tokens, tmp_path):
    """torch's FlopCounterMode over a real forward and backward (eager attention and experts, whose matmuls it
    counts: it has no formula for ``grouped_mm``) against ``model_flops_per_token``: within 1 %. DeepSeek-V3 at a
    longer sequence, where its latent attention's score and value widths (16 each, its ``head_dim`` 8) weigh."""
    spec = resolve_model(str(write_tiny_moe(tmp_path / model_type, model_type, layers=3)))
    assert spec.experts is not None
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task, attn_implementation="eager", experts_implementation="eager")
    ids = torch.randint(0, spec.vocab_size, (1, tokens))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    measured = counter.get_total_flops()
    counted = tokens * model_flops_per_token(spec, tokens)
    assert counted == pytest.approx(measured, rel=0.01)
    # Every parameter a token's work (the dense rule) is far off: the experts it skips are most of the model.
    every_parameter = counted + tokens * 6 * spec.experts.idle_params
    assert every_parameter > 1.25 * measured  # 1.31x (DeepSeek-V3 at 256 tokens) to 2.3x (Qwen3-MoE)


@pytest.mark.parametrize("tokens", [16, 512])
@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_lora_on_the_experts_weights_folds_once_a_micro_batch_and_the_tokens_use_the_folded_weight(
    model_type, tokens, tmp_path
):
    """peft's "all-linear" adapts the experts' 3-D weights (its ParamWrapper: ``W + s B A`` folded per forward), so
    a token costs ``4N`` plus the folded experts' weight gradient (``2`` per active expert weight), and the fold a
    micro-batch's (``expert_adapter_fold_flops``), whatever its tokens: within 3 % of torch's count at 16 tokens,
    where the fold is most of the step, and at 512, where the tokens are."""
    spec = with_peft(
        resolve_model(str(write_tiny_moe(tmp_path / model_type, model_type, layers=3))), "lora", cpu_device(), []
    )
    assert spec.peft is not None and spec.peft.adapts_experts
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task, attn_implementation="eager", experts_implementation="eager")
    model = wrap_with_adapters(model, spec.peft.adapter_config, spec.task)
    ids = torch.randint(0, spec.vocab_size, (1, tokens))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    fold, in_fp32 = expert_adapter_fold_flops(spec, memory_traits(TrialConfig(micro_batch=1, dtype="fp32"), "cpu"))
    assert in_fp32 == 0.0  # fp32 weights without autocast: the step's own dtype
    assert tokens * model_flops_per_token(spec, tokens) + fold == pytest.approx(counter.get_total_flops(), rel=0.03)


@pytest.mark.parametrize(
    ("model_type", "experts", "per_token", "mlp_width"),
    [
        ("mixtral", 4, 2, 2 * 96),  # k experts of the config's intermediate size
        ("qwen3_moe", 16, 4, 4 * 32),  # k experts of moe_intermediate_size; intermediate_size is the dense layers'
        ("qwen2_moe", 8, 2, 2 * 32 + 96),  # and the shared expert every token passes through
        ("deepseek_v3", 8, 2, 2 * 32 + 1 * 32),  # n_shared_experts of the routed width
    ],
)
def test_each_family_s_routed_experts_are_read_from_its_config_and_model(
    model_type, experts, per_token, mlp_width, tmp_path
):
    spec = resolve_model(str(write_tiny_moe(tmp_path / model_type, model_type, layers=3)))
    assert spec.experts is not None
    assert (spec.experts.experts, spec.experts.per_token, spec.experts.mlp_width) == (experts, per_token, mlp_width)
    assert spec.intermediate_size == mlp_width  # what the activations scale with
    with torch.device("meta"):
        model = build_model(spec.hf_config, spec.task)
    routed = sum(p.numel() for name, p in model.named_parameters() if ".mlp.experts." in name)
    assert spec.experts.params == routed
    assert spec.num_params == sum(p.numel() for p in model.parameters())  # the memory holds them all
    assert spec.num_non_embedding_params - spec.active_non_embedding_params == routed - routed * per_token // experts


def test_a_dense_model_has_no_routed_experts():
    spec = resolve_model("llama-tiny")
    assert spec.experts is None
    assert spec.active_non_embedding_params == spec.num_non_embedding_params


def test_under_16_bit_autocast_fp32_experts_compute_in_fp32_and_the_prior_counts_them_there(tmp_path):
    """transformers 5 runs routed experts through ``grouped_mm``, which autocast does not cast: with fp32 weights
    their outputs are fp32 under bf16 autocast (the attention's are bf16), so the prior counts their matmuls at the
    fp32 rate; with bf16 weights, none."""
    spec = resolve_model(str(write_tiny_moe(tmp_path / "qwen3_moe", "qwen3_moe")))
    torch.manual_seed(0)
    model = build_model(spec.hf_config, spec.task)
    dtypes: dict[str, torch.dtype] = {}

    def record(name: str):
        def hook(module, inputs, output) -> None:
            dtypes[name] = output.dtype

        return hook

    layer = model.model.layers[0]
    layer.mlp.experts.register_forward_hook(record("experts"))
    layer.self_attn.q_proj.register_forward_hook(record("q_proj"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(input_ids=torch.randint(0, spec.vocab_size, (1, 16)))
    assert dtypes == {"experts": torch.float32, "q_proj": torch.bfloat16}

    assert spec.experts is not None
    active = spec.experts.params * spec.experts.per_token / spec.experts.experts
    bf16_autocast = memory_traits(TrialConfig(micro_batch=1, dtype="bf16"), "cpu")
    assert routed_expert_fp32_flops_per_token(spec, bf16_autocast) == 6 * active
    bf16_weights = memory_traits(TrialConfig(micro_batch=1, dtype="bf16", weight_dtype="bf16"), "cpu")
    assert routed_expert_fp32_flops_per_token(spec, bf16_weights) == 0.0


def test_lora_on_a_mixture_of_experts_adapts_the_experts_without_dropout_and_says_so(tmp_path: Path):
    """peft's "all-linear" puts adapters on the experts' 3-D weights (its ParamWrapper), which take no dropout:
    ``--peft lora`` sets it to 0 with a note; a user's adapter config with dropout is one line saying the fix."""
    spec = resolve_model(str(write_tiny_moe(tmp_path / "mixtral", "mixtral")))
    notes: list[str] = []
    adapted = with_peft(spec, "lora", cpu_device(), notes)
    assert adapted.peft is not None and adapted.peft.adapts_experts
    assert adapted.peft.adapter_config["lora_dropout"] == 0.0
    assert notes == ["--peft lora: lora_dropout 0.05 -> 0: peft's LoRA on routed experts' weights takes no dropout"]
    adapter = tmp_path / "adapter.json"
    adapter.write_text('{"r": 8, "lora_alpha": 16, "lora_dropout": 0.1, "target_modules": "all-linear"}')
    with pytest.raises(AutotuneError, match="set lora_dropout to 0, or target_modules without the experts"):
        with_peft(spec, str(adapter), cpu_device(), [])
