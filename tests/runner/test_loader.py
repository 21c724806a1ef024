"""The trial child's data (runner/_data.py). A config that fits stays inside memory for the whole run:
with --dataset and dynamic padding every trial also runs the fullest batch its data can produce, once, outside the timed steps, and that
peak is the trial's peak."""

from __future__ import annotations

import json

import pytest

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.runner import TrialJob, Workload, run_isolated
from autotune.runner._loader import load_training_dataset
from autotune.spec.dataset import prepare_dataset

SEQ_LEN = 128
LONG = 8  # samples of SEQ_LEN tokens among many of 4


def write_ids(path, short: int, long: int):
    """Pre-tokenized samples (no tokenizer needed): ``short`` of 4 tokens, then ``long`` of SEQ_LEN."""
    rows = [[(7 * i + j) % 1000 + 1 for j in range(4)] for i in range(short)]
    rows += [[(11 * i + j) % 1000 + 1 for j in range(SEQ_LEN)] for i in range(long)]
    path.write_text("".join(json.dumps({"input_ids": ids}) + "\n" for ids in rows))
    return path


def test_the_prepared_sample_keeps_the_datas_longest_samples(tmp_path, gpt2_tiny):
    # 400 rows, of which a trial consumes 8 x (3 + 1) = 32: a random sample would likely miss the 8 long ones.
    prepared = prepare_dataset(
        str(write_ids(tmp_path / "d.jsonl", 400, LONG)), gpt2_tiny, SEQ_LEN, 8, 3, str(tmp_path / "c")
    )
    dataset = load_training_dataset(prepared, gpt2_tiny, SEQ_LEN, pad_to_length=False)
    lengths = dataset.sample_lengths()
    assert len(lengths) == 32 and sorted(lengths)[-LONG:] == [SEQ_LEN] * LONG and lengths.count(4) == 32 - LONG


def _job_on_two_long_samples(tmp_path, gpt2_tiny, cpu, fast_measure, padding: str, callbacks=()) -> TrialJob:
    """gpt2-tiny on 2,000 samples of 4 tokens and 2 of SEQ_LEN (its 50k-token head: a batch's logits are
    12 bytes x tokens x 50257, so the tokens decide the peak)."""
    prepared = prepare_dataset(
        str(write_ids(tmp_path / "d.jsonl", 2000, 2)), gpt2_tiny, SEQ_LEN, 8, 40, str(tmp_path / "cache")
    )
    return TrialJob(
        workload=Workload.for_model(
            gpt2_tiny,
            device=cpu,
            seq_len=SEQ_LEN,
            ceiling_bytes=16 * 1024**3,
            measure=fast_measure,
            dataset=prepared,
            callbacks=callbacks,
        ),
        config=TrialConfig(micro_batch=8, pin_memory=False, padding=padding),
        work_dir=str(tmp_path / "trial"),
    )


@pytest.mark.slow
@pytest.mark.parametrize("padding", ["padding_free", "longest"])
def test_the_worst_batch_runs_once_and_its_peak_is_the_trials(tmp_path, gpt2_tiny, cpu, fast_measure, padding):
    job = _job_on_two_long_samples(tmp_path, gpt2_tiny, cpu, fast_measure, padding)
    result = run_isolated(job, timeout_s=300)
    assert result.status == "ok", result.error
    measured = result.memory_peaks["measured_steps_peak_bytes"]
    assert result.peak_memory_bytes >= measured > 0
    if padding == "padding_free":
        # The 2 long samples and 6 of 4 tokens, flattened: 280 tokens, more than the short batches the
        # timed steps drew (seed 0); its logits alone are 12 x 280 x 50257 bytes (161 MiB).
        assert result.peak_batch == "worst-case batch: the 8 longest samples flattened into one row, 1 x 280 tokens"
        assert result.peak_memory_bytes > measured
    else:
        assert "8 x 128 tokens" in result.peak_batch  # named whichever batch set the peak
        assert result.peak_batch.startswith(("worst-case batch", "the measured steps"))


@pytest.mark.slow
def test_synthetic_tokens_need_no_worst_case_step(tmp_path, bert_tiny, cpu, fast_measure):
    job = TrialJob(
        workload=Workload.for_model(bert_tiny, device=cpu, seq_len=32, ceiling_bytes=8 * 1024**3, measure=fast_measure),
        config=TrialConfig(micro_batch=8, pin_memory=False),
        work_dir=str(tmp_path / "trial"),
    )
    result = run_isolated(job, timeout_s=120)
    assert result.status == "ok", result.error
    assert result.peak_batch == "" and "measured_steps_peak_bytes" not in result.memory_peaks


def test_the_export_and_the_report_say_which_batch_set_the_peak():
    from autotune.views.export import export_notes
    from autotune.views.ranking import RankedTrial
    from autotune.views.report import TrialRow

    words = "worst-case batch: the 8 longest samples padded to the longest, 8 x 128 tokens"
    result = TrialResult(status="ok", peak_memory_bytes=3 * 1024**3, peak_batch=words)
    best = RankedTrial(number=2, state="COMPLETE", config=TrialConfig(), result=result)
    assert f"the winner's peak memory (3.00 GiB) was set by {words}" in export_notes(best)
    assert not any(
        "was set by" in n for n in export_notes(RankedTrial(2, "COMPLETE", TrialConfig(), TrialResult(status="ok")))
    )
    fields = {f: None for f in TrialRow.__dataclass_fields__}
    row = TrialRow(
        **{**fields, "number": 2, "status": "ok", "config": TrialConfig(), "result": result, "reused": False}
    )
    assert f"peak set by {words}" in row.hover()


@pytest.mark.slow
def test_a_timeout_in_the_fullest_batchs_step_keeps_what_the_timed_steps_measured(
    tmp_path, gpt2_tiny, cpu, fast_measure
):
    """The timed steps were measured, then the timeout ended the step on the fullest batch: the trial is a
    timeout (whether that batch fits is not known: not ranked), its speed kept. The old code recorded nothing
    of the steps: a smollm2-135m trial lost its 700 s of measured training that way."""
    job = _job_on_two_long_samples(
        tmp_path, gpt2_tiny, cpu, fast_measure, "longest", callbacks=("tests.support.faults:SlowFullestBatch",)
    )
    result = run_isolated(job, timeout_s=45)  # the timed steps take 5-15 s here; the fullest batch's, an hour
    assert result.status == "timeout", result.error
    assert result.measured_steps > 0 and result.samples_per_s > 0 and result.step_time_median_s > 0
    assert not result.feasible
    assert "It was killed in the step on its fullest batch, after" in result.error
    assert f"at {result.samples_per_s:.3g} samples/s (kept; whether that batch fits is not known)" in result.error
