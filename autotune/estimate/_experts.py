"""What a mixture of experts' routed experts cost beyond the dense model of the width a token passes through: the
tensors they keep for the backward, and the matmuls that run in fp32 where the rest runs in 16 bits. One home for
both, read by the memory prior (``_activations.layout_bytes_per_token``) and the throughput prior (``_speed.step_work``);
the experts themselves are read from the model (:mod:`autotune.spec.experts`)."""

from __future__ import annotations

from autotune.estimate._zero import compute_weight_bytes
from autotune.levers import MemoryTraits
from autotune.spec.models import ModelSpec


def routed_expert_bytes_per_token(model: ModelSpec, p: int, expert_bytes: int, trainable: bool) -> int:
    """What a layer of routed experts keeps per token beyond the gated MLP of the width the token passes through
    (``ModelSpec.intermediate_size``: ``p h + 4 p f`` counted; :mod:`autotune.spec.experts`), as transformers 5
    runs them (integrations/moe.py, ``grouped_mm_experts_forward``, its default where ``torch.nn.functional.grouped_mm``
    runs: CUDA from sm80, the CPU from torch 2.9):

    * its four ``f``-wide tensors (the gate and up outputs, the activation, its product) in the experts' weights'
      dtype, ``expert_bytes``: ``grouped_mm`` is not autocast-enabled, so transformers casts the input to the
      weights' dtype and fp32 weights compute the experts in fp32 under 16-bit autocast;
    * each of the token's ``k`` experts' gathered copy of its input (``hidden_states[perm // k]``, kept for the
      weight's gradient: not under frozen experts without adapters) and its output (kept for the product with the
      routing weight);
    * the router's ``E`` fp32 probabilities and the routing's int64 indices (about four per routed copy).

    Counted with saved-tensor hooks (tests/estimate/test_saved_activations.py); 0 for a dense model."""
    experts = model.experts
    if experts is None:
        return 0
    k, h, f = experts.per_token, model.hidden_size, model.intermediate_size
    copies = 2 * k if trainable else k
    return copies * expert_bytes * h + (expert_bytes - p) * 4 * f + 4 * experts.experts + 8 * 4 * k


# Folds of the experts' LoRA into their weights a micro-batch runs, in fold-forward equivalents: peft 0.21's
# ``ParamWrapper`` folds each adapted weight twice in a forward and backpropagates through one fold (the gradients
# of ``A`` and ``B``: two more of its size), so four. Counted with torch's FlopCounterMode (``aten.baddbmm`` and
# ``aten.bmm`` on a LoRA'd mixture of experts: tests/spec/test_experts.py).
EXPERT_FOLDS_PER_MICRO_BATCH = 4


def experts_compute_in_fp32(traits: MemoryTraits) -> bool:
    """The routed experts compute in fp32 while the rest runs in 16 bits: 16-bit autocast with fp32 weights.
    transformers 5 runs experts through ``grouped_mm``, which autocast does not cast, so it casts the input to the
    weights' dtype (integrations/moe.py, ``_grouped_mm``: "not autocast-enabled"); peft folds adapters into them
    with autocast off, in the weights' dtype too."""
    return traits.half_autocast and compute_weight_bytes(traits) == 4


def expert_adapter_fold_flops(model: ModelSpec, traits: MemoryTraits) -> tuple[float, float]:
    """The FLOPs of folding LoRA into the routed experts' 3-D weights in a micro-batch's forward and backward,
    whatever its tokens, and how many of them run in fp32: peft's ``ParamWrapper`` computes ``W + s B A`` as one
    ``baddbmm`` per weight in the weight's dtype with autocast off (peft/tuners/lora/layer.py, ``_LoraFactorsProxy``;
    ``PeftSpec.expert_fold_flops`` is one fold), :data:`EXPERT_FOLDS_PER_MICRO_BATCH` times; ``(0, 0)`` without
    adapters on the experts."""
    if model.peft is None or not model.peft.expert_fold_flops:
        return 0.0, 0.0
    fold = EXPERT_FOLDS_PER_MICRO_BATCH * model.peft.expert_fold_flops
    return fold, fold if experts_compute_in_fp32(traits) else 0.0


def folded_expert_weight_bytes(model: ModelSpec, traits: MemoryTraits) -> tuple[int, int]:
    """(all layers', one layer's) folded expert weights ``W + s B A`` that LoRA on the experts' 3-D weights keeps:
    the fold is a new tensor of the weight's size and dtype, which the experts' matmul keeps for its input's
    gradient until the layer's backward (peft's ``ParamWrapper`` under ``nn.utils.parametrize``; the saved-tensor
    hooks find it: tests/estimate/test_saved_activations.py). Without checkpointing every layer's fold is alive at
    the backward's start; with it, the recomputed layer's. ``(0, 0)`` without adapters on the experts."""
    if model.experts is None or model.peft is None or not model.peft.adapts_experts:  # no folds without adapters
        return 0, 0
    every_layer = model.experts.params * traits.weight_bytes
    return every_layer, every_layer // max(model.num_layers, 1)


def routed_expert_fp32_flops_per_token(model: ModelSpec, traits: MemoryTraits) -> float:
    """The routed experts' matmul FLOPs per token that run in fp32 (:func:`experts_compute_in_fp32`): all of them;
    0 otherwise, or for a dense model. A token's experts cost ``6`` FLOPs per active weight, ``4`` when frozen
    without adapters, ``2`` more when checkpointing recomputes them (as ``spec.flops`` counts the rest)."""
    if model.experts is None or not experts_compute_in_fp32(traits):
        return 0.0
    per_weight = (6 if model.experts_get_weight_gradients else 4) + (2 if traits.recompute else 0)
    return float(per_weight * model.experts.active_params)
