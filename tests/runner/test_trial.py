"""The trial body: what the child runs around ``Trainer.train()``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, run_isolated


@pytest.mark.slow
def test_a_trial_trains_with_the_collector_as_a_plain_run_has_it(tmp_path, tiny_workload):
    # Skipping the start collection (hiding the import heap with gc.freeze) changed how the measured
    # steps page-faulted and made them slower than a plain run's (docs/benchmarks.md, Isolation).
    job = TrialJob(
        workload=tiny_workload(callbacks=("tests.support.faults:RecordCollectorState",)),
        config=TrialConfig(micro_batch=8, pin_memory=False),
        work_dir=str(tmp_path / "trial"),
    )
    result = run_isolated(job, timeout_s=120)
    assert result.status == "ok", result.error
    record = json.loads(Path(job.work_dir, "collector.json").read_text())
    assert record["frozen_at_full_collections"], "Trainer.train() ran no full collection before the first step"
    assert set(record["frozen_at_full_collections"]) == {0}  # it walked the whole heap, as in a plain run
    assert record["frozen_at_first_step"] == 0


@pytest.mark.slow
def test_a_losing_trial_stops_after_its_first_timed_step(tmp_path, tiny_workload):
    from autotune.spec.measure import MeasureSettings

    settings = MeasureSettings(warmup_steps=2, min_steps=4, max_steps=8, max_seconds=60.0, cv_target=0.0)
    config = TrialConfig(micro_batch=8, pin_memory=False)
    # A best no bert-tiny trial on any CPU comes near: this trial is losing from its first timed step.
    losing = TrialJob(
        workload=tiny_workload(measure=settings),
        config=config,
        work_dir=str(tmp_path / "losing"),
        prune_below_samples_per_s=1e9,
        prune_step_noise=0.3,
    )
    result = run_isolated(losing, timeout_s=120)
    assert result.status == "pruned", result.error
    assert result.warmup_steps == 2 and result.measured_steps == 1 and len(result.step_times_s) == 1
    assert result.samples_per_s == 8 / result.step_times_s[0]  # the rate it measured is kept
    # The same config without a bar runs its measurement to the end.
    free = TrialJob(workload=tiny_workload(measure=settings), config=config, work_dir=str(tmp_path / "free"))
    assert run_isolated(free, timeout_s=120).measured_steps == settings.max_steps
