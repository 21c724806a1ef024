"""Where a search's wall time went (autotune.result.TimeSpent): each trial's seconds in their place."""

from __future__ import annotations

import pytest

from autotune.result import TimeSpent, TrialResult


def ran(status: str, wall_s: float, measured_s: float = 0.0, warmup_s: float = 0.0) -> TrialResult:
    return TrialResult(status=status, wall_s=wall_s, measured_s=measured_s, warmup_s=warmup_s)


def test_each_trials_seconds_land_in_one_place_and_the_rest_is_other():
    results = [
        ran("ok", wall_s=20.0, measured_s=12.0, warmup_s=3.0),  # 5 s of start-up and the trial's end
        ran("over_ceiling", wall_s=10.0, measured_s=6.0, warmup_s=2.0),
        ran("pruned", wall_s=4.0, measured_s=0.5, warmup_s=2.0),  # all of it counts as pruned
        ran("screened", wall_s=0.0),
        ran("oom", wall_s=3.0),  # ran out of memory before a measured step: all start-up
        ran("interrupted", wall_s=7.0, measured_s=5.0),  # queued to run again: not a trial of this search
    ]
    reruns = [ran("ok", wall_s=8.0, measured_s=5.0, warmup_s=1.0) for _ in range(4)]
    spent = TimeSpent.of_search(results, wall_s=100.0, confirmation_s=30.0, reruns=reruns)
    assert (spent.measured_s, spent.warmup_s, spent.startup_s) == (18.0, 5.0, 5.0 + 2.0 + 3.0)
    assert (spent.pruned_s, spent.confirmation_s, spent.confirmation_measured_s) == (4.0, 30.0, 20.0)
    assert (spent.trials, spent.pruned, spent.screened, spent.confirmation_runs) == (3, 1, 1, 4)
    assert spent.other_s == pytest.approx(100.0 - 18.0 - 5.0 - 10.0 - 4.0 - 30.0)
    assert spent.line() == (
        "time: 1 min 40 s in all: measured steps 18% (3 trials), warm-up and compile 5%, process start-up and "
        "model build 10%, pruned trials 4% (1), confirmation 30% (4 re-runs, 20% in measured steps), screening and "
        "other 33% (1 screened)"
    )
    assert TimeSpent.from_dict(spent.to_dict()) == spent


def test_a_search_that_ran_nothing_says_so_without_dividing_by_zero():
    assert TimeSpent.of_search([], wall_s=0.0).line() == (
        "time: 0 s in all: measured steps 0% (0 trials), warm-up and compile 0%, process start-up and model build "
        "0%, pruned trials 0% (0), confirmation 0% (0 re-runs), screening and other 0%"
    )


def test_a_trial_that_failed_for_good_is_its_own_share_not_start_up():
    """A timeout's whole budget (a TRL default in emulated bf16: 420 s, killed while stepping) was counted as
    process start-up and model build (73 % of a 10-minute search); it is the failed trials' share now."""
    results = [
        ran("timeout", wall_s=420.0),
        ran("ok", wall_s=100.0, measured_s=30.0, warmup_s=30.0),
        ran("crash", wall_s=10.0),
    ]
    spent = TimeSpent.of_search(results, wall_s=600.0)
    assert (spent.failed_s, spent.failed, spent.startup_s, spent.trials) == (430.0, 2, 40.0, 1)
    assert "process start-up and model build 7%, pruned trials 0% (0), failed trials 72% (2)," in spent.line()
    assert spent.other_s == pytest.approx(600.0 - 30.0 - 30.0 - 40.0 - 430.0)
