"""Pairs of values that cannot train together are left out config by config (autotune/levers/_pairs.py).

Before, such a pair removed one of its values from the whole space: the LLM space could not search
fp32 beside bf16 weights, and a space with fp32 among its dtypes lost flash attention.
"""

from __future__ import annotations

import pytest

from autotune.errors import AutotuneError
from autotune.levers import config_conflict
from autotune.space import SearchSpace
from autotune.space._narrow import filter_combinations
from autotune.study._seeds import runnable_pair


def test_bf16_weights_are_searched_beside_fp32_autocast_without_their_pair():
    notes: list[str] = []
    choices = filter_combinations({"dtype": ["bf16", "fp32"], "weight_dtype": ["fp32", "bf16"]}, notes, "s.yaml")
    assert choices == {"dtype": ["bf16", "fp32"], "weight_dtype": ["fp32", "bf16"]}
    assert notes == [
        "not searched together: dtype fp32 with weight_dtype bf16: bf16 weights train with dtype bf16 (bf16 autocast) only"
    ]
    assert SearchSpace(choices={**choices, "checkpointing": [False, True]}).size == 6  # 2 x (4 - 1)
    assert config_conflict({"dtype": "fp32", "weight_dtype": "bf16"})
    assert not config_conflict({"dtype": "bf16", "weight_dtype": "bf16"})
    assert not config_conflict({"dtype": "fp32"})  # a lever the config does not name is not judged


def test_a_value_with_no_partner_that_trains_is_removed_with_a_note():
    notes: list[str] = []
    choices = filter_combinations({"weight_dtype": ["bf16"], "dtype": ["fp32", "bf16"]}, notes, "s.yaml")
    assert choices["dtype"] == ["bf16"]
    assert notes[0].startswith("dtype fp32 removed: bf16 weights train with dtype bf16")
    with pytest.raises(AutotuneError, match=r"weight_dtype bf16 \(bf16 weights .*\); add bf16 to dtype"):
        filter_combinations({"weight_dtype": ["bf16"], "dtype": ["fp32"]}, [], "s.yaml")


def test_flash_attention_stays_in_a_space_with_fp32_paired_with_16_bit_dtypes_only():
    notes: list[str] = []
    both = {"dtype": ["fp32", "bf16"], "attn_implementation": ["sdpa", "flash_attention_2"]}
    assert filter_combinations(both, notes) == both
    assert notes == [
        "not searched together: attn_implementation flash_attention_2 with dtype fp32: "
        "flash_attention_2 computes in fp16/bf16 only"
    ]
    assert SearchSpace(choices=both).size == 3
    with pytest.raises(AutotuneError, match="cannot run with dtype tf32.*add sdpa, or a 16-bit dtype"):
        filter_combinations({"dtype": ["tf32"], "attn_implementation": ["flash_attention_2"]}, [])


def test_both_rules_judged_together_keep_what_some_config_runs():
    """bf16 weights fixed: fp32 goes (it trains with no weight dtype of the space), flash stays with bf16."""
    notes: list[str] = []
    choices = {
        "weight_dtype": ["bf16"],
        "dtype": ["fp32", "bf16"],
        "attn_implementation": ["sdpa", "flash_attention_2"],
    }
    narrowed = filter_combinations(choices, notes, "s.yaml")
    assert narrowed["dtype"] == ["bf16"] and narrowed["attn_implementation"] == ["sdpa", "flash_attention_2"]
    assert len(notes) == 1  # dtype fp32 removed; no pair is left out after it


def test_a_seed_snapped_onto_a_pair_that_cannot_train_moves_one_lever():
    space = SearchSpace(choices={"dtype": ["fp32", "bf16"], "weight_dtype": ["bf16", "fp32"]})
    assert runnable_pair({"dtype": "fp32", "weight_dtype": "bf16"}, space) == {"dtype": "bf16", "weight_dtype": "bf16"}
    assert runnable_pair({"dtype": "fp32", "weight_dtype": "fp32"}, space) == {"dtype": "fp32", "weight_dtype": "fp32"}
