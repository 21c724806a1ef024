"""Small mixture-of-experts configs written as a user's local model directory (``config.json`` alone: the throughput
and memory tests need no tokenizer), one per way transformers 5 builds routed experts: Mixtral's (experts of the
config's intermediate size), Qwen3-MoE's (experts of their own ``moe_intermediate_size``), Qwen2-MoE's (a shared
expert every token passes through) and DeepSeek-V3's (``n_shared_experts``, a dense first layer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_ATTENTION = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512}
_COMMON = {
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_dropout": 0.0,
}

TINY_MOE: dict[str, dict[str, Any]] = {
    "mixtral": {
        "architectures": ["MixtralForCausalLM"],
        "intermediate_size": 96,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "qwen3_moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "intermediate_size": 192,
        "moe_intermediate_size": 32,
        "num_experts": 16,
        "num_experts_per_tok": 4,
        "mlp_only_layers": [],
    },
    "qwen2_moe": {
        "architectures": ["Qwen2MoeForCausalLM"],
        "intermediate_size": 192,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 96,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "mlp_only_layers": [],
    },
    "deepseek_v3": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "intermediate_size": 192,
        "moe_intermediate_size": 32,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 8,
        "v_head_dim": 16,
        "head_dim": 8,  # the rotary part's (qk_rope_head_dim)
        "num_key_value_heads": 4,
    },
}


def write_tiny_moe(directory: Path, model_type: str, layers: int = 2) -> Path:
    """``directory/config.json`` of the ``model_type`` entry of :data:`TINY_MOE` with ``layers`` layers."""
    directory.mkdir(parents=True, exist_ok=True)
    config = {"model_type": model_type, **_ATTENTION, **_COMMON, "num_hidden_layers": layers, **TINY_MOE[model_type]}
    (directory / "config.json").write_text(json.dumps(config))
    return directory
