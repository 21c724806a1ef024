"""A mixture-of-experts model's routed experts: how much of the model one token passes through.

A sparse MoE layer routes each token to ``k`` of its ``E`` experts (Shazeer et al. 2017; Mixtral's release text:
"At every layer, for every token, a router network chooses two of these experts to process the token and combine
their output additively"), so a token multiplies ``k / E`` of the experts' weights while the memory holds all of
them, and the optimizer updates all of them. Counting every parameter as a token's FLOPs (``6N``) makes
Mixtral-8x7B 3.6x and Qwen3-30B-A3B 9x the work they do: Mistral gives Mixtral "46.7B total parameters but only
uses 12.9B parameters per token" (mistral.ai/news/mixtral-of-experts), Qwen "30.5B in total and 3.3B activated"
(the Qwen3-30B-A3B model card); both are the catalog's checks (tests/spec/test_models.py).

What is read, and from where:

* the routed experts' parameters: those under a module named ``experts``, on the model built on the meta device
  (transformers 5 keeps each layer's experts as 3-D tensors, ``mlp.experts.gate_up_proj`` and ``down_proj``, in
  modeling_mixtral.py, modeling_qwen3_moe.py, modeling_qwen2_moe.py, modeling_olmoe.py, modeling_deepseek_v3.py
  and modeling_gpt_oss.py alike); shared experts (``shared_expert``, ``shared_experts``) see every token and are
  not among them;
* ``E`` and ``k`` and each expert's width from the config, by the names those configurations give them.

A config that names experts but no ``k`` (or a model with no ``experts`` module) is counted dense: every
parameter a token's work, the upper bound.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# The config keys of each figure, the first present counting: Mixtral, gpt-oss, GraniteMoE, PhiMoE
# (num_local_experts); Qwen2-MoE, Qwen3-MoE, OLMoE (num_experts); DeepSeek-V2/V3 (n_routed_experts).
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "moe_top_k")
# One expert's MLP width: its own key where the dense layers have another (Qwen2/3-MoE, DeepSeek), else the
# config's intermediate size (Mixtral, OLMoE, gpt-oss).
EXPERT_WIDTH_KEYS = ("moe_intermediate_size", "intermediate_size")


@dataclasses.dataclass(frozen=True)
class RoutedExperts:
    """The routed experts of a mixture-of-experts model.

    Attributes:
        experts: Experts a layer routes among (``E``).
        per_token: Experts each token is routed to (``k``).
        params: The routed experts' parameters, every layer's together.
        mlp_width: The MLP width one token passes through in a MoE layer: ``k`` experts' widths and the shared
            experts' (``ModelSpec.intermediate_size`` of such a model: the width the activations scale with).
    """

    experts: int
    per_token: int
    params: int
    mlp_width: int

    @property
    def active_params(self) -> int:
        """Routed experts' parameters one token multiplies: ``params x k / E``."""
        return self.params * self.per_token // self.experts

    @property
    def idle_params(self) -> int:
        """Routed experts' parameters one token does not multiply."""
        return self.params - self.active_params


def _first_int(hf_config: Any, keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = getattr(hf_config, key, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def shared_experts_width(hf_config: Any, expert_width: int) -> int:
    """The MLP width of the experts every token passes through besides its routed ones: Qwen2-MoE's
    ``shared_expert_intermediate_size``, DeepSeek's ``n_shared_experts`` experts of the routed width; 0 without."""
    shared = _first_int(hf_config, ("shared_expert_intermediate_size",))
    if shared is not None:
        return shared
    return (_first_int(hf_config, ("n_shared_experts",)) or 0) * expert_width


def routed_experts(model: Any, hf_config: Any) -> RoutedExperts | None:
    """The routed experts of ``model`` (built from ``hf_config``, on the meta device), or ``None``: a dense model,
    or one whose config does not say how many experts a token goes through."""
    params = sum(
        p.numel() for name, p in model.named_parameters() if "experts" in name.split(".")[:-1]
    )  # a module named ``experts`` holds it; ``shared_experts`` is another name
    experts = _first_int(hf_config, EXPERT_COUNT_KEYS)
    per_token = _first_int(hf_config, EXPERTS_PER_TOKEN_KEYS)
    width = _first_int(hf_config, EXPERT_WIDTH_KEYS)
    if not params or experts is None or per_token is None or width is None or per_token > experts:
        return None
    return RoutedExperts(experts, per_token, params, per_token * width + shared_experts_width(hf_config, width))
