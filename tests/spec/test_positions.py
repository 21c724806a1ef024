"""The longest sequence a model takes (autotune/spec/positions.py), against what the model itself takes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from autotune.errors import AutotuneError
from autotune.plan._checks import seq_len_fits
from autotune.spec.models import ModelSpec, build_model, resolve_model
from autotune.spec.positions import longest_sequence

# A narrow copy of each model: the position table keeps its rows, everything else is small.
NARROW = {"num_hidden_layers": 1, "hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 64}


def _narrow(model: ModelSpec) -> ModelSpec:
    return dataclasses.replace(model, hf_config={**model.hf_config, **NARROW})


def _takes(model: ModelSpec, tokens: int) -> bool:
    """Whether a forward pass of ``tokens`` tokens (none of them the padding id) runs on the narrow copy."""
    narrow = build_model(_narrow(model).hf_config, model.task).eval()
    input_ids = torch.full((1, tokens), (model.hf_config.get("pad_token_id") or 0) + 2)
    try:
        with torch.no_grad():
            narrow(input_ids=input_ids)
    except (IndexError, RuntimeError):  # torch.embedding: "index out of range"; BERT: its position_ids buffer
        return False
    return True


@pytest.mark.parametrize("name", ["roberta-base", "bert-tiny", "gpt2-tiny"])
def test_the_longest_sequence_is_the_longest_the_model_takes(name):
    """roberta-base's 514 rows take 512 tokens (positions start after the padding index 1); BERT's and
    GPT-2's tables take as many tokens as they have rows. The old rule took the rows for RoBERTa too."""
    model = resolve_model(name)
    longest = longest_sequence(model)
    assert _takes(model, longest)
    assert not _takes(model, longest + 1)


def test_a_seq_len_past_a_roberta_models_positions_is_one_line_naming_why():
    model = resolve_model("roberta-base")
    seq_len_fits(512, "roberta-base", model)
    with pytest.raises(AutotuneError) as raised:
        seq_len_fits(513, "roberta-base", model)
    assert str(raised.value) == (
        "--seq-len 513 is longer than roberta-base allows "
        "(512 positions: its table of 514 starts after the padding index, 1)"
    )


@pytest.mark.parametrize(("model_type", "first"), [("roberta", 2), ("data2vec-text", 2), ("bert", 0)])
def test_flattened_rows_number_each_samples_positions_from_the_models_first(model_type, first):
    """The padding lever's flattened rows restart each sample's position ids where the model's start
    (pad_token_id 1: RoBERTa-like models at 2); data2vec-text's class is in data2vec/modeling_data2vec_text.py."""
    from autotune.levers._samples_apart import flattening_collator

    batch = flattening_collator(1, model_type)([{"input_ids": [5, 6, 7]}, {"input_ids": [8, 9]}])
    assert batch["position_ids"].tolist() == [[first, first + 1, first + 2, first, first + 1]]
