"""A profiled trial (``TrialJob.profile_steps``, runner/_step_profile.py): torch's profiler over steps after warm-up,
in a real trial child; and the summary's arithmetic (the device's busy time as the union of its kernels)."""

from __future__ import annotations

import gzip
import json
import types

import pytest

from autotune.levers import TrialConfig
from autotune.result import StepProfile, TrialResult


@pytest.mark.slow
def test_a_profiled_trial_says_where_its_steps_went_and_leaves_the_table_and_trace_beside_its_log(
    tiny_workload, tmp_path
):
    from autotune.runner import TrialJob, run_isolated
    from autotune.spec.measure import MeasureSettings

    measure = MeasureSettings(warmup_steps=1, min_steps=3, max_steps=3, max_seconds=30.0, cv_target=0.0)
    job = TrialJob(
        tiny_workload(measure=measure), TrialConfig(micro_batch=8, pin_memory=False), str(tmp_path), profile_steps=2
    )
    result = run_isolated(job, timeout_s=300)
    assert result.status == "ok", result.error
    profile = StepProfile.from_dict(result.profile)
    # Two steps after the one of warm-up, though three were measured: the window is the profiler's.
    assert profile.steps == 2 and profile.time_of == "cpu" and profile.device_busy_s is None
    assert 0 < profile.operators_s < profile.wall_s
    names = [op.name for op in profile.top]
    # bert-tiny's step: its linear layers' matmuls, and AdamW's update (the default optimizer, fused on a CPU).
    assert any(name in ("aten::addmm", "aten::mm", "aten::linear") for name in names), names
    assert all("#" not in name for name in names)  # ranges (the optimizer's, the data loader's) are not operators
    assert [op.self_s for op in profile.top] == sorted((op.self_s for op in profile.top), reverse=True)
    assert 0 < profile.share(profile.optimizer_s) < 1 and 0 < profile.share(profile.data_loader_s) < 1
    assert profile.table == str(tmp_path / "profile.txt") and "aten::addmm" in (tmp_path / "profile.txt").read_text()
    trace = json.loads(gzip.decompress((tmp_path / "trace.json.gz").read_bytes()))
    assert any(event.get("name") == "aten::addmm" for event in trace["traceEvents"])
    # A stored result carries it, and a result of the same trial unprofiled carries none.
    assert TrialResult.from_dict(result.to_dict()).profile == result.profile
    unprofiled = run_isolated(TrialJob(job.workload, job.config, str(tmp_path / "plain")), timeout_s=300)
    assert unprofiled.status == "ok" and unprofiled.profile == {}


def _kernel(start: float, end: float):
    import torch

    return types.SimpleNamespace(
        device_type=torch.autograd.DeviceType.CUDA, time_range=types.SimpleNamespace(start=start, end=end)
    )


def _row(key: str, device_us: float, cpu_total_us: float = 0.0, count: int = 1, on_host: bool = True):
    import torch

    device_type = torch.autograd.DeviceType.CPU if on_host else torch.autograd.DeviceType.CUDA
    return types.SimpleNamespace(
        key=key,
        self_device_time_total=device_us,
        self_cpu_time_total=0.0,
        cpu_time_total=cpu_total_us,
        count=count,
        device_type=device_type,
    )


def test_on_cuda_the_device_is_busy_while_any_kernel_runs_and_ranges_are_not_operators():
    """Kernels of two streams overlap: busy is their union (1.4 s of a 2 s window), not their sum (1.65 s); a
    kernel's own row does not count its launching operator's time twice."""
    from autotune.runner._step_profile import summarise

    kernels = [
        _kernel(0, 500_000),
        _kernel(250_000, 1_000_000),
        _kernel(1_000_000, 1_250_000),
        _kernel(1_600_000, 1_750_000),
    ]
    averages = [
        _row("aten::mm", 1_200_000),
        _row("aten::_fused_adamw_", 300_000),
        _row("Optimizer.step#AdamW.step", 0.0, cpu_total_us=100_000),
        _row("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0.0, cpu_total_us=400_000),
        _row("aten::copy_", 0.0),
        # kineto's row of the kernel aten::mm launched: the same time again, not another operator's
        _row("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 1_200_000, on_host=False),
    ]
    profile = summarise(averages, kernels, wall_s=2.0, steps=2, on_device=True)
    assert profile.device_busy_s == pytest.approx(1.4)
    assert profile.host_bound  # 70 % of the window, under HOST_BOUND_BELOW
    assert [op.name for op in profile.top] == ["aten::mm", "aten::_fused_adamw_"]  # no range, nothing at 0
    assert profile.operators_s == pytest.approx(1.5)
    assert profile.optimizer_s == pytest.approx(0.1) and profile.data_loader_s == pytest.approx(0.4)
    assert profile.step_s == pytest.approx(1.0)
    assert StepProfile.from_dict(profile.to_dict()) == profile
