"""Early stop: a trial measured clearly below the best feasible one is stopped and recorded as pruned."""

from __future__ import annotations

import dataclasses

import pytest
from optuna.trial import TrialState

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.spec.measure import MeasureSettings
from tests.support.cli import REPO, run_cli_in_process

GiB = 1024**3


@pytest.fixture
def study_and_request(sqlite_url, tiny_workload, tmp_path):
    from autotune.space import SearchSpace
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study

    request = SearchRequest(
        workload=tiny_workload(
            measure=MeasureSettings(
                warmup_steps=1, min_steps=4, max_steps=6, max_seconds=60.0, cv_target=0.0, prune_after_steps=2
            )
        ),
        space=SearchSpace(choices={"micro_batch": [8, 16], "pin_memory": [False]}),
        work_root=str(tmp_path / "runs"),
        prune_ratio=0.5,
        screen=False,
    )
    study = open_study(open_storage(sqlite_url), "prune", request)
    return study, request


def tell_measured(study, request, status: str, samples_per_s: float) -> None:
    """Record the next queued trial as finished with this result, as the search would."""
    from autotune.study._record import tell

    trial = study.ask(request.space.distributions())
    tell(
        study,
        trial,
        TrialResult(
            status=status,
            samples_per_s=samples_per_s,
            model_tflops=samples_per_s * 1e-4,
            peak_memory_bytes=GiB,
            ceiling_bytes=8 * GiB if status == "ok" else GiB // 2,
            step_time_cv=0.07,
        ),
    )


def test_the_threshold_is_the_best_feasible_throughput_times_the_ratio(study_and_request):
    from autotune.study._loop import make_job, prune_threshold

    study, request = study_and_request
    assert prune_threshold(study, 0.5) == (None, 0.0)  # nothing feasible yet: never prune
    tell_measured(study, request, "ok", 100.0)
    tell_measured(study, request, "over_ceiling", 900.0)  # fast, but does not fit: not the bar
    assert prune_threshold(study, 0.5) == (pytest.approx(50.0), pytest.approx(0.07))  # the best trial's step CV
    assert prune_threshold(study, 0.0) == (None, 0.0)  # --prune-ratio 0 disables it
    job = make_job(request, TrialConfig(micro_batch=16, pin_memory=False), 7, *prune_threshold(study, 0.5))
    assert job.prune_below_samples_per_s == pytest.approx(50.0) and job.prune_step_noise == pytest.approx(0.07)


@pytest.mark.slow
def test_a_trial_clearly_slower_than_the_best_is_stopped_and_recorded_as_pruned(study_and_request):
    from autotune.study import SearchProgress
    from autotune.study._loop import run_one_trial

    study, request = study_and_request
    # A recorded best no bert-tiny trial on this CPU comes near: every new trial is clearly slower.
    tell_measured(study, request, "ok", 1e9)
    result = run_one_trial(study, request, SearchProgress())
    trial = study.get_trials()[-1]
    assert result.status == "pruned" and trial.state == TrialState.PRUNED
    # Stopped after its first timed step (warm-up excluded): far below the bar, one step says so.
    assert result.measured_steps == 1 < request.workload.measure.prune_after_steps
    assert result.warmup_steps == request.workload.measure.warmup_steps
    assert len(result.step_times_s) == 1 and result.measured_s == pytest.approx(result.step_times_s[0])
    assert result.samples_per_s > 0 and result.peak_memory_bytes > 0  # what it measured is kept
    assert trial.system_attrs["constraints"][0] <= 0  # it fit: pruned for speed, not memory


@pytest.mark.slow
def test_with_ratio_zero_the_same_trial_runs_to_the_end(study_and_request):
    from autotune.study import SearchProgress
    from autotune.study._loop import run_one_trial

    study, request = study_and_request
    tell_measured(study, request, "ok", 1e9)
    result = run_one_trial(study, dataclasses.replace(request, prune_ratio=0.0), SearchProgress())
    assert result.status == "ok" and result.measured_steps == request.workload.measure.max_steps


def test_the_cli_refuses_a_ratio_outside_0_to_1(tmp_path):
    out = run_cli_in_process(
        "search",
        "--model",
        "bert-tiny",
        "--device",
        "cpu",
        "--space",
        str(REPO / "search_spaces" / "tiny-test.yaml"),
        "--storage",
        f"sqlite:///{tmp_path / 'a.db'}",
        "--prune-ratio",
        "1.5",
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "autotune: error: --prune-ratio 1.5: give a fraction from 0 (never prune) up to, not including, 1"
    ]
