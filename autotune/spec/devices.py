"""Devices as the parent sees them: discovery, datasheet peaks, the dtypes each can train in.

The parent reads device facts through NVML only, so it never creates a CUDA context on the GPU it
is measuring. How a trial child measures memory on each device lives with the child, in
:mod:`autotune.runner` (``_memory``, ``_nvml``, ``_limits``).

No API reports a device's peak FLOPS: datasheet peaks are looked up by device name (unknown
devices get none), and ``autotune devices --calibrate`` measures an achievable one
(:mod:`autotune.spec.measured_peaks`).
"""

from __future__ import annotations

import dataclasses
import os
import re

from autotune.errors import AutotuneError
from autotune.spec.nvml_devices import cuda_allocatable_bytes, is_mig_handle, nvml_device_handle, visible_device_id


@dataclasses.dataclass(frozen=True)
class DatasheetEntry:
    """One GPU model's dense datasheet peaks.

    Attributes:
        label: The model as the tables print it (``H100 SXM``).
        pattern: Regular expression matched (case-insensitively) against the NVML device name.
        peaks_tflops: Dense TFLOPS by dtype: ``fp32`` (CUDA cores), ``tf32`` and ``fp16``/``bf16``
            (tensor cores, fp32 accumulate). A dtype the GPU lacks is absent.
        source: Where the figures come from.
        bandwidth_gb_s: Device memory bandwidth, GB/s (10^9 bytes), from the same datasheet; ``None``
            where not listed.
        matmul_fraction: The share of the datasheet peak a large matmul achieves (measured figures in
            docs/facts.md: A100 ~271 of 312, H100 SXM ~795 of 989 bf16 TFLOPS); where none was
            measured, :data:`TYPICAL_MATMUL_FRACTION`.
        nvlink_gb_s: The NVLink bandwidth between GPUs of a board, each direction, GB/s (the datasheet's figure
            counts both directions, halved); ``None`` where the GPUs meet over PCIe. A name with "PCIe" in it
            (an A100's PCIe card) has none whatever its entry says.
    """

    label: str
    pattern: str
    peaks_tflops: dict[str, float]
    source: str
    bandwidth_gb_s: float | None = None
    matmul_fraction: float | None = None
    nvlink_gb_s: float | None = None


# Achievable matmul peaks are typically 80-87 % of datasheet figures on GPUs (docs/facts.md).
TYPICAL_MATMUL_FRACTION = 0.85


# Dense datasheet peaks (without the 2:4 sparsity factor NVIDIA often quotes), figures collected in
# docs/facts.md. Patterns are strict on purpose: a variant with other clocks or SM counts
# (H100 NVL, H200 NVL, L40/L40S, RTX 3090 Ti, RTX 4090 D, A100X) matches nothing and gets no MFU,
# rather than the peak of a sibling. NVML names look like "NVIDIA H100 80GB HBM3" (SXM5),
# "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090".
DATASHEETS: tuple[DatasheetEntry, ...] = (
    DatasheetEntry(
        "V100 SXM2", r"\bV100-SXM2\b", {"fp32": 15.7, "fp16": 125.0}, "NVIDIA Tesla V100 datasheet", 900.0, None, 150.0
    ),
    DatasheetEntry("V100 PCIe", r"\bV100-PCIE\b", {"fp32": 14.0, "fp16": 112.0}, "NVIDIA Tesla V100 datasheet", 900.0),
    DatasheetEntry("V100S PCIe", r"\bV100S\b", {"fp32": 16.4, "fp16": 130.0}, "NVIDIA Tesla V100S datasheet", 1134.0),
    DatasheetEntry(
        "A100",
        r"\bA100\b",
        {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
        "NVIDIA A100 datasheet (SXM4 and PCIe, 40 and 80 GB; bandwidth of the 80 GB SXM4, 1,555 GB/s on the 40 GB;"
        " NVLink 600 GB/s, SXM4)",
        2039.0,
        271 / 312,
        300.0,
    ),
    DatasheetEntry(
        "H100 PCIe",
        r"\bH100 PCIe\b",
        {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
        "NVIDIA H100 datasheet (sparsity figures halved)",
        2000.0,
    ),
    DatasheetEntry(
        "H100 SXM",
        r"\bH100\b(?!.*\bNVL\b).*\b(HBM3|SXM\d?)\b",
        {"fp32": 67.0, "tf32": 494.5, "fp16": 989.0, "bf16": 989.0},
        "NVIDIA H100 datasheet (sparsity figures halved; NVLink 900 GB/s, SXM)",
        3350.0,
        795 / 989,
        450.0,
    ),
    DatasheetEntry(
        "H200 SXM",
        r"\bH200\b(?!.*\bNVL\b)",
        {"fp32": 67.0, "tf32": 494.5, "fp16": 989.0, "bf16": 989.0},
        "NVIDIA H200 datasheet (sparsity figures halved; NVLink 900 GB/s, SXM)",
        4800.0,
        None,
        450.0,
    ),
    DatasheetEntry(
        "L4",
        r"\bL4\b",
        {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
        "NVIDIA L4 datasheet (sparsity figures halved)",
        300.0,
    ),
    DatasheetEntry(
        "A10G",
        r"\bA10G\b",
        {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
        "NVIDIA A10 datasheet (AWS publishes no separate A10G figures)",
        600.0,
    ),
    DatasheetEntry(
        "RTX A6000",
        r"\bRTX A6000\b",
        {"fp32": 38.7, "tf32": 77.4, "fp16": 154.8, "bf16": 154.8},
        "NVIDIA RTX A6000 datasheet (sparsity figures halved; fp16/bf16 tensor with fp32 accumulate)",
        768.0,
    ),
    DatasheetEntry(
        "RTX 3090",
        r"\bRTX 3090\b(?!\s*Ti\b)",
        {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
        "NVIDIA Ampere GA102 whitepaper (fp16/bf16 tensor with fp32 accumulate)",
        936.0,
    ),
    DatasheetEntry(
        "RTX 4090",
        r"\bRTX 4090\b(?!\s*D\b)",
        {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
        "NVIDIA Ada Lovelace whitepaper (fp16/bf16 tensor with fp32 accumulate)",
        1008.0,
    ),
)


@dataclasses.dataclass(frozen=True)
class KnownGpu:
    """A GPU one can plan for without having it (``autotune estimate --gpu-type NAME``).

    Attributes:
        key: The name the command line takes (``v100-16gb``).
        nvml_name: The name NVML gives the GPU; it selects the datasheet peaks of :data:`DATASHEETS`.
        memory_bytes: Device memory as CUDA reports it (``cudaMemGetInfo`` total, the "total
            capacity" in torch's out-of-memory message) where such a report was found, else
            nvidia-smi's total; the ceiling's fraction applies to it.
        compute_capability: CUDA compute capability: the dtypes it trains in and the CUDA prior's
            generation (:mod:`autotune.estimate`).
        memory_source: Where ``memory_bytes`` comes from (docs/facts.md, "GPUs one can plan for").
    """

    key: str
    nvml_name: str
    memory_bytes: int
    compute_capability: tuple[int, int]
    memory_source: str

    def device(self) -> DeviceSpec:
        """The device a trial on this GPU would see (index 0), for estimates only."""
        return DeviceSpec(
            kind="cuda",
            index=0,
            name=self.nvml_name,
            total_memory_bytes=self.memory_bytes,
            supported_dtypes=cuda_dtypes(self.compute_capability),
            compute_capability=self.compute_capability,
        )


_GiB = 1024**3
_MiB = 1024**2
# Compute capabilities: NVIDIA's CUDA GPUs list (developer.nvidia.com/cuda-gpus). Memory: the
# "total capacity" torch prints in a CUDA OOM message (GiB, two decimals) or nvidia-smi's total
# (MiB), quoted in the public issues named in docs/facts.md.
KNOWN_GPUS: tuple[KnownGpu, ...] = (
    KnownGpu(
        "v100-16gb", "Tesla V100-SXM2-16GB", int(15.78 * _GiB), (7, 0), "torch OOM message: 15.78 GiB total capacity"
    ),
    KnownGpu(
        "v100-32gb", "Tesla V100-SXM2-32GB", int(31.74 * _GiB), (7, 0), "torch OOM message: 31.74 GiB total capacity"
    ),
    KnownGpu(
        "a100-40gb", "NVIDIA A100-SXM4-40GB", int(39.59 * _GiB), (8, 0), "torch OOM message: 39.59 GiB total capacity"
    ),
    KnownGpu(
        "a100-80gb", "NVIDIA A100-SXM4-80GB", int(79.15 * _GiB), (8, 0), "torch OOM message: 79.15 GiB total capacity"
    ),
    KnownGpu("a10g", "NVIDIA A10G", 23028 * _MiB, (8, 6), "nvidia-smi total: 23028 MiB"),
    KnownGpu("l4", "NVIDIA L4", 23034 * _MiB, (8, 9), "nvidia-smi total: 23034 MiB"),
    KnownGpu(
        "rtx-3090", "NVIDIA GeForce RTX 3090", int(23.70 * _GiB), (8, 6), "torch OOM message: 23.70 GiB total capacity"
    ),
    KnownGpu(
        "rtx-4090", "NVIDIA GeForce RTX 4090", int(23.65 * _GiB), (8, 9), "torch OOM message: 23.65 GiB total capacity"
    ),
    KnownGpu("h100-pcie", "NVIDIA H100 PCIe", 81559 * _MiB, (9, 0), "nvidia-smi total: 81559 MiB (80 GB HBM2e)"),
    KnownGpu(
        "h100-sxm",
        "NVIDIA H100 80GB HBM3",
        int(79.11 * _GiB),
        (9, 0),
        "torch OOM message: 79.11 GiB total capacity (nvidia-smi's 81559 MiB includes the driver's reserve)",
    ),
    KnownGpu("h200", "NVIDIA H200", 143771 * _MiB, (9, 0), "nvidia-smi total: 143771 MiB (141 GB HBM3e)"),
)


def known_gpu(key: str) -> KnownGpu:
    """The GPU ``--gpu-type`` names.

    Raises:
        AutotuneError: Not in :data:`KNOWN_GPUS` (the message lists them).
    """
    for gpu in KNOWN_GPUS:
        if gpu.key == key.strip().lower():
            return gpu
    names = ", ".join(gpu.key for gpu in KNOWN_GPUS)
    raise AutotuneError(f"--gpu-type {key!r} is not known: choose one of {names} (autotune devices --known)")


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A device a trial runs on.

    Attributes:
        kind: ``cpu`` or ``cuda``.
        index: CUDA device index as the user numbers them (``None`` for the CPU).
        name: Marketing name (``NVIDIA A100-SXM4-80GB``) or the CPU model name.
        total_memory_bytes: Device memory (host RAM for the CPU).
        supported_dtypes: The dtypes of :data:`autotune.levers._trial_config.DTYPES` this device can train in.
        compute_capability: CUDA compute capability, ``None`` for the CPU.
        cpu_flags: The CPU's instruction-set flags as Linux lists them in ``/proc/cpuinfo`` (``flags``
            on x86, ``Features`` on Arm); empty for CUDA devices and where the file is unreadable.
    """

    kind: str
    index: int | None
    name: str
    total_memory_bytes: int
    supported_dtypes: tuple[str, ...]
    compute_capability: tuple[int, int] | None = None
    cpu_flags: frozenset[str] = frozenset()

    @property
    def label(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def datasheet_peak_tflops(self, dtype: str) -> float | None:
        """The datasheet dense peak for ``dtype``; ``None`` where unknown (never invented)."""
        if self.kind != "cuda":
            return None  # CPUs publish no matmul peak per dtype; `autotune devices --calibrate` measures one
        return datasheet_peak_tflops(self.name, dtype)

    def datasheet_entry(self) -> DatasheetEntry | None:
        """This GPU's datasheet entry; ``None`` for the CPU and for GPUs not in :data:`DATASHEETS`."""
        return datasheet_entry(self.name) if self.kind == "cuda" else None

    def has_matmul_hardware(self, dtype: str) -> bool:
        """Whether this device multiplies ``dtype`` matrices in hardware made for it.

        fp32 and tf32 always (where supported at all). A half dtype on CUDA: from the compute
        capability (:func:`cuda_half_hardware`); on the CPU: from the instruction-set flags
        (:data:`CPU_HALF_MATMUL_FLAGS`). Without them a CPU still trains in bf16, emulated, and slower
        than in fp32 (docs/facts.md, "bf16 on a CPU without bf16 instructions").
        """
        if dtype not in HALF_MATMUL_DTYPES:
            return True
        if self.kind == "cuda":
            return self.compute_capability is not None and dtype in cuda_half_hardware(self.compute_capability)
        return bool(CPU_HALF_MATMUL_FLAGS[dtype] & self.cpu_flags)

    @property
    def emulated_dtypes(self) -> tuple[str, ...]:
        """The dtypes this device trains in without matmul hardware for them: correct, but slow."""
        return tuple(d for d in self.supported_dtypes if not self.has_matmul_hardware(d))

    @property
    def fast_dtypes(self) -> tuple[str, ...]:
        """The dtypes this device trains in with matmul hardware for them."""
        return tuple(d for d in self.supported_dtypes if self.has_matmul_hardware(d))

    def emulation_reason(self, dtype: str) -> str:
        """Why ``dtype`` runs emulated here, in words; ``""`` where it has hardware (or is not supported).

        Only a CPU emulates: on CUDA a half dtype is supported only where tensor cores run it
        (:func:`cuda_dtypes`).
        """
        if dtype not in self.emulated_dtypes:
            return ""
        flags = ", ".join(sorted(CPU_HALF_MATMUL_FLAGS[dtype]))
        return f"{self.label} ({self.name}) has no {dtype} matmul instructions (none of {flags}): it runs emulated, slower than fp32"


def datasheet_entry(device_name: str) -> DatasheetEntry | None:
    """The datasheet of the GPU an NVML name describes; ``None`` for CPUs and GPUs not in the table.

    A MIG instance (NVML names it "NVIDIA A100-SXM4-40GB MIG 1g.5gb") has a fraction of the GPU's
    SMs, so the whole GPU's peak would understate its MFU: it gets none (never invented).
    """
    if re.search(r"\bMIG\b", device_name):
        return None
    for entry in DATASHEETS:
        if re.search(entry.pattern, device_name, flags=re.IGNORECASE):
            return entry
    return None


def datasheet_peak_tflops(device_name: str, dtype: str) -> float | None:
    """Look up the datasheet peak for a GPU name and dtype; ``None`` for unknown GPUs and CPUs."""
    entry = datasheet_entry(device_name)
    return entry.peaks_tflops.get(dtype) if entry is not None else None


def matmul_dtype(dtype: str, tf32_enabled: bool = False) -> str:
    """The dtype whose peak bounds a trial's matmuls: ``tf32`` for fp32 training with TF32 enabled.

    Mixed precision (``fp16``/``bf16``) runs its matmuls in half precision, so the half-precision
    tensor peak applies; plain ``fp32`` runs on CUDA cores unless TF32 is switched on (PyTorch leaves
    it off for matmuls by default).
    """
    return "tf32" if dtype == "fp32" and tf32_enabled else dtype


def usable_cores() -> int:
    """The cores this process may run on: its affinity (which ``taskset`` and a cgroup's cpuset narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolve_device(device: str | None, gpu: int | None) -> DeviceSpec:
    """Turn ``--device cpu|cuda:N`` or ``--gpu N`` into a :class:`DeviceSpec`.

    Raises:
        AutotuneError: Both or a malformed option given, or no such CUDA device.
    """
    if device is not None and gpu is not None:
        raise AutotuneError("give either --gpu N or --device, not both")
    if gpu is not None:
        return cuda_device(gpu)
    if device is None or device == "cpu":
        return cpu_device()
    if device == "cuda":
        return cuda_device(0)
    if device.startswith("cuda:") and device[5:].isdigit():
        return cuda_device(int(device[5:]))
    raise AutotuneError(f"--device {device!r} is not understood: use cpu, cuda or cuda:N (or --gpu N)")


# The CPU instruction-set flags that multiply half-precision matrices in hardware, by the names Linux
# gives them in /proc/cpuinfo (x86: arch/x86/include/asm/cpufeatures.h, the "avx512_bf16", "amx_bf16",
# "avx512_fp16", "amx_fp16" features; Arm: the "Features" line's "bf16" (FEAT_BF16) and "asimdhp"
# (half-precision SIMD arithmetic), arch/arm64/kernel/cpuinfo.c). torch's own check of bf16
# support on x86 reads the same AVX512-BF16 bit (ATen/cpu/Utils.cpp: does_cpu_support_avx512bf16).
# "amx_tile" alone is not counted: it is the tile registers, and bf16 tiles are AMX-BF16's own flag.
HALF_MATMUL_DTYPES = ("fp16", "bf16")
CPU_HALF_MATMUL_FLAGS: dict[str, frozenset[str]] = {
    "bf16": frozenset({"avx512_bf16", "amx_bf16", "bf16"}),
    "fp16": frozenset({"avx512_fp16", "amx_fp16", "asimdhp"}),
}


def cpu_device() -> DeviceSpec:
    import psutil

    return DeviceSpec(
        kind="cpu",
        index=None,
        name=_cpu_model_name(),
        total_memory_bytes=psutil.virtual_memory().total,
        # fp16 autocast and TF32 are GPU features; bf16 autocast runs on CPUs.
        supported_dtypes=("fp32", "bf16"),
        cpu_flags=cpu_flags(),
    )


def _cpu_model_name() -> str:
    value = _cpuinfo_field("model name")
    if value:
        return value
    import platform

    return platform.processor() or "cpu"


def cpu_flags(cpuinfo_path: str = "/proc/cpuinfo") -> frozenset[str]:
    """The first CPU's instruction-set flags (``flags`` on x86, ``Features`` on Arm); empty if unreadable."""
    value = _cpuinfo_field("flags", cpuinfo_path) or _cpuinfo_field("Features", cpuinfo_path)
    return frozenset(value.split())


def _cpuinfo_field(name: str, cpuinfo_path: str = "/proc/cpuinfo") -> str:
    """The first ``name : value`` line of ``/proc/cpuinfo``, its value; ``""`` if absent or unreadable."""
    try:
        with open(cpuinfo_path) as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return ""


def cuda_device(index: int) -> DeviceSpec:
    """Describe CUDA device ``index`` through NVML, without creating a CUDA context here.

    On a MIG instance (``CUDA_VISIBLE_DEVICES=MIG-<uuid>``) the memory is the instance's, which is
    what a trial there can use: NVML's memory info of a MIG device handle is the slice's (NVML API
    reference, nvmlDeviceGetMemoryInfo; nvidia-ml-py's pynvml.py wraps it as is).
    """
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVML missing, no driver: both mean no GPU here
        raise AutotuneError(f"no CUDA device on this machine (NVML: {exc}); run on the CPU with --device cpu") from None
    handle = nvml_device_handle(pynvml, visible_device_id(index), index)
    name = pynvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    total = cuda_allocatable_bytes(pynvml, handle)
    parent = pynvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle) if is_mig_handle(pynvml, handle) else handle
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(parent)
    return DeviceSpec(
        kind="cuda",
        index=index,
        name=name,
        total_memory_bytes=total,
        supported_dtypes=cuda_dtypes((major, minor)),
        compute_capability=(major, minor),
    )


def list_devices() -> list[DeviceSpec]:
    """The CPU, then every CUDA device NVML sees (none where there is no driver)."""
    found = [cpu_device()]
    index = 0
    while True:
        try:
            found.append(cuda_device(index))
        except AutotuneError:
            return found
        index += 1


def cuda_half_hardware(compute_capability: tuple[int, int]) -> tuple[str, ...]:
    """The half dtypes a GPU's tensor cores multiply: fp16 from Volta (7.0), bf16 from Ampere (8.0)."""
    return tuple(d for d in cuda_dtypes(compute_capability) if d in HALF_MATMUL_DTYPES)


def cuda_dtypes(compute_capability: tuple[int, int]) -> tuple[str, ...]:
    """bf16 and TF32 need Ampere (compute capability 8.0) or newer; fp16 tensor cores need Volta (7.0)."""
    dtypes = ["fp32"]
    if compute_capability >= (7, 0):
        dtypes.append("fp16")
    if compute_capability >= (8, 0):
        dtypes += ["tf32", "bf16"]
    return tuple(dtypes)
