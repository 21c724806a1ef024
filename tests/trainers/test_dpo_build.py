"""A DPO trial's trainer as ``DPO.build`` makes it (autotune/trainers/dpo.py, through
``benchmarks._common.dpo_trainer``: the rows and the synthetic tokenizer saved as a search saves them):
TRL's real DPOTrainer on a 2-layer llama-tiny with random weights, on generated preference pairs,
trained a few steps on the CPU: the reference model it holds (a copy, none under precompute, the adapters disabled under PEFT) and the
real tokens the Trainer counts (prompt + chosen and prompt + rejected, no padding)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")

import torch

from autotune.spec.chat_corpus import DEFAULT_SHAPE
from autotune.spec.models import build_model, catalog_entry
from autotune.spec.preference_corpus import pair_tokens, preference_pair, preference_rows
from autotune.trainers.dpo import TOKENS_COUNTED, batch_real_tokens
from benchmarks._common import dpo_trainer, saved_dpo_rows

PAIRS = 8
MICRO_BATCH = 2
LENGTH_SCALE = 0.125  # pairs of some 60 + 60 tokens: a CPU step stays short
SEQ_LEN = 1024  # DPOConfig's default max_length: no row of these pairs is truncated, every token counts


def tiny_llama() -> Any:
    config = {key: value for key, value in catalog_entry("llama-tiny").items() if not key.startswith("_")}
    torch.manual_seed(0)
    return build_model({**config, "num_hidden_layers": 2}, "causal-lm")


def arguments(tmp_path, **levers: Any) -> dict[str, Any]:
    return {
        "output_dir": str(tmp_path),
        "use_cpu": True,
        "bf16": False,  # fp32: the quickest here; the reference and the tokens do not depend on it
        "gradient_checkpointing": False,
        "per_device_train_batch_size": MICRO_BATCH,
        "max_steps": PAIRS // MICRO_BATCH,  # one epoch: every pair once
        "report_to": "none",
        "logging_strategy": "no",
        "save_strategy": "no",
        "disable_tqdm": True,
        "include_num_input_tokens_seen": TOKENS_COUNTED,
        **levers,
    }


def trainer(tmp_path, fmt: str = "preference", peft_config: Any = None, **levers: Any) -> Any:
    model = tiny_llama()
    rows = preference_rows(PAIRS, seed=0, fmt=fmt, length_scale=LENGTH_SCALE)
    saved = saved_dpo_rows(rows, str(tmp_path), model.config.vocab_size)
    return dpo_trainer(model, saved, arguments(tmp_path, **levers), SEQ_LEN, peft_config=peft_config)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["preference", "preference-text"])
def test_an_epoch_counts_prompt_and_both_answers_and_the_reference_copy_stays(tmp_path, fmt):
    built = trainer(tmp_path, fmt)
    reference, policy = built.ref_model, built.model
    assert reference is not None and reference is not policy
    before = {name: p.detach().clone() for name, p in policy.named_parameters()}
    assert all(torch.equal(before[name], p) for name, p in reference.named_parameters())  # the same start

    built.train()

    # One epoch of pairs, whatever their order: prompt + chosen and prompt + rejected, every token, no padding.
    shape = DEFAULT_SHAPE.scaled(LENGTH_SCALE)
    expected = sum(pair_tokens(*preference_pair(index, 0, shape)) for index in range(PAIRS))
    assert built.state.num_input_tokens_seen == expected
    assert any(not torch.equal(before[name], p) for name, p in policy.named_parameters())  # the policy trained
    assert all(torch.equal(before[name], p) for name, p in reference.named_parameters())  # the reference did not


@pytest.mark.slow
def test_a_collated_batch_holds_chosen_then_rejected_rows_and_its_real_tokens(tmp_path):
    built = trainer(tmp_path)
    rows = [built.train_dataset[index] for index in range(MICRO_BATCH)]
    batch = built.data_collator(rows)
    assert batch["input_ids"].shape[0] == 2 * MICRO_BATCH  # chosen rows, then rejected rows
    lengths = [len(r["prompt_ids"]) + len(r[answer]) for answer in ("chosen_ids", "rejected_ids") for r in rows]
    assert batch_real_tokens(batch) == sum(lengths)
    assert batch["input_ids"].numel() > sum(lengths)  # padded to the longest: padding is not counted


@pytest.mark.slow
def test_precompute_keeps_no_reference_and_reads_its_log_probs_from_the_rows(tmp_path):
    built = trainer(tmp_path, precompute_ref_log_probs=True)
    assert built.ref_model is None
    assert {"ref_chosen_logps", "ref_rejected_logps"} <= set(built.train_dataset.column_names)
    built.train()
    assert built.state.global_step == PAIRS // MICRO_BATCH


@pytest.mark.slow
def test_under_peft_the_reference_is_the_base_model_with_the_adapters_disabled(tmp_path):
    from peft import LoraConfig, PeftModel

    built = trainer(tmp_path, peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    assert built.ref_model is None
    assert isinstance(built.model, PeftModel)
    assert list(built.model.peft_config) == ["default"]  # no "ref" adapter copy: TRL disables the adapters
    built.train()
    assert built.state.global_step == PAIRS // MICRO_BATCH
