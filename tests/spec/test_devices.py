"""Datasheet peaks by GPU name, and the dtype whose peak applies (the memory probes: tests/runner/test_memory_probe.py)."""

from __future__ import annotations

import pytest

from autotune.spec.devices import (
    DeviceSpec,
    datasheet_entry,
    datasheet_peak_tflops,
    list_devices,
    matmul_dtype,
)
from autotune.units import GiB


@pytest.mark.parametrize(
    ("nvml_name", "label", "bf16", "tf32", "fp32"),
    [
        ("Tesla V100-SXM2-32GB", "V100 SXM2", None, None, 15.7),
        ("Tesla V100-PCIE-16GB", "V100 PCIe", None, None, 14.0),
        ("NVIDIA A100-SXM4-80GB", "A100", 312.0, 156.0, 19.5),
        ("NVIDIA A100 80GB PCIe", "A100", 312.0, 156.0, 19.5),
        ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.0, 494.5, 67.0),
        ("NVIDIA H100 PCIe", "H100 PCIe", 756.0, 378.0, 51.0),
        ("NVIDIA H200", "H200 SXM", 989.0, 494.5, 67.0),
        ("NVIDIA L4", "L4", 121.0, 60.0, 30.3),
        ("NVIDIA A10G", "A10G", 125.0, 62.5, 31.2),
        ("NVIDIA GeForce RTX 3090", "RTX 3090", 71.0, 35.6, 35.6),
        ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2, 82.6, 82.6),
    ],
)
def test_datasheet_table_knows_the_common_gpus(nvml_name, label, bf16, tf32, fp32):
    entry = datasheet_entry(nvml_name)
    assert entry is not None and entry.label == label
    assert datasheet_peak_tflops(nvml_name, "bf16") == bf16
    assert datasheet_peak_tflops(nvml_name, "tf32") == tf32
    assert datasheet_peak_tflops(nvml_name, "fp32") == fp32


@pytest.mark.parametrize(
    "nvml_name",
    # Siblings with other clocks or SM counts must not borrow a neighbour's peak.
    [
        "NVIDIA L40S",
        "NVIDIA L40",
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA A10",
        "NVIDIA A100X",
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA GeForce RTX 4090 D",
        "Tesla T4",
        "NVIDIA H100",
    ],
)
def test_unknown_gpus_get_no_peak(nvml_name):
    assert datasheet_entry(nvml_name) is None
    assert all(datasheet_peak_tflops(nvml_name, dtype) is None for dtype in ("fp32", "tf32", "fp16", "bf16"))


def test_a_cpu_has_no_datasheet_peak_even_if_its_name_looks_like_a_gpu(cpu):
    assert cpu.datasheet_peak_tflops("fp32") is None
    lookalike = DeviceSpec(
        kind="cpu", index=None, name="Intel L4 lookalike", total_memory_bytes=GiB, supported_dtypes=("fp32",)
    )
    assert lookalike.datasheet_peak_tflops("fp32") is None and lookalike.datasheet_entry() is None
    assert list_devices()[0].kind == "cpu"


def test_peak_dtype_follows_what_the_matmuls_run_in():
    assert matmul_dtype("bf16") == "bf16"
    assert matmul_dtype("fp16", tf32_enabled=True) == "fp16"
    assert matmul_dtype("fp32") == "fp32"
    assert matmul_dtype("fp32", tf32_enabled=True) == "tf32"
    assert matmul_dtype("tf32") == "tf32"
