"""A DPO trial's trainer as ``DPO.build`` makes it (autotune/trainers/dpo.py, through
``benchmarks.bench_dpo_levers.dpo_trainer``: the rows and the synthetic tokenizer saved as a search saves them):
TRL's real DPOTrainer on a 2-layer llama-tiny with random weights, on generated preference pairs,
trained an epoch on the CPU: the reference copy it holds, which stays as it was, and the real tokens the
Trainer counts (prompt + chosen and prompt + rejected, no padding). No copy under precompute or PEFT, and the
collated batch's rows: tests/trainers/test_dpo_trainer.py (built, not trained); a trial training under
them: tests/e2e/test_dpo_e2e.py (precompute), tests/trainers/test_dpo_trial.py (PEFT)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("trl")

import torch

from autotune.spec.chat_corpus import DEFAULT_SHAPE
from autotune.spec.model_catalog import catalog_entry
from autotune.spec.models import build_model
from autotune.trainers._preference_corpus import pair_tokens, preference_pair, preference_rows
from autotune.trainers.dpo import TOKENS_COUNTED
from benchmarks.bench_dpo_levers import dpo_trainer, saved_dpo_rows

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
