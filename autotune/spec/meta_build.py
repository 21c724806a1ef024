"""What the model built on the meta device shows (no weights allocated): exact parameter counts, the blocks'
layout, routed experts, a learned position table, and the towers of other modalities a text batch never runs.

:func:`count_on_meta` keeps its answer on disk per config, task and installed versions
(:mod:`autotune.spec.derived_cache`): the build imports the architecture's modeling code, seconds at every search
start. ``autotune.spec.models.spec_from_config`` turns it into a :class:`~autotune.spec.models.ModelSpec`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from autotune.spec import block_layout as layout_rules
from autotune.spec import building as building_rules
from autotune.spec import experts as expert_rules
from autotune.spec.block_layout import BlockLayout, block_layout, transformer_blocks
from autotune.spec.building import build_model
from autotune.spec.derived_cache import cached
from autotune.spec.experts import RoutedExperts, routed_experts

# The source files whose rules the kept counts follow (the derived cache's entries change with any of them).
COUNT_RULES = (__file__, layout_rules.__file__, expert_rules.__file__, building_rules.__file__)


@dataclasses.dataclass(frozen=True)
class MetaCounts:
    """The model for a task, as its meta-device build shows it.

    Attributes:
        num_params: Every parameter of the model with its task head.
        num_embedding_params: Parameters used only as lookup tables (a head tied to the token table is compute).
        num_block_params: Parameters inside the language model's transformer blocks.
        layout: Its first block's :class:`BlockLayout`.
        experts: Its routed experts, or ``None``.
        learned_positions: Positions come from a learned table (which bounds the sequence).
        other_modality_params: Parameters outside the language model and its head: a multimodal model's vision or
            audio tower and projector (Gemma 3's SigLIP), which the trainer builds and a text batch never runs.
    """

    num_params: int
    num_embedding_params: int
    num_block_params: int
    layout: BlockLayout
    experts: RoutedExperts | None
    learned_positions: bool
    other_modality_params: int


def count_on_meta(hf_config: Any, task: str, positions: int) -> MetaCounts:
    """:class:`MetaCounts` of ``hf_config``'s model for ``task`` (``positions``: its language model's
    ``max_position_embeddings``, 0 where it declares none), kept on disk."""
    # Built from a copy: transformers' _from_config writes the weights' dtype into the config it is given,
    # and the config described (ModelSpec.hf_config) is the one read, whether or not the count is cached.
    key = {"config": hf_config.to_dict(), "task": task}
    counts = cached("param-counts", key, COUNT_RULES, lambda: _count(copy.deepcopy(hf_config), task, positions))
    return MetaCounts(
        num_params=int(counts["num_params"]),
        num_embedding_params=int(counts["num_embedding_params"]),
        num_block_params=int(counts["num_block_params"]),
        layout=BlockLayout(**counts["layout"]),
        experts=RoutedExperts(**counts["experts"]) if counts["experts"] else None,
        learned_positions=bool(counts["learned_positions"]),
        other_modality_params=int(counts["other_modality_params"]),
    )


def _count(hf_config: Any, task: str, positions: int) -> dict[str, Any]:
    import torch

    with torch.device("meta"):
        model = build_model(hf_config, task)
    text_config = hf_config.get_text_config(decoder=True)
    language_model = _language_model(model, text_config)
    output_embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_weight = getattr(output_embeddings, "weight", None)
    text_parameters = {id(p) for p in language_model.parameters()}
    if output_embeddings is not None:
        text_parameters |= {id(p) for p in output_embeddings.parameters()}
    blocks = transformer_blocks(language_model)
    layout = block_layout(blocks[0]) if blocks is not None and len(blocks) else BlockLayout()
    experts = routed_experts(model, text_config)
    return {
        "num_params": sum(p.numel() for p in model.parameters()),
        "num_embedding_params": sum(
            m.weight.numel()
            for m in language_model.modules()
            if isinstance(m, torch.nn.Embedding) and m.weight is not head_weight
        ),
        "num_block_params": sum(p.numel() for p in blocks.parameters()) if blocks is not None else 0,
        "layout": dataclasses.asdict(layout),
        "experts": experts and dataclasses.asdict(experts),
        "learned_positions": _has_position_table(language_model, positions),
        "other_modality_params": sum(p.numel() for p in model.parameters() if id(p) not in text_parameters),
    }


def _language_model(model: Any, text_config: Any) -> Any:
    """The module that runs text: the outermost one configured by the text config's class (Gemma 3's
    ``model.language_model``, a ``Gemma3TextModel``, inside ``Gemma3ForConditionalGeneration``); the model itself
    where its config is the text config (every text-only model, and Llama 4's or Qwen3.5's ``ForCausalLM``, which
    transformers builds from the text part of their multimodal configs)."""
    for module in model.modules():
        if isinstance(getattr(module, "config", None), type(text_config)):
            return module
    return model


def _has_position_table(model: Any, positions: int) -> bool:
    """Whether the model looks positions up in a learned table: an embedding named for positions (BERT's
    ``position_embeddings``, OPT's ``embed_positions``, GPT-2's ``wpe``) with at least ``positions`` rows (the
    config's ``max_position_embeddings``; OPT's and RoBERTa's have a few more: their positions start after an
    offset). Relative-position buckets are smaller; rotary and ALiBi models have no such table."""
    import torch

    if positions <= 0:
        return False
    return any(
        isinstance(module, torch.nn.Embedding)
        and ("pos" in name.rsplit(".", 1)[-1] or name.endswith("wpe"))
        and module.num_embeddings >= positions
        for name, module in model.named_modules()
    )
