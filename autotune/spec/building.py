"""Building a model from its config, with random weights: what every trial trains and the meta-device count reads
(:mod:`autotune.spec.meta_build`). Only the config is needed: throughput and memory do not depend on the weights'
values."""

from __future__ import annotations

from typing import Any

from autotune.spec.config_reading import NO_MODEL_CODE


def build_model(hf_config: Any, task: str, **from_config: Any) -> Any:
    """Build the model for ``task`` from a Hugging Face config, with random weights.

    Args:
        hf_config: A ``PretrainedConfig`` or a config dict (as stored in :class:`ModelSpec`).
        task: One of ``autotune.spec.models.TASKS``.
        from_config: Keyword arguments of ``from_config``, as the trial's levers set them
            (``autotune.levers.model_build_kwargs``: ``attn_implementation``, ``dtype`` by its torch
            name). The weights' dtype is always passed, ``float32`` unless given: without it
            ``from_config`` builds in the config's own ``dtype`` (transformers/modeling_utils.py,
            ``_from_config``: ``dtype = kwargs.pop("dtype", config.dtype)``), and most published
            decoder configs say bfloat16.
    """
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForMaskedLM, AutoModelForSequenceClassification

    if isinstance(hf_config, dict):
        values = dict(hf_config)
        hf_config = AutoConfig.for_model(values.pop("model_type"), **values)
    weights_dtype = getattr(torch, from_config.pop("dtype", "float32"))
    kwargs: dict[str, Any] = {**from_config, "dtype": weights_dtype}
    if task == "causal-lm":
        auto_class = getattr(transformers, text_generation_class(hf_config.model_type) or "AutoModelForCausalLM")
        return auto_class.from_config(hf_config, **kwargs, **NO_MODEL_CODE)
    if task == "masked-lm":
        return AutoModelForMaskedLM.from_config(hf_config, **kwargs, **NO_MODEL_CODE)
    hf_config.num_labels = 2
    if getattr(hf_config, "pad_token_id", None) is None:
        hf_config.pad_token_id = 0  # decoders need one to classify a batch
    return AutoModelForSequenceClassification.from_config(hf_config, **kwargs, **NO_MODEL_CODE)


def text_generation_class(model_type: str) -> str | None:
    """The Auto class transformers generates text with for ``model_type``: ``AutoModelForCausalLM`` where it maps
    the type to a causal-LM class (Gemma 3's multimodal config among them), ``AutoModelForImageTextToText`` for an
    image-text model it maps only there (Mistral 3, Qwen2.5-VL: a text batch trains their language model, the
    vision tower built and idle); ``None``: neither (an encoder, a speech model)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "AutoModelForCausalLM"
    if model_type in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES:
        return "AutoModelForImageTextToText"
    return None
