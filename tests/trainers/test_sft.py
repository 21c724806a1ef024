"""A trial under ``--trainer sft`` (autotune/trainers/sft.py): TRL's SFTTrainer in a real child process on the
generated chat corpus, for each packing, measured as every trial is; and the two things the trial adds
to TRL's preparation (rows cycled, TRL's truncation where it trains untruncated)."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest

pytest.importorskip("trl")

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, run_isolated
from autotune.trainers.sft import cycled, truncated
from tests.support.sft import SEQ_LEN, sft_workload

# TRL's default SFTConfig as the study's first seed has it (bf16, checkpointing, fused AdamW), at a
# micro-batch of 4 so a CPU step stays short; and fp32 without checkpointing, which SFTConfig would
# turn into bf16 with checkpointing were the off values not written.
TRL_DEFAULT = TrialConfig(micro_batch=4, checkpointing=True, dtype="bf16", optim="adamw_torch_fused", pin_memory=False)
CONFIGS = {
    "off": TRL_DEFAULT,
    "padding_free": dataclasses.replace(TRL_DEFAULT, packing="padding_free"),
    "bfd": dataclasses.replace(TRL_DEFAULT, packing="bfd"),
    "fp32": TrialConfig(micro_batch=4, optim="adamw_torch_fused", pin_memory=False),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft")
    workload = sft_workload(root)
    return {
        name: run_isolated(TrialJob(workload, config, str(root / name)), timeout_s=600)
        for name, config in CONFIGS.items()
    }


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_trial_trains_through_sfttrainer_and_is_measured(results, name):
    result = results[name]
    assert result.status == "ok", result.error
    # The loss recorder reads SFTTrainer's own loss (its fused head's mean NLL): a random-init model
    # predicts about uniformly over llama-tiny's 32,000 ids, ln(32000) = 10.37.
    assert result.loss_curve and all(abs(loss - math.log(32000)) < 0.3 for loss in result.loss_curve)
    assert result.measured_steps >= 1 and result.warmup_steps == 1 and result.peak_memory_bytes > 0
    # Samples are samples, not rows: none holds more than --seq-len tokens, packed or not.
    assert result.real_tokens_per_s / result.samples_per_s <= SEQ_LEN
    # The attention term counts each sample over its own length, shorter than the rows it sits in.
    assert 0 < result.attention_context < SEQ_LEN


@pytest.mark.slow
def test_a_flattened_trial_meets_its_fullest_batch_truncated_to_the_sequence_length(results):
    """padding_free trains with max_length=None in TRL; the trial truncates to --seq-len, so its
    fullest batch (the 4 longest samples flattened) is at most 4 x 64 tokens, and one row."""
    for name in ("padding_free", "bfd"):
        rows, tokens = map(int, re.search(r"(\d+)x(\d+) tokens", results[name].peak_batch).groups())
        assert rows == 1 and tokens <= 4 * SEQ_LEN, results[name].peak_batch
    rows, tokens = map(int, re.search(r"(\d+)x(\d+) tokens", results["off"].peak_batch).groups())
    assert rows == 4 and tokens <= SEQ_LEN


@pytest.mark.slow
def test_the_levers_off_values_hold_under_sftconfig(results):
    """fp32 stays fp32 under SFTConfig (whose bf16 defaults on): the autocast read back is none."""
    assert results["fp32"].runtime["autocast_dtype"] == ""
    assert results["off"].runtime["autocast_dtype"] == "bf16"


def test_truncation_keeps_the_start_and_drops_rows_left_without_a_label():
    import datasets

    rows = datasets.Dataset.from_dict(
        {
            "input_ids": [[1, 2, 3, 4, 5], [6, 7], [8, 9, 10]],
            "labels": [[1, 2, 3, 4, 5], [6, 7], [-100, -100, 10]],  # the last trains on its third token only
        }
    )
    kept = truncated(rows, 2)
    assert kept["input_ids"] == [[1, 2], [6, 7]] and kept["labels"] == [[1, 2], [6, 7]]


def test_rows_are_cycled_up_to_what_the_steps_take():
    import datasets

    rows = datasets.Dataset.from_dict({"input_ids": [[1], [2], [3]]})
    assert cycled(rows, 7)["input_ids"] == [[1], [2], [3], [1], [2], [3], [1]]
    assert cycled(rows, 2) is rows
    with pytest.raises(RuntimeError, match="left no row to train on"):
        cycled(rows.select([]), 4)


@pytest.mark.slow
def test_a_compiled_trial_on_batches_of_varying_length_compiles_once_and_says_so(tmp_path):
    """padding_free flattens each batch into a row of a new length. Compiled with transformers' default
    (``dynamic=None``) dynamo compiled the first step's length as a constant and again at the second
    (automatic dynamic shapes), after warm-up: with ``recompile_limit`` 0 the trial was stopped as
    ``recompiling`` (before issue 38, 10's compile-once). The trial now compiles with dynamic shapes from
    the first step (``ACCELERATE_DYNAMO_USE_DYNAMIC``), so no step after warm-up compiles, whatever the
    lengths, and its record says how it compiled. The ``eager`` backend: dynamo's guards and recompiles
    without a backend's code generation, the cheapest real compile."""
    from autotune.spec.measure import MeasureSettings

    measure = MeasureSettings(
        warmup_steps=1, min_steps=3, max_steps=3, max_seconds=60.0, cv_target=1.0, recompile_limit=0
    )
    config = TrialConfig(micro_batch=4, pin_memory=False, packing="padding_free", compile="eager")
    result = run_isolated(TrialJob(sft_workload(tmp_path, measure=measure), config, str(tmp_path / "t")), 600)
    assert result.status == "ok", result.error
    assert result.recompiled_steps == 0 and result.warmup_steps == 1 and result.measured_steps == 3
    assert result.compile_s > 0 and result.runtime["compile_dynamic"] == "True"


@pytest.mark.slow
def test_a_compiled_trial_whose_steps_after_warm_up_compile_again_is_stopped_and_labelled(tmp_path):
    """A step after warm-up that compiles (here a function compiled at step 2, as a shape the trial's
    graph cannot take would make it compile) stops the trial as ``recompiling`` with ``recompile_limit`` 0
    (issue 38, 10), before any measured step and without the fullest batch's extra step. The ``eager``
    backend: dynamo's guards and recompiles without a backend's code generation, the cheapest real
    compile."""
    from autotune.result import INFEASIBLE_STATUSES
    from autotune.spec.measure import MeasureSettings

    measure = MeasureSettings(
        warmup_steps=1, min_steps=3, max_steps=3, max_seconds=60.0, cv_target=1.0, recompile_limit=0
    )
    config = TrialConfig(micro_batch=4, pin_memory=False, packing="padding_free", compile="eager")
    workload = sft_workload(tmp_path, measure=measure, callbacks=("tests.support.faults:CompileAtStep",))
    result = run_isolated(TrialJob(workload, config, str(tmp_path / "t")), 600)
    assert result.status == "recompiling", result.error
    assert result.status in INFEASIBLE_STATUSES  # recorded COMPLETE at 0, its constraint violated: not retried
    assert result.error.startswith("torch.compile compiled again in 1 steps after warm-up (more than 0)")
    assert result.warmup_steps == 2 and result.recompiled_steps == 1 and result.measured_steps == 0
    assert result.compile_s > 0 and result.peak_memory_bytes > 0
