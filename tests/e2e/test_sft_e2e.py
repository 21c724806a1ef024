"""The LLM fine-tuning path end to end (issue 27): ``autotune search --model llama-tiny --dataset chat.jsonl
--device cpu`` on the generated chat corpus trains every trial through TRL's SFTTrainer, seeds TRL's
default SFTConfig, and ranks by the model TFLOPs of the real tokens; ``autotune best`` says what they count."""

from __future__ import annotations

import pytest

from tests.support.cli import run_cli_in_process
from tests.support.llm_study import trials_with_results
from tests.support.sft_study import SEQ_LEN, STUDY_NAME, TRIALS

pytestmark = pytest.mark.slow
pytest.importorskip("trl")


@pytest.fixture(scope="module")
def sft_search(sft_study):
    """The run's SFT study (tests/support/sft_study.py: `autotune search`, made once) and
    `autotune best` on it, in this process."""
    best = run_cli_in_process("best", "--storage", sft_study.storage, cwd=sft_study.root)
    return sft_study.search, best, sft_study.storage


def trials(storage: str) -> list:
    return trials_with_results(storage, STUDY_NAME)


def test_every_trial_trains_through_sfttrainer_from_trls_default(sft_search):
    search, _, storage = sft_search
    assert search.returncode == 0, search.stderr[-3000:]
    assert "trainer: TRL's SFTTrainer on your rows" in search.stdout
    measured = trials(storage)
    assert len(measured) == TRIALS
    for _, result in measured:
        assert result["status"] == "ok", result.get("error")
        assert result["runtime"]["trainer"] == "SFTTrainer" and "trl" in result["versions"]
    first, _ = measured[0]
    assert first.user_attrs["seed"] == "hf-default"  # the baseline seed: TRL's default SFTConfig here
    trl_default = {"micro_batch": 8, "checkpointing": True, "dtype": "bf16", "optim": "adamw_torch_fused"}
    assert {name: first.params[name] for name in (*trl_default, "packing")} == {**trl_default, "packing": "off"}
    assert "speedup over TRL default" in search.stdout and "TRL's default SFTConfig (#0)" in search.stdout


def test_the_ranking_is_model_tflops_of_real_tokens_and_best_says_what_they_count(sft_search):
    _, best, storage = sft_search
    assert best.returncode == 0, best.stderr
    measured = trials(storage)
    for _, result in measured:
        assert result["real_tokens_per_s"] < result["samples_per_s"] * SEQ_LEN  # no padding counted
        assert 0 < result["attention_context"] < SEQ_LEN
    fastest, _ = max(measured, key=lambda pair: pair[1]["model_tflops"])
    assert f"winner: #{fastest.number} at" in best.stdout
    assert "model TFLOPs count every real (non-padding) token" in best.stdout.replace("\n", " ")
