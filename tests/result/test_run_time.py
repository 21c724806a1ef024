"""The user's whole run (issue 40, point 4): its length, its projected wall time and its cost, the arithmetic
of ``autotune.result._run_time`` (the views that print it are tested on real studies in
tests/views/test_run_time.py)."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.errors import AutotuneError
from autotune.result import (
    Pace,
    TrialResult,
    dataset_samples,
    duration,
    over_the_run,
    passes_over_data,
    projected_seconds,
    run_length,
    run_time_line,
    setup_pass_note,
)
from autotune.result._run_time import DEFAULT_EPOCHS, NEEDS_DATASET
from autotune.spec.dataset import PreparedDataset


def test_the_run_length_is_max_steps_where_base_args_set_it_as_the_trainer_runs_it():
    length = run_length({"max_steps": 500, "num_train_epochs": 7}, None)
    assert (length.epochs, length.max_steps) == (None, 500)
    assert length.words(12_345) == "500 optimizer steps"


def test_the_run_length_is_the_epochs_of_base_args_of_epochs_or_the_trainers_default():
    assert run_length({"num_train_epochs": 2}, None).epochs == 2.0
    assert run_length({"num_train_epochs": 2}, 2.0).epochs == 2.0  # the same figure twice agrees
    assert run_length({}, 1.5).epochs == 1.5
    assert run_length({"max_steps": -1}, None).epochs == DEFAULT_EPOCHS  # -1: the Trainer's "no max_steps"
    # transformers' TrainingArguments.num_train_epochs, which TRL's SFTConfig keeps.
    from transformers import TrainingArguments

    assert DEFAULT_EPOCHS == TrainingArguments.__dataclass_fields__["num_train_epochs"].default
    assert run_length({}, None).words(12_345) == "3 epochs over 12,345 samples"


@pytest.mark.parametrize(
    ("base_args", "error"),
    [
        ({"max_steps": 100}, "--epochs 2: --base-args sets max_steps 100"),
        ({"num_train_epochs": 3}, "--epochs 2 contradicts num_train_epochs 3 in --base-args"),
    ],
)
def test_epochs_that_contradict_base_args_are_one_line(base_args, error):
    with pytest.raises(AutotuneError, match=error) as raised:
        run_length(base_args, 2.0)
    assert "\n" not in str(raised.value)


def _dataset(num_samples: int, length: int, packing: bool) -> PreparedDataset:
    return PreparedDataset("d", "d", "d", "text", None, 0, num_samples, length, packing)


def test_an_epoch_trains_every_sample_of_the_data_and_packed_data_only_where_it_was_packed_whole():
    assert dataset_samples(None) is None  # synthetic tokens: no epoch
    assert dataset_samples(_dataset(1_000, 200, packing=False)) == 1_000
    assert dataset_samples(_dataset(150, 200, packing=True)) == 150  # every block of the data
    # spec.dataset stops packing at what the trials read: the data's blocks are more, unknown.
    assert dataset_samples(_dataset(200, 200, packing=True)) is None


def test_the_projection_is_the_samples_trained_at_the_pace_plus_the_warmups_excess():
    pace = Pace(samples_per_s=4.0, samples_per_step=8, warmup_excess_s=3.0)
    assert projected_seconds(run_length({}, 2.0), 1_000, pace) == pytest.approx(2 * 1_000 / 4.0 + 3.0)
    assert projected_seconds(run_length({"max_steps": 50}, None), None, pace) == pytest.approx(50 * 8 / 4.0 + 3.0)
    assert projected_seconds(run_length({}, 2.0), None, pace) is None


def test_a_trials_pace_takes_its_recorded_rate_and_the_warmup_beyond_steady_steps():
    # A trial of global batch 8 at 4 samples/s: 2 s a step; its 2 warm-up steps took 10 s, 6 s beyond.
    result = TrialResult("ok", samples_per_s=4.0, measured_steps=5, measured_s=10.0, warmup_steps=2, warmup_s=10.0)
    assert Pace.measured(result, 4.0, 8, packed_samples=False) == Pace(4.0, 8, 6.0)
    # Under TRL's packing a step holds the samples its rows packed: the trial's mean, 24 a step here.
    packed = dataclasses.replace(result, samples_per_s=12.0)
    assert Pace.measured(packed, 12.0, 8, packed_samples=True).samples_per_step == pytest.approx(24.0)
    # A warm-up faster than steady steps adds nothing (never a negative time).
    assert Pace.measured(dataclasses.replace(result, warmup_s=1.0), 4.0, 8, False).warmup_excess_s == 0.0


@pytest.mark.parametrize(
    ("seconds", "words"),
    [
        (4.2, "4.2 s"),
        (13.6, "13.6 s"),
        (45, "45 s"),
        (200, "3 min 20 s"),
        (7_800, "2 h 10 min"),
        (21_660, "6 h 01 min"),
        (3 * 86_400 + 4 * 3600, "3 d 4 h"),
    ],
)
def test_a_wall_time_reads_in_units_people_use(seconds, words):
    assert duration(seconds) == words


def test_the_line_says_the_winners_and_defaults_time_the_time_saved_and_the_cost_with_units():
    length = run_length({}, 3.0)
    winner, default = Pace(2.0, 8), Pace(0.5, 8)
    line = run_time_line(length, 3_600, ("winner #4", winner), ("HF default #0", default), 2.5, 2)
    # 3 epochs x 3,600 samples: 10,800 samples at 2/s = 1 h 30 min; at 0.5/s = 6 h; 4 h 30 min saved.
    assert line.startswith("projected wall time of 3 epochs over 3,600 samples (--epochs): 1 h 30 min (winner #4")
    assert "vs 6 h 00 min (HF default #0, 0.5 samples/s): 4 h 30 min saved" in line
    # 1.5 h x $2.5 x 2 devices = $7.50; 6 h: $30.00.
    assert "cost $7.50 vs $30.00 at $2.5/h per device x 2 devices" in line
    assert line.endswith("; excluded: the start-up before the first step (model load, trainer and data set-up)")


def test_a_cost_below_a_cent_keeps_its_figures():
    from autotune.result._run_time import money

    assert (money(1234.5), money(0.0012345), money(0.0)) == ("$1,234.50", "$0.00123", "$0.00")
    # Two small costs side by side keep their ratio: $0.0142 against $0.0083, not $0.01 against $0.0083.
    assert (money(0.01416), money(0.00832), money(2.5)) == ("$0.0142", "$0.00832", "$2.50")


def test_max_steps_of_two_global_batches_is_not_the_same_run():
    """``max_steps`` trains as many steps as the user says, each of its config's global batch: a winner of 256 a
    step and a default of 8 train different amounts of data, so no time is called saved or lost; with the same
    global batch the comparison stands."""
    length = run_length({"max_steps": 50}, None)
    line = run_time_line(length, None, ("predicted winner", Pace(25.0, 256)), ("HF default", Pace(20.0, 8)), 2.0, 1)
    assert "not the same run, 50 steps train 12,800 samples in the first and 400 in the second" in line
    assert "saved" not in line and "longer" not in line
    assert "cost $0.284 vs $0.0111" in line  # 512 s and 20 s at $2/h
    same = run_time_line(length, None, ("predicted winner", Pace(25.0, 8)), ("HF default", Pace(20.0, 8)), None, 1)
    assert "not the same run" not in same and "(HF default, 20 samples/s): 4 s saved" in same


def test_the_line_says_what_it_needs_rather_than_invent_a_size_and_marks_a_prediction():
    line = run_time_line(run_length({}, None), None, ("winner", Pace(2.0, 8)), None, None, 1)
    assert line.endswith(NEEDS_DATASET)
    predicted = run_time_line(run_length({}, 1.0), 100, ("predicted winner", Pace(2.0, 8)), None, None, 1, True)
    assert (
        predicted.startswith("predicted wall time of 1 epoch over 100 samples") and "predicted 2 samples/s" in predicted
    )
    assert "$" not in predicted  # no price, no cost


def test_the_note_of_a_pass_before_training_says_its_seconds_samples_and_run_in_no_trainers_words():
    """The trial table's note of the trainer's pass before training (``TrialResult.setup_pass_s``): its
    figures, each named, and nothing of what the pass is (a trainer's; the row's config says its lever)."""
    result = TrialResult("ok", setup_pass_s=9.31, setup_pass_samples=40, run_passes=3.0)
    assert (
        setup_pass_note(result) == "rates count its 9.3 s pass before training over 40 samples, over a run of 3 passes"
    )
    assert setup_pass_note(TrialResult("ok")) is None


def test_a_pass_before_training_is_counted_once_over_the_run_whatever_run_its_rate_was_recorded_for():
    """DPO's precomputed reference: a trial's rates count the pass over the run it was searched for
    (over_the_run); the projection of any other run takes the steps' own rate back and the pass once."""
    step_rate, setup, samples = 4.0, 0.5, 100  # samples/s in steps; 0.5 s a sample of the data, once
    recorded = over_the_run(step_rate, setup, 3.0)  # searched for 3 epochs
    assert recorded < step_rate
    result = TrialResult(
        "ok",
        samples_per_s=recorded,
        measured_steps=5,
        measured_s=10.0,
        setup_pass_s=setup * 40,
        setup_pass_samples=40,
        run_passes=3.0,
    )
    pace = Pace.measured(result, recorded, 8, packed_samples=False)
    assert pace.samples_per_s == pytest.approx(step_rate)
    for epochs in (1.0, 3.0, 10.0):
        projected = projected_seconds(run_length({}, epochs), samples, pace)
        assert projected == pytest.approx(samples * epochs / step_rate + samples * setup)
    assert projected_seconds(run_length({}, 3.0), samples, pace) == pytest.approx(samples * 3.0 / recorded)
    # Under max_steps the pass still covers the data once; its passes are the samples the steps take over it.
    assert passes_over_data(run_length({"max_steps": 50}, None), 8, samples) == pytest.approx(4.0)
    assert over_the_run(step_rate, 0.0, 3.0) == step_rate
