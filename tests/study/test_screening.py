"""Screening: configs known not to fit are recorded, never run, never exported; duplicates are reused."""

from __future__ import annotations

import dataclasses

import pytest
from optuna.trial import TrialState

from autotune.estimate import MemoryFit, estimate_peak
from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.study._screening import (
    UNCALIBRATED_MARGIN,
    MeasuredTrial,
    infer_from_memory_failures,
    margin_for,
    memory_fit_from_trials,
    predict_over_ceiling,
    screened_excess_gib,
)

MiB = 1024**2
GiB = 1024**3


def measured(number: int, config: TrialConfig, status: str, peak: int = 0, ceiling: int = GiB) -> MeasuredTrial:
    return MeasuredTrial(number, config, TrialResult(status=status, peak_memory_bytes=peak, ceiling_bytes=ceiling))


# --- the decisions ------------------------------------------------------------------------------


def test_a_larger_micro_batch_than_a_measured_oom_is_inferred_not_to_fit():
    oom = measured(3, TrialConfig(micro_batch=32), "oom")
    decision = infer_from_memory_failures(TrialConfig(micro_batch=64), [oom])
    assert decision is not None and decision.inferred_from == 3
    assert "trial #3" in decision.reason and "ran out of memory" in decision.reason
    result = decision.to_result(GiB)
    assert result.status == "screened" and result.peak_memory_bytes == 0  # nothing was measured
    assert screened_excess_gib(result) is None  # an OOM says "over", not by how much


@pytest.mark.parametrize(
    "config",
    [
        TrialConfig(micro_batch=16),  # smaller: might fit
        TrialConfig(micro_batch=64, checkpointing=True),  # differs in more than the micro-batch
        TrialConfig(micro_batch=64, grad_accum=2),
        TrialConfig(micro_batch=64, dtype="bf16"),
    ],
)
def test_only_a_larger_micro_batch_with_every_other_knob_equal_is_inferred(config):
    assert infer_from_memory_failures(config, [measured(0, TrialConfig(micro_batch=32), "oom")]) is None


def test_a_config_that_fitted_says_nothing_about_larger_ones():
    fitted = measured(0, TrialConfig(micro_batch=32), "ok", peak=900 * MiB)
    assert infer_from_memory_failures(TrialConfig(micro_batch=64), [fitted]) is None


def test_over_the_ceiling_gives_its_measured_peak_as_a_lower_bound():
    over = measured(5, TrialConfig(micro_batch=32), "over_ceiling", peak=GiB + GiB // 2, ceiling=GiB)
    decision = infer_from_memory_failures(TrialConfig(micro_batch=64), [over])
    assert decision is not None and "went over the ceiling" in decision.reason
    assert screened_excess_gib(decision.to_result(GiB)) == pytest.approx(0.5)


def test_the_margin_is_wide_before_calibration_and_follows_the_fit_after():
    assert margin_for(MemoryFit.prior("cpu")) == UNCALIBRATED_MARGIN == 1.25

    def calibrated(error: float) -> MemoryFit:
        return MemoryFit("cpu", 400 * MiB, 1.1, points=6, max_relative_error=error)

    assert margin_for(calibrated(0.02)) == pytest.approx(1.10)  # never tighter than 10 %
    assert margin_for(calibrated(0.08)) == pytest.approx(1.16)  # twice the fit's worst error
    assert margin_for(calibrated(0.40)) == UNCALIBRATED_MARGIN  # a bad fit is no reason to screen more


def test_the_estimate_screens_only_configs_clearly_over_the_ceiling(bert_tiny):
    estimate = estimate_peak(bert_tiny, TrialConfig(micro_batch=64), 128, MemoryFit.prior("cpu"))
    prior = MemoryFit.prior("cpu")
    predicted = estimate.total_bytes
    assert predict_over_ceiling(estimate, predicted, prior) is None  # fits exactly
    assert predict_over_ceiling(estimate, int(predicted / 1.2), prior) is None  # over, but might fit: run it
    decision = predict_over_ceiling(estimate, int(predicted / 1.3), prior)
    assert decision is not None and decision.predicted_peak_bytes == predicted
    assert "predicted peak" in decision.reason and "not run" in decision.reason
    result = decision.to_result(int(predicted / 1.3))
    assert result.memory_peaks["predicted_peak_bytes"] == predicted
    assert screened_excess_gib(result) == pytest.approx((predicted - int(predicted / 1.3)) / GiB)


def test_the_memory_fit_learns_from_trials_that_measured_a_peak_only(bert_tiny):
    trials = [
        measured(0, TrialConfig(micro_batch=8), "ok", peak=500 * MiB),
        measured(1, TrialConfig(micro_batch=16), "pruned", peak=530 * MiB),
        measured(2, TrialConfig(micro_batch=64), "over_ceiling", peak=700 * MiB),
        measured(3, TrialConfig(micro_batch=128), "oom"),  # no peak: a bound, not a point
    ]
    fit = memory_fit_from_trials(bert_tiny, 128, MemoryFit.prior("cpu"), trials)
    assert fit.points == 3 and fit.max_relative_error is not None


# --- in the real search loop ----------------------------------------------------------------------


@pytest.fixture
def loop(tmp_path, sqlite_url, tiny_workload):
    """A real study in SQLite; ``make`` gives it and its request; ``runs`` lists trial work dirs made."""
    from autotune.space import SearchSpace
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study

    work_root = tmp_path / "runs"

    def make(ceiling_bytes: int, micro_batches: list[int], address_space_bytes: int | None = None, name: str = "s"):
        request = SearchRequest(
            workload=tiny_workload(ceiling_bytes=ceiling_bytes, address_space_bytes=address_space_bytes),
            space=SearchSpace(choices={"micro_batch": micro_batches, "pin_memory": [False]}),
            work_root=str(work_root),
        )
        return open_study(open_storage(sqlite_url), name, request), request

    def runs() -> list[str]:
        return sorted(p.name for p in work_root.iterdir()) if work_root.exists() else []

    return make, runs


def test_configs_predicted_not_to_fit_are_recorded_and_never_run(loop):
    from autotune.errors import AutotuneError
    from autotune.study import SearchBudget
    from autotune.study._loop import run_search
    from autotune.views.export import winner
    from autotune.views.ranking import feasible_ranking

    make, runs = loop
    ceiling = 200 * MiB  # below the CPU process baseline alone: nothing can fit
    study, request = make(ceiling, [8, 16, 32])
    run_search(study, request, SearchBudget(trials=3))
    assert runs() == []  # no child was started
    trials = study.get_trials()
    assert len(trials) == 3
    for trial in trials:
        result = TrialResult.from_trial(trial)
        assert trial.state == TrialState.COMPLETE and trial.value == 0.0
        assert result.status == "screened" and "predicted peak" in result.error
        predicted = result.memory_peaks["predicted_peak_bytes"]  # kept apart: peak_memory_bytes stays 0
        assert result.peak_memory_bytes == 0 and predicted > ceiling * 1.25
        assert trial.system_attrs["constraints"][0] == pytest.approx((predicted - ceiling) / GiB)
    assert feasible_ranking(trials) == []
    with pytest.raises(AutotuneError, match="no feasible trial"):
        winner(study)
    with pytest.raises(ValueError):
        _ = study.best_trial  # Optuna agrees: nothing feasible


@pytest.mark.slow
def test_with_screening_off_every_config_runs(loop):
    import dataclasses

    from autotune.study import SearchProgress
    from autotune.study._loop import run_one_trial

    make, runs = loop
    study, request = make(200 * MiB, [8], name="unscreened")
    result = run_one_trial(study, dataclasses.replace(request, screen=False), SearchProgress())
    assert result.status == "over_ceiling" and result.peak_memory_bytes > 200 * MiB  # it ran and was measured
    assert len(runs()) == 1


@pytest.mark.slow
def test_a_real_oom_screens_the_larger_micro_batch_without_running_it(loop):
    from autotune.study import SearchBudget
    from autotune.study._loop import run_search

    make, runs = loop
    # 64 MiB of address space: the child's allocator fails at once (a real OOM); the ceiling itself
    # is generous, so the estimate screens nothing and only the inference can.
    study, request = make(8 * GiB, [8, 64], address_space_bytes=64 * MiB)
    run_search(study, request, SearchBudget(trials=2))
    # The seeds ran first: the HF default (micro-batch 8), then the best-practice guess (the largest, 64).
    assert [t.params["micro_batch"] for t in study.get_trials()] == [8, 64]
    first, second = (TrialResult.from_trial(t) for t in study.get_trials())
    assert first.status == "oom"
    assert second.status == "screened" and "inferred" in second.error and "trial #0" in second.error
    assert len(runs()) == 1  # the OOM ran; the inferred one did not
    assert study.trials[1].system_attrs["constraints"][0] > 0


def test_a_config_proposed_again_reuses_the_recorded_result_and_asks_again(loop):
    from autotune.study import SearchProgress, measured_trials
    from autotune.study._loop import run_one_trial
    from autotune.study._proposals import SearchFinished

    make, runs = loop
    study, request = make(200 * MiB, [8, 16], name="reuse")
    first = run_one_trial(study, request, SearchProgress())
    study.enqueue_trial({"micro_batch": 8, "pin_memory": False})
    # The repeat is recorded as a copy of trial 0, not as a trial: the sampler is asked again.
    second = run_one_trial(study, request, SearchProgress())
    repeat, new = study.trials[1], study.trials[2]
    assert repeat.user_attrs["reused_from"] == 0 and TrialResult.from_trial(repeat) == first
    assert new.params["micro_batch"] == 16 and TrialResult.from_trial(new) == second
    assert [t.number for t in measured_trials(study)] == []  # screened and reused: nothing measured
    assert runs() == []
    with pytest.raises(SearchFinished, match="every config of the space"):
        run_one_trial(study, request, SearchProgress())


def test_an_offload_config_whose_host_memory_is_over_the_host_ceiling_is_screened(tiny_workload, gpt2_tiny):
    """ZeRO offload's host RAM (exact counts of DeepSpeed's partitions) against --host-memory-ceiling."""
    from autotune.study._screening import host_over_ceiling, screen

    offload = TrialConfig(micro_batch=1, dtype="bf16", zero="2+offload")
    host = estimate_peak(gpt2_tiny, offload, 32, MemoryFit.prior("cpu")).host_bytes
    assert host > 0
    assert screen(offload, tiny_workload(gpt2_tiny, host_ceiling_bytes=host), []) is None
    decision = screen(offload, tiny_workload(gpt2_tiny, host_ceiling_bytes=host - 1), [])
    assert decision is not None and "host memory ceiling" in decision.reason and "swap" in decision.reason
    # Without offload nothing is in host memory: the host ceiling never screens it.
    plain = estimate_peak(gpt2_tiny, TrialConfig(micro_batch=1, dtype="bf16", zero="2"), 32, MemoryFit.prior("cpu"))
    assert plain.host_bytes == 0 and host_over_ceiling(plain, 1) is None


def test_the_host_ceiling_holds_every_rank_of_a_trial_on_one_host(tiny_workload, gpt2_tiny):
    """A trial's ranks each keep their offloaded part in the one host's RAM: 2 ranks need twice one's."""
    from autotune.study._screening import screen

    offload = TrialConfig(micro_batch=1, dtype="bf16", zero="2+offload")
    two_ranks = tiny_workload(gpt2_tiny, devices_per_trial=2)
    per_rank = estimate_peak(gpt2_tiny, offload, 32, two_ranks.memory_prior).host_bytes
    assert per_rank > 0
    fits = dataclasses.replace(two_ranks, host_ceiling_bytes=2 * per_rank)
    assert screen(offload, fits, []) is None
    over = screen(offload, dataclasses.replace(two_ranks, host_ceiling_bytes=2 * per_rank - 1), [])
    assert over is not None and "per rank x 2 ranks" in over.reason and "host memory ceiling" in over.reason


def test_the_host_memory_ceiling_defaults_to_the_available_ram_and_reads_like_the_memory_ceiling():
    from autotune.errors import AutotuneError
    from autotune.spec.ceiling import host_ceiling_bytes

    assert host_ceiling_bytes(None, 8 * 2**30) == 8 * 2**30
    assert host_ceiling_bytes(None, 8 * 2**30, trials_at_once=4) == 2 * 2**30  # trials side by side share it
    assert host_ceiling_bytes("2GiB", 8 * 2**30, trials_at_once=4) == 2 * 2**30  # a given one is each trial's
    assert host_ceiling_bytes("0.5", 8 * 2**30) == 4 * 2**30
    assert host_ceiling_bytes("2GiB", 8 * 2**30) == 2 * 2**30
    with pytest.raises(AutotuneError, match=r"^--host-memory-ceiling '16GiB' is more than the available host RAM's"):
        host_ceiling_bytes("16GiB", 8 * 2**30)
