"""Measuring a device's matmul peak (``autotune devices --calibrate``): on the CPU for real."""

from __future__ import annotations

import pytest

from autotune.errors import AutotuneError
from autotune.runner import calibrate_device, measure_matmul_peak


def test_measure_matmul_peak_on_the_cpu():
    peak = measure_matmul_peak("cpu", "fp32", matrix_size=128, seconds=0.05)
    assert peak.dtype == "fp32" and peak.matrix_size == 128
    assert peak.iterations >= 3
    assert 0 < peak.median_tflops <= peak.tflops


def test_calibrate_refuses_a_dtype_the_device_cannot_run(cpu):
    with pytest.raises(AutotuneError, match="cannot run fp16"):
        calibrate_device(cpu, dtypes=("fp16",))


def test_measure_memory_bandwidth_on_the_cpu():
    from autotune.runner import measure_memory_bandwidth

    rate = measure_memory_bandwidth("cpu", nbytes=8 * 2**20, seconds=0.05)
    assert 0.01 < rate < 10_000  # GB/s: a copy of 8 MiB moved at some rate a memory bus can have


def test_the_default_size_is_worked_up_to_within_the_time_a_matmul_may_take():
    """A dtype the CPU only emulates ran one 2048 x 2048 bf16 matmul in a minute on an AVX2 CPU: a one-second
    calibration took six. Towards the default size each step is taken only if its matmul is predicted to fit
    ``seconds / min_iterations``; a size the user gives is timed as given."""
    quick = measure_matmul_peak("cpu", "fp32", seconds=1e-9)  # no step fits: the ramp's first size
    assert quick.matrix_size == 256
    ample = measure_matmul_peak("cpu", "fp32", seconds=2.0, min_iterations=1)  # every step fits (fp32: 0.14 s at 2048)
    assert ample.matrix_size == 2048
    given = measure_matmul_peak("cpu", "fp32", matrix_size=512, seconds=1e-9)
    assert given.matrix_size == 512
