"""The early-stop rule (autotune.spec.measure.clearly_slower): when measured steps put a trial
clearly below the pruning threshold. No timing: step times are given."""

from __future__ import annotations

from autotune.spec.measure import PRUNE_NOISE_FLOOR, MeasureSettings, clearly_slower

SETTINGS = MeasureSettings(warmup_steps=3, min_steps=8, max_steps=40, prune_after_steps=3)


def test_a_trial_at_a_tenth_of_the_bar_is_stopped_by_its_first_measured_step():
    # 8 samples per 1 s step: 8 samples/s against a bar of 80.
    assert clearly_slower([1.0], 8.0, 80.0, 0.05, SETTINGS)


def test_one_step_stops_nothing_within_the_noise_of_the_bar():
    # 9 samples/s against a bar of 10: below it, but within 3 step-time CVs of 5 % (x 1.15).
    assert not clearly_slower([1.0], 9.0, 10.0, 0.05, SETTINGS)
    assert not clearly_slower([1.0, 1.0], 9.0, 10.0, 0.05, SETTINGS)
    # From prune_after_steps steps on, the median is judged against the bar as it is.
    assert clearly_slower([1.0, 1.0, 1.0], 9.0, 10.0, 0.05, SETTINGS)


def test_the_noise_allowed_is_the_best_trials_cv_at_least_the_floor():
    # 5 samples/s against 10: stopped at once with a CV of 10 % (x 1.3), not with 40 % (x 2.2).
    assert clearly_slower([1.0], 5.0, 10.0, 0.10, SETTINGS)
    assert not clearly_slower([1.0], 5.0, 10.0, 0.40, SETTINGS)
    # A CV below the floor (or none: one step measured) counts as the floor.
    assert clearly_slower([1.0], 8.6, 10.0, 0.0, SETTINGS) == (8.6 * (1 + 3 * PRUNE_NOISE_FLOOR) < 10.0)


def test_a_slow_first_step_of_a_trial_that_can_still_win_stops_nothing():
    # A config at 20 samples/s (bar 10) whose first timed step ran at half speed: one stray step.
    assert not clearly_slower([2.0], 20.0, 10.0, 0.05, SETTINGS)
    # The median of later steps resists it: at prune_after_steps the trial is judged at its speed.
    assert not clearly_slower([2.0, 1.0, 1.0], 20.0, 10.0, 0.05, SETTINGS)
    assert not clearly_slower([], 20.0, 10.0, 0.05, SETTINGS)
