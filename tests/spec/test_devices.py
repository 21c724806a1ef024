"""Datasheet peaks by GPU name, and the dtype whose peak applies (the memory probes: tests/runner/test_memory_probe.py)."""

from __future__ import annotations

import pytest

from autotune.spec.devices import (
    KNOWN_GPUS,
    DeviceSpec,
    cpu_device,
    cpu_flags,
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


def test_the_cpu_flags_are_those_of_proc_cpuinfo_and_say_whether_bf16_runs_in_hardware():
    with open("/proc/cpuinfo") as f:
        flags_line = next(line for line in f if line.split(":")[0].strip() in ("flags", "Features"))
    listed = set(flags_line.split(":", 1)[1].split())
    cpu = cpu_device()
    assert cpu.cpu_flags == listed and len(listed) > 3
    native = bool({"avx512_bf16", "amx_bf16", "bf16"} & listed)
    assert cpu.has_matmul_hardware("bf16") == native
    assert cpu.emulated_dtypes == (() if native else ("bf16",))
    assert cpu.fast_dtypes == (("fp32", "bf16") if native else ("fp32",))
    assert cpu.has_matmul_hardware("fp32")


@pytest.mark.parametrize(
    ("text", "bf16", "fp16"),
    [
        ("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n", False, False),  # an AVX2 EPYC (Zen 3)
        ("flags\t\t: avx2 avx512f avx512_bf16\n", True, False),  # Zen 4, Cooper Lake
        ("flags\t\t: avx512f amx_tile amx_int8\n", False, False),  # tiles without bf16 tiles: not counted
        ("flags\t\t: avx512f amx_tile amx_bf16 amx_fp16 avx512_fp16\n", True, True),  # Granite Rapids
        ("processor\t: 0\nFeatures\t: fp asimd asimdhp bf16 sve\n", True, True),  # an Armv8.6 core
        ("", False, False),  # nothing readable: nothing claimed
    ],
)
def test_half_precision_hardware_is_read_from_the_flags(tmp_path, text, bf16, fp16):
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    spec = DeviceSpec("cpu", None, "fake cpu", GiB, ("fp32", "bf16"), cpu_flags=cpu_flags(str(path)))
    assert spec.has_matmul_hardware("bf16") == bf16
    assert spec.has_matmul_hardware("fp16") == fp16
    assert ("emulated" in spec.emulation_reason("bf16")) == (not bf16)


def test_half_precision_hardware_on_cuda_follows_the_compute_capability():
    by_key = {gpu.key: gpu.device() for gpu in KNOWN_GPUS}
    v100, a100, h100 = by_key["v100-16gb"], by_key["a100-80gb"], by_key["h100-sxm"]
    assert (v100.has_matmul_hardware("fp16"), v100.has_matmul_hardware("bf16")) == (True, False)
    assert (a100.has_matmul_hardware("fp16"), a100.has_matmul_hardware("bf16")) == (True, True)
    assert h100.fast_dtypes == h100.supported_dtypes and not h100.emulated_dtypes
    pascal = DeviceSpec("cuda", 0, "fake P100", 16 * GiB, ("fp32",), (6, 0))
    assert not pascal.has_matmul_hardware("fp16") and not pascal.has_matmul_hardware("bf16")
