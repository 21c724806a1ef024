"""What travels to a trial child (autotune.runner._job): the workload, its one factory for tests and
scripts, and the dtype whose peak bounds a trial's matmuls."""

from __future__ import annotations

import pytest

from autotune.errors import AutotuneError
from autotune.levers import TrialConfig
from autotune.runner import TrialJob, Workload
from autotune.runner._job import trial_memory_prior
from autotune.spec.devices import known_gpu
from autotune.spec.measure import MeasureSettings
from autotune.spec.models import resolve_model

GiB = 1024**3


def test_for_model_resolves_a_name_and_trains_on_this_machines_cpu(cpu):
    workload = Workload.for_model("gpt2-tiny", seq_len=64, ceiling_bytes=2 * GiB)
    assert workload.model == resolve_model("gpt2-tiny")
    assert workload.device == cpu
    assert (workload.seq_len, workload.ceiling_bytes) == (64, 2 * GiB)
    assert workload.measure == MeasureSettings() and workload.base_args == {} and workload.callbacks == ()


def test_for_model_takes_a_spec_a_device_and_any_other_field(bert_tiny):
    h100 = known_gpu("h100-sxm").device()
    measure = MeasureSettings(warmup_steps=1, max_steps=4)
    workload = Workload.for_model(
        bert_tiny,
        device=h100,
        seq_len=32,
        ceiling_bytes=GiB,
        measure=measure,
        base_args={"seed": 7},
        callbacks=("a.b:C",),
    )
    assert workload == Workload(
        model=bert_tiny,
        device=h100,
        seq_len=32,
        ceiling_bytes=GiB,
        memory_prior=trial_memory_prior(h100, workload.allocator_env, 1),  # the device's prior, built once
        measure=measure,
        base_args={"seed": 7},
        callbacks=("a.b:C",),
    )


def test_for_model_refuses_a_model_it_cannot_resolve_as_the_command_line_does():
    with pytest.raises(AutotuneError, match="not-a-model"):
        Workload.for_model("not-a-model", seq_len=32, ceiling_bytes=GiB)
    with pytest.raises(TypeError):
        Workload.for_model("bert-tiny", seq_len=32, ceiling_bytes=GiB, not_a_field=1)


def test_the_workload_predicts_the_tf32_peak_for_fp32_with_compile(tiny_workload):
    workload = tiny_workload(device=known_gpu("h100-sxm").device(), ceiling_bytes=GiB)
    assert workload.peak_dtype(TrialConfig(dtype="fp32", compile="inductor")) == "tf32"
    assert workload.peak_dtype(TrialConfig(dtype="fp32")) == "fp32"
    assert workload.peak_dtype(TrialConfig(dtype="bf16", compile="inductor")) == "bf16"


def test_a_job_uses_the_calibrated_peak_of_the_dtype_its_matmuls_run_in(tiny_workload, tmp_path):
    workload = tiny_workload(measured_peaks_tflops={"fp32": 1.5, "bf16": 4.0})
    bf16 = TrialJob(workload=workload, config=TrialConfig(dtype="bf16"), work_dir=str(tmp_path))
    assert bf16.measured_peak_tflops == 4.0
    assert TrialJob(workload=workload, config=TrialConfig(), work_dir=str(tmp_path)).measured_peak_tflops == 1.5
    uncalibrated = TrialJob(workload=tiny_workload(), config=TrialConfig(dtype="bf16"), work_dir=str(tmp_path))
    assert uncalibrated.measured_peak_tflops is None  # never invented
    assert bf16.log_path == f"{tmp_path}/child.log"
