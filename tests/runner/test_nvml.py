"""NVML readings a trial child takes (autotune.runner._nvml): a cross-check, never a reason to fail a
trial. On a machine without an NVIDIA driver both readings are ``None``; the readings on a GPU, a
container and a MIG slice are driven through ``FakeNvml`` in tests/runner/test_cuda_fakes.py."""

from __future__ import annotations

import os

import pytest

from autotune.runner._nvml import nvml_device_used_bytes, nvml_process_used_bytes


def nvml_answers() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount() > 0
    except Exception:  # noqa: BLE001 - no library, no driver, no device
        return False


def test_without_nvml_the_readings_are_none_and_nothing_is_raised(monkeypatch):
    if nvml_answers():
        pytest.skip("an NVIDIA driver answers here: the readings are real numbers")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert nvml_device_used_bytes() is None
    assert nvml_process_used_bytes(os.getpid()) is None


def test_on_a_gpu_the_device_reading_is_a_byte_count(monkeypatch):
    if not nvml_answers():
        pytest.skip("no NVIDIA driver answers here (the GPU path is driven by FakeNvml in test_cuda_fakes.py)")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    used = nvml_device_used_bytes()
    assert used is not None and used > 0
