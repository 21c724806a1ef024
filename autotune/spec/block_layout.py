"""How a transformer block is built, as far as the memory it keeps for its backward depends on it: the
:class:`BlockLayout` read from the block built on the meta device (``spec.models`` keeps it on ``ModelSpec``;
``estimate._activations.layout_bytes_per_token`` counts with it; docs/estimator.md, "Activations")."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """What in a transformer block sets the tensors autograd keeps for its backward, read from the block
    built on the meta device (:func:`block_layout`). The defaults are the block Korthikanti et al. count
    (GPT-2, BERT: one projection reads each input, a two-matrix MLP, LayerNorm).

    Attributes:
        attention_input_projections: Linear modules that each read the attention's input (3: separate
            ``q_proj``, ``k_proj``, ``v_proj``; 1: one fused ``qkv`` or ``c_attn``). Under autocast each one
            casts, and keeps, its own 16-bit copy of the input (autocast's cast cache holds leaf tensors
            only: torch/csrc/autograd/autocast_mode.cpp, ``cached_cast``).
        mlp_input_projections: Linear modules that each read the MLP's input (2: ``gate_proj`` and
            ``up_proj``; 1: ``fc1``, or a fused ``gate_up_proj``).
        gated_mlp: The MLP multiplies an activated gate by an up projection (SwiGLU, GeGLU): it keeps the
            gate's output, its activation and the up projection's output, three ``f``-wide tensors where a
            two-matrix MLP keeps one.
        rms_norm: The norms are transformers' Python RMSNorm, which keep their fp32 input and, for the
            weight's gradient, the normalised input (``LlamaRMSNorm.forward``: ``self.weight *
            hidden_states``): two ``h``-wide tensors where ``nn.LayerNorm`` keeps one.
        activation_extra_tensors: Tensors of its input's size the MLP's activation keeps beyond its input
            (0 for torch's own GELU and SiLU; 3 for transformers' Python ``NewGELUActivation``, GPT-2's
            ``gelu_new``: its ``tanh`` output and the two factors of its last product), counted by running it.
    """

    attention_input_projections: int = 1
    mlp_input_projections: int = 1
    gated_mlp: bool = False
    rms_norm: bool = False
    activation_extra_tensors: float = 0.0


def transformer_blocks(model: Any) -> Any:
    """The model's transformer blocks: its longest ``ModuleList`` (``encoder.layer``, ``h``, ``layers``, ...)."""
    import torch

    block_lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return max(block_lists, key=len, default=None)


# Linear modules that each read the attention's input, and the MLP's, by the names transformers' decoders give
# them (modeling_llama.py, modeling_qwen2.py, modeling_mistral.py, modeling_gemma.py: q_proj, k_proj, v_proj;
# gate_proj, up_proj), BERT's (query, key, value) and DistilBERT's (q_lin, k_lin, v_lin). A fused projection (GPT-2's c_attn, Phi-3's qkv_proj and
# gate_up_proj) is one module: it keeps one copy.
_ATTENTION_INPUT_NAMES = frozenset({"q_proj", "k_proj", "v_proj", "query", "key", "value", "q_lin", "k_lin", "v_lin"})
_MLP_INPUT_NAMES = frozenset({"gate_proj", "up_proj", "w1", "w3"})
_GATE_NAMES = frozenset({"gate_proj", "gate_up_proj", "w1"})


def block_layout(block: Any) -> BlockLayout:
    """Read a block's :class:`BlockLayout` from its modules (built on the meta device: no memory)."""
    import torch

    linear_names = [name.rsplit(".", 1)[-1] for name, m in block.named_modules() if isinstance(m, torch.nn.Linear)]
    norms = [type(m).__name__ for m in block.modules() if "norm" in type(m).__name__.lower()]
    # The MLP's activation (act_fn, act, activation_fn, intermediate_act_fn), not an attention's softmax.
    activations = [
        m
        for name, m in block.named_modules()
        if type(m).__module__ in _ACTIVATION_MODULES and "act" in name.rsplit(".", 1)[-1]
    ]
    # Routed experts keep their weights as 3-D tensors, not Linear modules (transformers 5: ``experts.gate_up_proj``).
    parameter_names = [name.rsplit(".", 1)[-1] for name, _ in block.named_parameters()]
    return BlockLayout(
        attention_input_projections=max(sum(n in _ATTENTION_INPUT_NAMES for n in linear_names), 1),
        mlp_input_projections=max(sum(n in _MLP_INPUT_NAMES for n in linear_names), 1),
        gated_mlp=any(n in _GATE_NAMES for n in linear_names) or "gate_up_proj" in parameter_names,
        rms_norm=bool(norms) and all("rmsnorm" in n.lower() for n in norms),
        activation_extra_tensors=activation_extra_tensors(activations[0]) if activations else 0.0,
    )


# Where the activation modules of transformers' blocks come from (ACT2FN's classes, and torch's own).
_ACTIVATION_MODULES = frozenset({"transformers.activations", "torch.nn.modules.activation"})


def activation_extra_tensors(activation: Any) -> float:
    """Input-sized tensors ``activation`` keeps for its backward beyond its input: run once on a small CPU tensor
    under autograd's saved-tensor hooks. Most activations hold no weights, so one built on the meta device runs on
    the CPU; a learned one (Apertus's xIELU: two scalar parameters) runs as a CPU copy with its parameters at 1."""
    import copy

    import torch

    if [*activation.parameters(), *activation.buffers()]:
        activation = copy.deepcopy(activation).to_empty(device="cpu")
        with torch.no_grad():
            for tensor in [*activation.parameters(), *activation.buffers()]:
                tensor.fill_(1.0)
    x = torch.randn(4, 32, requires_grad=True)
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        activation(x)
    saved.pop(x.untyped_storage().data_ptr(), None)
    return round(sum(nbytes for nbytes in saved.values() if nbytes >= x.nbytes) / x.nbytes, 2)
