"""Preference tuning end to end (issue 39): ``autotune search --model ./decoder --dataset prefs.jsonl --device
cpu`` (a local 2-layer decoder) on generated preference pairs, no ``--trainer``, trains every trial through TRL's DPOTrainer (chosen
by the rows), seeds TRL's default DPOConfig, counts a precomputed reference pass over the user's run, and
exports arguments DPOConfig takes."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli_in_process
from tests.support.dpo_study import SEQ_LEN, STUDY_NAME, TRIALS, TRL_DEFAULT
from tests.support.llm_study import trials_with_results

pytestmark = pytest.mark.slow
pytest.importorskip("trl")

# The user's run the trials' rates are counted over: TrainingArguments' default num_train_epochs (the search
# gives no --epochs), each pair trained 3 times, the precomputed reference pass run once.
PASSES = 3.0


def trials(storage: str) -> list:
    return trials_with_results(storage, STUDY_NAME)


def steps_alone(trial, result) -> float:
    """Pairs a second over the trial's measured steps alone: the global batch over their mean time (a DPO
    trial's batches vary in length, so the mean, not the median: runner/_trial.py)."""
    global_batch = trial.params["micro_batch"] * trial.params["grad_accum"]
    return global_batch * result["measured_steps"] / result["measured_s"]


def test_every_trial_trains_through_dpotrainer_from_trls_default(dpo_study):
    search = dpo_study.search
    assert "trainer: TRL's DPOTrainer on your preference pairs" in search.stdout
    assert "(the --dataset holds preference pairs)" in search.stdout.replace("\n", "")  # chosen by the rows
    measured = trials(dpo_study.storage)
    assert len(measured) == TRIALS
    for _, result in measured:
        assert result["status"] == "ok", result.get("error")
        assert result["runtime"]["trainer"] == "DPOTrainer" and "trl" in result["versions"]
        # TRL's collator's fullest batch: prompt + chosen and prompt + rejected of the 8 longest pairs.
        assert "the 8 longest pairs as TRL's collator builds them" in result["peak_batch"]
    first, _ = measured[0]
    assert first.user_attrs["seed"] == "hf-default"  # the baseline seed: TRL's default DPOConfig, exactly
    assert "seed_instead_of" not in first.user_attrs
    assert {name: first.params[name] for name in TRL_DEFAULT} == TRL_DEFAULT
    assert first.params["precompute_ref_log_probs"] is False
    assert "TRL's default DPOConfig (#0)" in search.stdout.replace("\n", " ")


def test_a_precomputed_reference_pass_is_counted_over_the_run(dpo_study):
    from autotune.result import over_the_run

    by_precompute = {
        trial.params["precompute_ref_log_probs"]: (trial, result) for trial, result in trials(dpo_study.storage)
    }
    trial, result = by_precompute[True]
    assert result["setup_pass_samples"] > 0 and result["setup_pass_s"] > 0
    per_sample = result["setup_pass_s"] / result["setup_pass_samples"]
    assert result["samples_per_s"] < steps_alone(trial, result)
    assert result["samples_per_s"] == pytest.approx(over_the_run(steps_alone(trial, result), per_sample, PASSES))
    # The reference's forward in every step: no pass before training, the rate the steps' own.
    trial, result = by_precompute[False]
    assert (result["setup_pass_s"], result["setup_pass_samples"]) == (0.0, 0)
    assert result["samples_per_s"] == pytest.approx(steps_alone(trial, result))


def test_the_json_export_is_keyword_arguments_dpoconfig_takes(dpo_study):
    from trl import DPOConfig

    out = dpo_study.root / "best_args.json"
    exported = run_cli_in_process(
        "export", "--storage", dpo_study.storage, "--format", "json", "--out", str(out), "--force", cwd=dpo_study.root
    )
    assert exported.returncode == 0, exported.stderr
    config = DPOConfig(**json.loads(out.read_text()))
    winner, _ = max(trials(dpo_study.storage), key=lambda pair: pair[1]["model_tflops"])
    assert config.precompute_ref_log_probs == winner.params["precompute_ref_log_probs"]
    assert (config.per_device_train_batch_size, config.max_length) == (TRL_DEFAULT["micro_batch"], SEQ_LEN)
