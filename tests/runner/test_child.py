"""The trial child's set-up (autotune.runner._child), read from inside a real child: its own session,
the environment of its device, the workload's allocator settings, its output in its log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, run_isolated

pytestmark = pytest.mark.slow


def test_the_child_runs_in_its_own_session_with_its_devices_environment_and_logs_its_output(
    tmp_path, tiny_workload, monkeypatch
):
    from tests.support.probes import CHILD_SETUP_FILE

    # What the orchestrator's environment holds is not what the child trains under: the workload's settings are.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6")
    job = TrialJob(
        workload=tiny_workload(
            allocator_env={"PYTORCH_ALLOC_CONF": "expandable_segments:False"},
            callbacks=("tests.support.probes:RecordChildSetup",),
        ),
        config=TrialConfig(micro_batch=8, pin_memory=False),
        work_dir=str(tmp_path / "trial"),
    )
    result = run_isolated(job, timeout_s=180)
    assert result.status == "ok", result.error
    record = json.loads(Path(job.work_dir, CHILD_SETUP_FILE).read_text())
    # It leads its own session and process group: killing the group kills its workers, and a
    # Ctrl-C in the terminal reaches only the orchestrator.
    assert record["sid"] == record["pgid"] == record["pid"] != os.getpid()
    assert os.getsid(0) != record["sid"]
    # Its DataLoader workers start as a plain `python` run's do (the platform's default start method),
    # not through a new forkserver that imports torch from scratch (seconds per trial: issue 29).
    fresh = subprocess.run(
        [sys.executable, "-c", "import multiprocessing; print(multiprocessing.get_start_method())"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert record["start_method"] == fresh.stdout.strip()
    assert record["env"] == {
        "CUDA_VISIBLE_DEVICES": "",
        "PYTORCH_ALLOC_CONF": "expandable_segments:False",
        "PYTORCH_CUDA_ALLOC_CONF": None,
    }
    assert "printed by the trial child" in Path(job.log_path).read_text()
