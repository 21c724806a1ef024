"""Where a model's positions start, and so the longest sequence its learned position table takes.

Most models with a learned position table (BERT, GPT-2) number positions from 0: a table of
``max_position_embeddings`` rows takes sequences that long. RoBERTa and the models built like it (XLM-R,
CamemBERT, Longformer, MPNet, ESM, ...) number them from ``padding_idx + 1``, after fairseq's
``make_positions`` (transformers' ``create_position_ids_from_input_ids``: "Position numbers begin at
padding_idx+1"): roberta-base's 514 rows (``pad_token_id`` 1) take 512 tokens, and ``--seq-len`` 513 or
514 indexed past the table, every trial an IndexError. Which models do is read from the installed
transformers' own modeling source, not listed here: the modeling module of the model type defines or calls
``create_position_ids_from_input_ids`` (29 modules of transformers 5.24), so a model added to transformers
is covered as it comes. A model type transformers does not know (remote code) counts as numbering from 0.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from autotune.spec.derived_cache import cached
from autotune.spec.models import ModelSpec

_MARK = "create_position_ids_from_input_ids"


def positions_start_after_padding(model_type: str) -> bool:
    """Whether ``model_type``'s position ids start at ``pad_token_id + 1`` (module docstring); kept on disk
    per installed transformers (:mod:`autotune.spec.derived_cache`)."""
    return bool(
        cached("positions-after-padding", {"model_type": model_type}, __file__, lambda: _source_says(model_type))
    )


def first_position(model_type: str, pad_token_id: int) -> int:
    """The position id of a sequence's first token: ``pad_token_id + 1`` for RoBERTa-like models, else 0."""
    return pad_token_id + 1 if positions_start_after_padding(model_type) else 0


def longest_sequence(model: ModelSpec) -> int:
    """The most tokens a sequence of ``model`` may hold: its position table's rows less the positions
    before its first (0: no learned table bounds it, RoPE)."""
    if not model.max_positions:
        return 0
    pad_token_id = model.config_value("pad_token_id")
    model_type = str(model.text_config.get("model_type", ""))
    if pad_token_id is None or not positions_start_after_padding(model_type):
        return model.max_positions
    return model.max_positions - first_position(model_type, int(pad_token_id))


def _source_says(model_type: str) -> bool:
    """The mark in the modeling module that defines ``model_type``'s model class (data2vec-text's is
    ``data2vec/modeling_data2vec_text.py``, beside the audio and vision ones)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    try:
        package = importlib.util.find_spec(f"transformers.models.{model_type_to_module_name(model_type)}")
    except (ImportError, ValueError):  # no such package: a model type of remote code
        return False
    if package is None or package.origin is None:
        return False
    model_class = MODEL_MAPPING_NAMES.get(model_type)
    for module in sorted(Path(package.origin).parent.glob("modeling_*.py")):
        source = module.read_text(encoding="utf-8")
        if model_class is None or f"class {model_class}(" in source:
            return _MARK in source
    return False
