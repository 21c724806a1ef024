"""Small configs of the shapes transformers 5 gives today's multimodal and per-layer models, written as a user's
local model directory (``config.json`` alone): Gemma 3's (a language model under ``text_config`` beside a SigLIP
vision tower, built whole by ``AutoModelForCausalLM``), Mistral 3's (the same shape, built by
``AutoModelForImageTextToText``) and Gemma 4's text model (a heterogeneous config: its
full-attention layers have their own head size and key/value heads, ``per_layer_config``)."""

from __future__ import annotations

from pathlib import Path

_TEXT = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
}
_VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}


def _write(directory: Path, model_type: str, architecture: str, **values: object) -> Path:
    """``model_type``'s config with ``values``, its class in ``architectures``, saved in ``directory``."""
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type, **values)
    config.architectures = [architecture]
    config.save_pretrained(directory)
    return directory


def write_tiny_gemma3(directory: Path) -> Path:
    """A Gemma 3 image-text config: a 2-layer language model and a 2-layer vision tower."""
    return _write(
        directory,
        "gemma3",
        "Gemma3ForConditionalGeneration",
        text_config={**_TEXT, "sliding_window": 32},
        vision_config={**_VISION, "image_size": 64, "patch_size": 16},
        mm_tokens_per_image=4,
        boi_token_index=500,
        eoi_token_index=501,
        image_token_index=502,
    )


def write_tiny_gemma4_text(directory: Path) -> Path:
    """A Gemma 4 text config shaped like its 31B model's (fewer key/value heads and wider heads in the
    full-attention layers, one in six), at 6 layers of width 64."""
    return _write(
        directory,
        "gemma4_text",
        "Gemma4ForCausalLM",
        vocab_size=512,
        vocab_size_per_layer_input=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_global_key_value_heads=1,
        head_dim=16,
        global_head_dim=32,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=0,
        sliding_window=32,
        max_position_embeddings=1024,
    )


def write_tiny_mistral3(directory: Path) -> Path:
    """A Mistral 3 image-text config (Mistral Small 3.1's shape): a Mistral language model and a Pixtral vision
    tower; transformers maps the type to an image-text-to-text class only (``AutoModelForImageTextToText``)."""
    return _write(
        directory,
        "mistral3",
        "Mistral3ForConditionalGeneration",
        text_config={**_TEXT, "model_type": "mistral"},
        vision_config={**_VISION, "head_dim": 16},
        image_token_index=500,
    )
