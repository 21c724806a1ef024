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
