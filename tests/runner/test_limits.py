"""What bounds a trial child (autotune.runner._limits): its environment before CUDA starts, its
allocator settings, and its address space on the CPU, enforced by the kernel in a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from autotune.runner import child_address_space_budget, child_environment
from autotune.runner._limits import allocator_settings, apply_allocator_env, ranks_environment

GiB = 1024**3

# A process that caps its own address space, then asks for more than the cap allows.
OVER_THE_BUDGET = """
import sys
from autotune.runner._limits import limit_address_space
limit_address_space(256 * 2**20)
small = bytearray(64 * 2**20)  # within the budget: allocated
try:
    big = bytearray(1024 * 2**20)
except MemoryError:
    print("MemoryError")
"""


def test_a_cpu_child_sees_no_gpu(cpu):
    assert child_environment(cpu) == {
        "CUDA_VISIBLE_DEVICES": "",
        "DISABLE_KUBEFLOW_INTEGRATION": "TRUE",
        "HF_HUB_DISABLE_TELEMETRY": "1",  # TRL's SFTTrainer sends telemetry unless told not to
    }


def test_a_trial_inside_a_kubeflow_job_reports_nothing_to_its_controller(cpu, tmp_path, monkeypatch):
    """Inside a Kubeflow TrainJob, TrainingArguments adds the kubeflow reporter to any report_to, "none"
    included: the child's environment turns that off, and the real TrainingArguments then reports nowhere."""
    from transformers import TrainingArguments

    monkeypatch.setenv("KUBEFLOW_TRAINER_SERVER_URL", "https://192.0.2.1:8443")  # as the job's controller injects it
    # An in-process trial pool earlier in this test process may have set the switch in os.environ already.
    monkeypatch.delenv("DISABLE_KUBEFLOW_INTEGRATION", raising=False)
    assert (
        "kubeflow" in TrainingArguments(output_dir=str(tmp_path), report_to="none").report_to
    )  # what a trial would do
    for name, value in child_environment(cpu, str(tmp_path / "runs" / "trial-0-1")).items():
        monkeypatch.setenv(name, value)
    assert TrainingArguments(output_dir=str(tmp_path), report_to="none").report_to == []


def test_a_multi_rank_trial_sees_its_own_gpus_or_its_share_of_the_cores(cpu, monkeypatch, tmp_path):
    import dataclasses

    from autotune.spec.devices import known_gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fake_gpu = dataclasses.replace(known_gpu("h100-sxm").device(), index=4)  # FakeGpu: no CUDA device here
    cuda = ranks_environment(fake_gpu, 4, (4, 5, 6, 7), str(tmp_path / "trial"), cpu_count=16)
    assert cuda["CUDA_VISIBLE_DEVICES"] == "4,5,6,7" and "OMP_NUM_THREADS" not in cuda
    on_cpu = ranks_environment(cpu, 3, (), str(tmp_path / "trial"), cpu_count=16)
    assert on_cpu["CUDA_VISIBLE_DEVICES"] == "" and on_cpu["OMP_NUM_THREADS"] == "5"
    assert ranks_environment(cpu, 4, (), str(tmp_path / "trial"), cpu_count=2)["OMP_NUM_THREADS"] == "1"


def test_the_budget_is_generous_above_the_ceiling_but_never_past_90_percent_of_what_is_available():
    assert child_address_space_budget(GiB, 64 * GiB) == 3 * GiB  # at least 2 GiB above a small ceiling
    assert child_address_space_budget(8 * GiB, 64 * GiB) == 12 * GiB  # half again above a large one
    assert child_address_space_budget(8 * GiB, 10 * GiB) == 9 * GiB  # the host's memory bounds it


@pytest.mark.slow
def test_a_child_over_its_address_space_budget_gets_a_memory_error_not_the_oom_killer():
    completed = subprocess.run(
        [sys.executable, "-c", OVER_THE_BUDGET],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip() == "MemoryError"


def test_the_allocator_settings_are_read_from_the_environment_and_applied_exactly(monkeypatch):
    assert allocator_settings(
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_CUDA_ALLOC_CONF": "", "PATH": "/bin"}
    ) == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
    monkeypatch.setenv(
        "PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.6"
    )  # what a forkserver may have inherited
    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    apply_allocator_env({"PYTORCH_ALLOC_CONF": "expandable_segments:True"})
    assert allocator_settings() == {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}  # the inherited one is gone
