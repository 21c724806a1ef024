"""Devices: what the tuner trains on, their datasheet peaks, and how a trial measures memory there.

Two backends stand behind one interface:

* ``cpu``: memory is the peak resident set of the trial's whole process tree (dataloader workers
  count), sampled by a thread and cross-checked with the kernel's own high-water mark.
* ``cuda``: memory is the caching allocator's peak reservation plus what lives outside it (the CUDA
  context, cuBLAS workspaces), read from NVML per process. The orchestrator reads device facts
  through NVML only, so it never creates a CUDA context on the GPU it is measuring.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading
import time
from typing import Protocol

from autotune.errors import AutotuneError

GiB = 1024**3

# Dense datasheet peaks in TFLOPS by dtype: fp32 (no tensor cores), tf32 and fp16/bf16 tensor
# cores with fp32 accumulate. Sources: NVIDIA datasheets (V100, A100, H100, H200, L4, A10G,
# RTX 3090/4090); figures collected in ../shared/FACTS.md. V100 has no bf16 and no tf32.
# Matched against the NVML device name, most specific key first.
DATASHEET_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
    "H100": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.0, "bf16": 989.0},
    "H200": {"fp32": 67.0, "tf32": 494.5, "fp16": 989.0, "bf16": 989.0},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
    "A10G": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
    "V100": {"fp32": 15.7, "fp16": 125.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
    "RTX 3090": {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
}


@dataclasses.dataclass(frozen=True)
class DeviceSpec:
    """A device a trial runs on.

    Attributes:
        kind: ``cpu`` or ``cuda``.
        index: CUDA device index as the user numbers them (``None`` for the CPU).
        name: Marketing name (``NVIDIA A100-SXM4-80GB``) or the CPU model name.
        total_memory_bytes: Device memory (host RAM for the CPU).
        supported_dtypes: The dtypes of :data:`autotune.config.DTYPES` this device can train in.
        compute_capability: CUDA compute capability, ``None`` for the CPU.
    """

    kind: str
    index: int | None
    name: str
    total_memory_bytes: int
    supported_dtypes: tuple[str, ...]
    compute_capability: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        return "cpu" if self.kind == "cpu" else f"cuda:{self.index}"

    def datasheet_peak_tflops(self, dtype: str) -> float | None:
        """The datasheet dense peak for ``dtype``; ``None`` where unknown (never invented)."""
        return datasheet_peak_tflops(self.name, dtype)


def datasheet_peak_tflops(device_name: str, dtype: str) -> float | None:
    """Look up the datasheet peak for a GPU name and dtype; ``None`` for unknown GPUs and CPUs."""
    for key, peaks in DATASHEET_PEAK_TFLOPS.items():
        if key in device_name:
            return peaks.get(dtype)
    return None


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


def cpu_device() -> DeviceSpec:
    import psutil

    return DeviceSpec(
        kind="cpu",
        index=None,
        name=_cpu_model_name(),
        total_memory_bytes=psutil.virtual_memory().total,
        # fp16 autocast and TF32 are GPU features; bf16 autocast runs on CPUs.
        supported_dtypes=("fp32", "bf16"),
    )


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "cpu"


def cuda_device(index: int) -> DeviceSpec:
    """Describe CUDA device ``index`` through NVML, without creating a CUDA context here."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVML missing, no driver: both mean no GPU here
        raise AutotuneError(
            f"no CUDA device on this machine (NVML: {exc}); run on the CPU with --device cpu"
        ) from None
    count = pynvml.nvmlDeviceGetCount()
    physical = physical_gpu_index(index)
    if physical >= count:
        raise AutotuneError(f"--gpu {index}: this machine has {count} CUDA device(s), numbered from 0")
    handle = pynvml.nvmlDeviceGetHandleByIndex(physical)
    name = pynvml.nvmlDeviceGetName(handle)
    name = name.decode() if isinstance(name, bytes) else name
    total = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
    return DeviceSpec(
        kind="cuda",
        index=index,
        name=name,
        total_memory_bytes=total,
        supported_dtypes=cuda_dtypes((major, minor)),
        compute_capability=(major, minor),
    )


def cuda_dtypes(compute_capability: tuple[int, int]) -> tuple[str, ...]:
    """bf16 and TF32 need Ampere (compute capability 8.0) or newer; fp16 tensor cores need Volta (7.0)."""
    dtypes = ["fp32"]
    if compute_capability >= (7, 0):
        dtypes.append("fp16")
    if compute_capability >= (8, 0):
        dtypes += ["tf32", "bf16"]
    return tuple(dtypes)


def physical_gpu_index(index: int) -> int:
    """Map the user's GPU number through an inherited ``CUDA_VISIBLE_DEVICES`` to an NVML index."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return index
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if index >= len(ids) or not ids[index].isdigit():
        raise AutotuneError(f"--gpu {index} is not among CUDA_VISIBLE_DEVICES={visible}")
    return int(ids[index])


def child_environment(device: DeviceSpec) -> dict[str, str]:
    """Environment a trial child sets before anything touches CUDA."""
    if device.kind == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    # NVML numbers devices in PCI bus order; make CUDA agree before pinning the child to one.
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(physical_gpu_index(device.index or 0))}


class MemoryProbe(Protocol):
    """Measures peak memory inside a trial child. One per trial."""

    ceiling_source: str  # the key of :meth:`peaks` that the memory ceiling is compared against

    def start(self) -> None: ...

    def synchronize(self) -> None: ...

    def peaks(self) -> dict[str, int]: ...

    def stop(self) -> None: ...


class CpuMemoryProbe:
    """Peak resident memory of this process and its children (dataloader workers)."""

    ceiling_source = "peak_rss_tree_bytes"

    def __init__(self, interval_s: float = 0.02) -> None:
        import psutil

        self._process = psutil.Process()
        self._interval_s = interval_s
        self._peak_tree_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, daemon=True, name="rss-sampler")

    def start(self) -> None:
        self._thread.start()

    def _sample_forever(self) -> None:
        while not self._stop.is_set():
            self._peak_tree_bytes = max(self._peak_tree_bytes, self._tree_rss())
            self._stop.wait(self._interval_s)

    def _tree_rss(self) -> int:
        import psutil

        total = 0
        for proc in [self._process, *self._process.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:
                pass  # a worker that exited between listing and reading
        return total

    def synchronize(self) -> None:
        """CPU work is synchronous: nothing to wait for."""

    def peaks(self) -> dict[str, int]:
        self._peak_tree_bytes = max(self._peak_tree_bytes, self._tree_rss())
        # The kernel's high-water mark catches spikes shorter than the sampling interval.
        self_hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return {
            "peak_rss_tree_bytes": max(self._peak_tree_bytes, self_hwm),
            "peak_rss_self_bytes": self_hwm,
        }

    def stop(self) -> None:
        self._stop.set()


class CudaMemoryProbe:
    """Peak device memory of this process: allocator reservations plus memory outside the allocator."""

    ceiling_source = "peak_device_bytes"

    def __init__(self) -> None:
        import torch

        self._torch = torch

    def start(self) -> None:
        self._torch.cuda.init()
        self._torch.cuda.reset_peak_memory_stats()

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def peaks(self) -> dict[str, int]:
        cuda = self._torch.cuda
        cuda.synchronize()
        free, total = cuda.mem_get_info()
        return cuda_peaks(
            max_reserved=cuda.max_memory_reserved(),
            max_allocated=cuda.max_memory_allocated(),
            reserved_now=cuda.memory_reserved(),
            process_used=nvml_process_used_bytes(os.getpid()),
            device_used_now=total - free,
        )

    def stop(self) -> None:
        pass


def cuda_peaks(
    max_reserved: int, max_allocated: int, reserved_now: int, process_used: int | None, device_used_now: int
) -> dict[str, int]:
    """Combine CUDA readings into peak figures (pure arithmetic, unit-tested without a GPU).

    Memory outside the caching allocator (context, cuBLAS/cuDNN workspaces) is what the process
    holds now minus what the allocator holds now; it does not shrink during a run, so it adds to
    the allocator's peak. NVML's per-process figure is preferred; where a container hides PIDs
    from NVML, the device-wide figure is an upper bound (it includes other processes).
    """
    held_now = process_used if process_used is not None else device_used_now
    outside_allocator = max(held_now - reserved_now, 0)
    peaks = {
        "peak_device_bytes": max_reserved + outside_allocator,
        "max_memory_reserved_bytes": max_reserved,
        "max_memory_allocated_bytes": max_allocated,
        "outside_allocator_bytes": outside_allocator,
    }
    if process_used is not None:
        peaks["nvml_process_used_bytes"] = process_used
    return peaks


def nvml_process_used_bytes(pid: int) -> int | None:
    """Device memory NVML attributes to ``pid``, or ``None`` where NVML cannot see it."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(physical_gpu_index(0))
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # noqa: BLE001 - NVML is a cross-check, never a reason to fail a trial
        return None
    return None


def memory_probe(kind: str) -> MemoryProbe:
    return CpuMemoryProbe() if kind == "cpu" else CudaMemoryProbe()




def child_address_space_budget(ceiling_bytes: int, available_bytes: int) -> int:
    """How far a CPU trial child may grow its address space before allocations fail.

    Generous above the ceiling (virtual size runs ahead of resident memory: thread stacks, malloc
    arenas), so a config just over the ceiling still runs and is measured as ``over_ceiling``;
    but never more than 90 % of the RAM available now, so the host never swaps or OOM-kills.
    """
    generous = ceiling_bytes + max(ceiling_bytes // 2, 2 * GiB)
    return min(generous, int(available_bytes * 0.9))
