"""Every trial records its predicted peak when it is proposed, the prior's and the calibrated one, and the
results table shows it beside the measured peak (issue 23, point 9): not only screened trials, which never run;
and the throughput prior's predicted speed, beside the speed it measured (issue 40, point 6)."""

from __future__ import annotations

import pytest

from autotune.estimate import estimate_peak
from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.storage import schema
from autotune.units import GiB, KiB, MiB
from autotune.views.trial_table import trial_cells

pytestmark = pytest.mark.slow


def test_each_trial_that_ran_records_the_prior_and_the_calibrated_prediction_beside_its_peak(
    tmp_path, sqlite_url, tiny_workload
):
    from autotune.space import SearchSpace
    from autotune.storage import open_storage
    from autotune.study import SearchProgress, SearchRequest, open_study
    from autotune.study._loop import run_one_trial

    workload = tiny_workload()
    request = SearchRequest(
        workload=workload,
        space=SearchSpace(choices={"micro_batch": [8, 16], "pin_memory": [False]}),
        work_root=str(tmp_path / "runs"),
        screen=False,  # both run: what is recorded for a trial that runs is the point
        prune_ratio=0,  # and both run to the end: a loaded machine may slow the second below half the first
    )
    study = open_study(open_storage(sqlite_url), "predicted", request)
    run_one_trial(study, request, SearchProgress())
    run_one_trial(study, request, SearchProgress())
    first, second = study.get_trials()
    for trial in (first, second):
        config = TrialConfig.from_params(trial.params)
        result = TrialResult.from_trial(trial)
        assert result.status == "ok" and result.peak_memory_bytes > 0
        prior = estimate_peak(workload.model, config, workload.seq_len, workload.memory_prior).total_bytes
        assert trial.user_attrs[schema.TRIAL_PRIOR_PEAK_BYTES] == prior
        predicted = trial.user_attrs[schema.TRIAL_PREDICTED_PEAK_BYTES]
        assert result.memory_peaks[schema.TRIAL_PREDICTED_PEAK_BYTES] == predicted
        assert result.memory_peaks[schema.TRIAL_PRIOR_PEAK_BYTES] == prior
        # The throughput prior's real tokens/s too, as `autotune estimate` predicts it: one prediction a trial.
        speed = workload.speed_model().estimate(workload.model, config, workload.seq_len)
        assert speed is not None and trial.user_attrs[schema.TRIAL_PRIOR_TOKENS_PER_S] == speed.tokens_per_s > 0
        peak_cell = trial_cells(trial.number, config, result)[7]
        # Measured over predicted, in one unit (views.trial_table.peak_cell).
        measured_line, predicted_line = peak_cell.splitlines()
        measured_figure, unit = measured_line.split()
        size = {"GiB": GiB, "MiB": MiB, "KiB": KiB}[unit]
        assert predicted_line == f"pred {predicted / size:.2f} {unit}"
        assert float(measured_figure) == round(result.peak_memory_bytes / size, 2)
    # Before any measurement the calibrated figure is the prior; after one, it is fitted on it.
    assert first.user_attrs[schema.TRIAL_PREDICTED_PEAK_BYTES] == first.user_attrs[schema.TRIAL_PRIOR_PEAK_BYTES]
    assert second.user_attrs[schema.TRIAL_PREDICTED_PEAK_BYTES] != second.user_attrs[schema.TRIAL_PRIOR_PEAK_BYTES]
