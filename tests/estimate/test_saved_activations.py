"""What one decoder layer keeps for its backward, counted by autograd's own saved-tensor hooks, against the
estimator's count (``saved_layer_bytes``): the layout terms (three Q/K/V copies under autocast, a gated
MLP's three f-wide tensors, RMSNorm's two fp32 tensors, a fused kernel's output) and, under LoRA, the frozen
base's inputs that are not kept and the adapters' that are.

On an H200 (docs/benchmarks.md, "The LLM proof on a lent H200") the count without them was 36-46 % under
the measured peak of Qwen2.5-0.5B (LoRA) and Llama-3.2-1B (full) without checkpointing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.estimate._activations import layer_activation_bytes, saved_layer_bytes
from autotune.estimate._experts import folded_expert_weight_bytes
from autotune.levers import TrialConfig, memory_traits
from autotune.spec.devices import cpu_device
from autotune.spec.models import ModelSpec, build_model, resolve_model
from autotune.spec.peft import with_peft, wrap_with_adapters
from tests.support.moe import write_tiny_moe

SEQ = 32


def kept_bytes_per_token(spec: ModelSpec, dtype: str) -> float:
    """Bytes the second block keeps per token, from the storages its forward saves for the backward (the
    difference between ``2 SEQ`` and ``SEQ`` tokens: the weights' autocast copies do not grow with them)."""
    config = {**spec.hf_config, "num_hidden_layers": 2, "vocab_size": 512}
    config.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    model = build_model(config, spec.task, attn_implementation="sdpa")
    if spec.peft is not None:
        model = wrap_with_adapters(model, spec.peft.adapter_config, spec.task)
    model.train()
    block = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)[1]
    return (block_kept_bytes(model, block, 2 * SEQ, dtype) - block_kept_bytes(model, block, SEQ, dtype)) / SEQ


def block_kept_bytes(model: torch.nn.Module, block: torch.nn.Module, tokens: int, dtype: str) -> int:
    """Bytes of the distinct storages autograd saves while ``block`` runs its forward, one row of ``tokens``."""
    inside = {"now": False}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if inside["now"] and not isinstance(tensor, torch.nn.Parameter):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    hooks = [
        block.register_forward_pre_hook(lambda *_: inside.update(now=True)),
        block.register_forward_hook(lambda *_: inside.update(now=False)),
    ]
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16"):
            model(input_ids=torch.randint(0, 512, (1, tokens)))
    for hook in hooks:
        hook.remove()
    return sum(storages.values())


NO_DROPOUT = {"attention_dropout": 0.0, "attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}


@pytest.mark.parametrize("adapters", [None, "lora"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("name", ["llama-tiny", "gpt2-tiny"])
def test_a_decoder_layer_keeps_what_the_estimator_counts(name, dtype, adapters):
    """Llama's layout (separate projections, a gated MLP, RMSNorm) and GPT-2's (fused projections, a Python
    GELU that keeps three more tensors), without dropout (no materialised scores: a count per token)."""
    spec = resolve_model(name)
    spec = dataclasses.replace(spec, hf_config={**spec.hf_config, **NO_DROPOUT})
    if adapters is not None:
        spec = with_peft(spec, adapters, cpu_device(), [])
    traits = memory_traits(TrialConfig(micro_batch=1, dtype=dtype), "cpu")
    measured = kept_bytes_per_token(spec, dtype)
    counted = saved_layer_bytes(spec, traits, SEQ, "cpu") / SEQ
    korthikanti = layer_activation_bytes(spec, traits, SEQ, "cpu") / SEQ
    assert abs(counted / measured - 1) < 0.12, (counted, measured)
    assert korthikanti < 0.7 * measured  # the block the count alone describes keeps far less


def test_the_adapters_input_width_is_every_adapted_module_s_input():
    spec = with_peft(resolve_model("llama-tiny"), "lora", cpu_device(), [])  # all-linear: q, k, v, o, gate, up, down
    assert spec.peft is not None
    assert spec.peft.adapted_input_width == 6 * spec.hidden_size + spec.intermediate_size


def test_liger_s_fused_kernels_keep_one_tensor_a_norm_and_recompute_the_gated_activation():
    """Liger can only run on CUDA, so its count is checked against its source's saves (liger-kernel 0.8.5:
    ``LigerRMSNormFunction`` keeps X and RSTD, ``LigerSiLUMulFunction`` keeps a and b): one ``r h`` less per
    norm and one ``p f`` less in the MLP, per token of each layer."""
    spec = resolve_model("llama-3.2-1b")
    h, f, tokens = spec.hidden_size, spec.intermediate_size, 4 * 256
    plain, liger = (
        saved_layer_bytes(spec, memory_traits(TrialConfig(micro_batch=4, dtype="bf16", liger=on), "cuda"), 256, "cuda")
        for on in (False, True)
    )
    assert plain - liger == (2 * 4 * h + 2 * f) * tokens  # two fp32 norm products, one bf16 activation


@pytest.mark.parametrize("adapters", [None, "lora"])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_a_layer_of_routed_experts_keeps_what_the_estimator_counts(model_type, dtype, adapters, tmp_path):
    """A mixture of experts (tests/support/moe.py): the gated MLP of the width a token passes through (its ``k``
    experts'), each expert's gathered input and output, the router's probabilities; the experts' tensors fp32 under
    bf16 autocast (``grouped_mm`` is not autocast-enabled); under LoRA the experts adapted too (peft's ParamWrapper)."""
    spec = resolve_model(str(write_tiny_moe(tmp_path / model_type, model_type)))
    if adapters is not None:
        spec = with_peft(spec, adapters, cpu_device(), [])
    traits = memory_traits(TrialConfig(micro_batch=1, dtype=dtype), "cpu")
    measured = kept_bytes_per_token(spec, dtype)
    counted = saved_layer_bytes(spec, traits, SEQ, "cpu") / SEQ
    assert abs(counted / measured - 1) < 0.12, (counted, measured)
    as_dense = saved_layer_bytes(dataclasses.replace(spec, experts=None), traits, SEQ, "cpu") / SEQ
    assert abs(as_dense / measured - 1) > abs(counted / measured - 1) + 0.05, (as_dense, counted, measured)


@pytest.mark.parametrize("adapters", [None, "lora"])
def test_lora_on_the_experts_keeps_each_layer_s_folded_weights_until_its_backward(adapters, tmp_path):
    """peft's ParamWrapper folds ``W + s B A`` into a new tensor of the experts' weights' size, which the experts'
    matmul keeps for the backward: among a layer's saved storages that are no parameter's own, those of the experts'
    weights' sizes (``folded_expert_weight_bytes``: one layer's); none in full fine-tuning, whose matmul keeps the
    parameter itself."""
    spec = resolve_model(str(write_tiny_moe(tmp_path / "mixtral", "mixtral")))
    if adapters is not None:
        spec = with_peft(spec, adapters, cpu_device(), [])
    model = build_model(spec.hf_config, spec.task, attn_implementation="sdpa")
    if spec.peft is not None:
        model = wrap_with_adapters(model, spec.peft.adapter_config, spec.task)
    model.train()
    block = max((m for m in model.modules() if isinstance(m, torch.nn.ModuleList)), key=len)[1]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    expert_weight_bytes = {4 * p.numel() for p in block.parameters() if p.dim() == 3}  # the experts' own weights
    saved: dict[int, int] = {}
    inside = {"now": False}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if inside["now"] and storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    block.register_forward_pre_hook(lambda *_: inside.update(now=True))
    block.register_forward_hook(lambda *_: inside.update(now=False))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(input_ids=torch.randint(0, spec.vocab_size, (1, SEQ)))
    folds = sum(nbytes for nbytes in saved.values() if nbytes in expert_weight_bytes)
    _, one_layer = folded_expert_weight_bytes(spec, memory_traits(TrialConfig(micro_batch=1, dtype="fp32"), "cpu"))
    assert folds == one_layer, (folds, one_layer, sorted(saved.values()))
