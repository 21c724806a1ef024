"""Devices: what the tuner trains on, their datasheet peaks, and how a trial measures memory there.

Two backends stand behind one interface:

* ``cpu``: memory is the peak resident set of the trial's whole process tree (dataloader workers
  count), sampled by a thread and cross-checked with the kernel's own high-water mark.
* ``cuda``: memory is the caching allocator's peak reservation plus what lives outside it (the CUDA
  context, cuDNN workspaces), from the ``mem_get_info`` delta and NVML's per-process figure, each
  recorded. The orchestrator reads device facts through NVML only, so it never creates a CUDA
  context on the GPU it is measuring.

No API reports a device's peak FLOPS: datasheet peaks are looked up by device name (unknown
devices get none), and ``autotune devices --calibrate`` measures an achievable one
(:mod:`autotune.calibrate`).
"""

from __future__ import annotations

import dataclasses
import os
import re
import resource
import threading
import time
from typing import Protocol

from autotune.errors import AutotuneError

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class DatasheetEntry:
    """One GPU model's dense datasheet peaks.

    Attributes:
        label: The model as the tables print it (``H100 SXM``).
        pattern: Regular expression matched (case-insensitively) against the NVML device name.
        peaks_tflops: Dense TFLOPS by dtype: ``fp32`` (CUDA cores), ``tf32`` and ``fp16``/``bf16``
            (tensor cores, fp32 accumulate). A dtype the GPU lacks is absent.
        source: Where the figures come from.
    """

    label: str
    pattern: str
    peaks_tflops: dict[str, float]
    source: str


# Dense datasheet peaks (without the 2:4 sparsity factor NVIDIA often quotes), figures collected in
# ../shared/FACTS.md. Patterns are strict on purpose: a variant with other clocks or SM counts
# (H100 NVL, H200 NVL, L40/L40S, RTX 3090 Ti, RTX 4090 D, A100X) matches nothing and gets no MFU,
# rather than the peak of a sibling. NVML names look like "NVIDIA H100 80GB HBM3" (SXM5),
# "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB", "NVIDIA GeForce RTX 4090".
DATASHEETS: tuple[DatasheetEntry, ...] = (
    DatasheetEntry("V100 SXM2", r"\bV100-SXM2\b", {"fp32": 15.7, "fp16": 125.0}, "NVIDIA Tesla V100 datasheet"),
    DatasheetEntry("V100 PCIe", r"\bV100-PCIE\b", {"fp32": 14.0, "fp16": 112.0}, "NVIDIA Tesla V100 datasheet"),
    DatasheetEntry("V100S PCIe", r"\bV100S\b", {"fp32": 16.4, "fp16": 130.0}, "NVIDIA Tesla V100S datasheet"),
    DatasheetEntry(
        "A100", r"\bA100\b", {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0},
        "NVIDIA A100 datasheet (SXM4 and PCIe, 40 and 80 GB)",
    ),
    DatasheetEntry(
        "H100 PCIe", r"\bH100 PCIe\b", {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0},
        "NVIDIA H100 datasheet (sparsity figures halved)",
    ),
    DatasheetEntry(
        "H100 SXM", r"\bH100\b(?!.*\bNVL\b).*\b(HBM3|SXM\d?)\b",
        {"fp32": 67.0, "tf32": 494.5, "fp16": 989.0, "bf16": 989.0},
        "NVIDIA H100 datasheet (sparsity figures halved)",
    ),
    DatasheetEntry(
        "H200 SXM", r"\bH200\b(?!.*\bNVL\b)", {"fp32": 67.0, "tf32": 494.5, "fp16": 989.0, "bf16": 989.0},
        "NVIDIA H200 datasheet (sparsity figures halved)",
    ),
    DatasheetEntry(
        "L4", r"\bL4\b", {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0},
        "NVIDIA L4 datasheet (sparsity figures halved)",
    ),
    DatasheetEntry(
        "A10G", r"\bA10G\b", {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0},
        "NVIDIA A10 datasheet (AWS publishes no separate A10G figures)",
    ),
    DatasheetEntry(
        "RTX 3090", r"\bRTX 3090\b(?!\s*Ti\b)", {"fp32": 35.6, "tf32": 35.6, "fp16": 71.0, "bf16": 71.0},
        "NVIDIA Ampere GA102 whitepaper (fp16/bf16 tensor with fp32 accumulate)",
    ),
    DatasheetEntry(
        "RTX 4090", r"\bRTX 4090\b(?!\s*D\b)", {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2},
        "NVIDIA Ada Lovelace whitepaper (fp16/bf16 tensor with fp32 accumulate)",
    ),
)


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
        if self.kind != "cuda":
            return None  # CPUs publish no matmul peak per dtype; `autotune devices --calibrate` measures one
        return datasheet_peak_tflops(self.name, dtype)

    def datasheet_entry(self) -> DatasheetEntry | None:
        """This GPU's datasheet entry; ``None`` for the CPU and for GPUs not in :data:`DATASHEETS`."""
        return datasheet_entry(self.name) if self.kind == "cuda" else None


def datasheet_entry(device_name: str) -> DatasheetEntry | None:
    """The datasheet of the GPU an NVML name describes; ``None`` for CPUs and GPUs not in the table."""
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
    """Peak resident memory of this process and every process below it (dataloader workers).

    The ceiling is compared with ``peak_rss_tree_bytes``: the largest resident memory of the
    trial's process tree seen by a sampling thread (the trial process's RSS plus each worker's
    unique set size), or the kernel's high-water mark of the trial process itself if that is larger
    (it catches spikes shorter than the sampling interval). A dataloader worker is forked from the
    trial process and shares its pages until it writes them; summing plain RSS would count the
    shared pages once per worker (seen here: 1.35 GB with 2 workers for a trial whose own RSS was
    0.42 GB), so a worker adds only the pages it alone holds (USS, from /proc/PID/smaps_rollup).

    The ceiling's figure is what the same training shows as a standalone process: it adds the
    library pages a fresh process maps and a forkserver child does not (``unmapped_import_bytes``,
    see :func:`unmapped_import_file_bytes`); the raw readings are kept beside it
    (``peak_rss_tree_sampled_bytes``, ``peak_rss_self_bytes``). The anonymous part (RSS minus
    file-backed and shared-memory pages: heap, tensors, the Python objects) is recorded as
    ``peak_anon_rss_tree_sampled_bytes``: the part a standalone process reproduces exactly
    (docs/benchmarks.md, fidelity).
    """

    ceiling_source = "peak_rss_tree_bytes"

    def __init__(self, interval_s: float = 0.02, relist_interval_s: float = 0.5, unmapped_import_bytes: int = 0) -> None:
        """
        Args:
            interval_s: How often the tree's resident memory is summed (a cheap read per process).
            relist_interval_s: How often the tree is listed again. Listing scans every process on
                the host (about 5 ms with 100 processes), so it is done rarely; workers live for
                the whole epoch, so a late listing misses little.
            unmapped_import_bytes: File-backed pages a fresh process would hold from its imports
                that this one does not map; added to the ceiling's figure.
        """
        import psutil

        self._unmapped_import_bytes = unmapped_import_bytes
        self._process = psutil.Process()
        self._interval_s = interval_s
        self._relist_interval_s = relist_interval_s
        self._tree: list[psutil.Process] = [self._process]
        self._listed_at = 0.0
        self._peak_tree_bytes = 0
        self._peak_anon_tree_bytes = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_forever, daemon=True, name="rss-sampler")

    def start(self) -> None:
        self._thread.start()

    def _sample_forever(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self._interval_s)

    def _sample(self, relist: bool = False) -> None:
        import psutil

        with self._lock:
            now = time.monotonic()
            if relist or now - self._listed_at >= self._relist_interval_s:
                try:
                    self._tree = [self._process, *self._process.children(recursive=True)]
                except psutil.Error:
                    self._tree = [self._process]
                self._listed_at = now
            total = anon = 0
            for proc in self._tree:
                try:
                    info = proc.memory_info()
                    # Workers: only their own pages (see the class docstring). USS needs smaps, so it
                    # is read for workers only; the trial process itself counts whole.
                    worker_uss = proc.memory_full_info().uss if proc is not self._process else None
                except psutil.Error:
                    continue  # a worker that exited since the last listing
                total += info.rss if worker_uss is None else worker_uss
                anon += (info.rss - info.shared) if worker_uss is None else worker_uss  # `shared`: RssFile + RssShmem
            self._peak_tree_bytes = max(self._peak_tree_bytes, total)
            self._peak_anon_tree_bytes = max(self._peak_anon_tree_bytes, anon)

    def synchronize(self) -> None:
        """CPU work is synchronous: nothing to wait for."""

    def peaks(self) -> dict[str, int]:
        self._sample(relist=True)
        self_hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
        return {
            "peak_rss_tree_bytes": max(self._peak_tree_bytes, self_hwm) + self._unmapped_import_bytes,
            "unmapped_import_file_bytes": self._unmapped_import_bytes,
            "peak_rss_tree_sampled_bytes": self._peak_tree_bytes,
            "peak_anon_rss_tree_sampled_bytes": self._peak_anon_tree_bytes,
            "peak_rss_self_bytes": self_hwm,
        }

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)


@dataclasses.dataclass(frozen=True)
class CudaReadings:
    """Raw CUDA memory readings of one trial process, taken after its last step.

    Attributes:
        max_reserved: ``torch.cuda.max_memory_reserved()``: the caching allocator's peak holding.
        max_allocated: ``torch.cuda.max_memory_allocated()``: the peak of live tensors.
        reserved_now: ``torch.cuda.memory_reserved()`` at the time of the other readings.
        device_used_now: ``total - free`` from ``torch.cuda.mem_get_info()``: device-wide use.
        device_used_before: NVML's device-wide use read before this process created its CUDA
            context (``None`` if NVML could not be read).
        nvml_process_used: Device memory NVML attributes to this PID (``None`` where NVML cannot
            see it, e.g. in a container with its own PID namespace).
    """

    max_reserved: int
    max_allocated: int
    reserved_now: int
    device_used_now: int
    device_used_before: int | None
    nvml_process_used: int | None


class CudaMemoryProbe:
    """Peak device memory of this process: allocator reservations plus memory outside the allocator."""

    ceiling_source = "peak_device_bytes"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        # Read through NVML before torch creates a context, so the context shows in the delta.
        self._device_used_before = nvml_device_used_bytes()

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
            CudaReadings(
                max_reserved=cuda.max_memory_reserved(),
                max_allocated=cuda.max_memory_allocated(),
                reserved_now=cuda.memory_reserved(),
                device_used_now=total - free,
                device_used_before=self._device_used_before,
                nvml_process_used=nvml_process_used_bytes(os.getpid()),
            )
        )

    def stop(self) -> None:
        pass


def cuda_peaks(readings: CudaReadings) -> dict[str, int]:
    """Combine CUDA readings into peak figures (pure arithmetic, unit-tested without a GPU).

    The ceiling figure is ``peak_device_bytes = max_memory_reserved + outside_allocator``. Memory
    outside the caching allocator (the CUDA context, cuDNN/NCCL workspaces) is what the process
    holds now minus what the allocator holds now; it does not shrink during a run, so it adds to
    the allocator's peak. What the process holds is taken from NVML's per-process figure where
    NVML sees this PID (exact, blind to other processes), else from the ``mem_get_info`` delta
    since before the context existed (exact on a GPU nobody else is using), else from the
    device-wide use (an upper bound: it includes other processes). Each estimate is recorded.
    """
    r = readings
    peaks = {
        "max_memory_reserved_bytes": r.max_reserved,
        "max_memory_allocated_bytes": r.max_allocated,
    }
    delta_outside = None
    if r.device_used_before is not None:
        delta_outside = max(r.device_used_now - r.device_used_before - r.reserved_now, 0)
        peaks["outside_allocator_mem_get_info_bytes"] = delta_outside
    nvml_outside = None
    if r.nvml_process_used is not None:
        nvml_outside = max(r.nvml_process_used - r.reserved_now, 0)
        peaks["nvml_process_used_bytes"] = r.nvml_process_used
        peaks["outside_allocator_nvml_bytes"] = nvml_outside
    if nvml_outside is not None:
        outside = nvml_outside
    elif delta_outside is not None:
        outside = delta_outside
    else:
        outside = max(r.device_used_now - r.reserved_now, 0)
    peaks["outside_allocator_bytes"] = outside
    peaks["peak_device_bytes"] = r.max_reserved + outside
    return peaks


def _nvml_handle():  # noqa: ANN202 - a pynvml handle
    import pynvml

    pynvml.nvmlInit()
    # Inside a trial child CUDA_VISIBLE_DEVICES names the one physical GPU the child may use.
    return pynvml, pynvml.nvmlDeviceGetHandleByIndex(physical_gpu_index(0))


def nvml_device_used_bytes() -> int | None:
    """Device-wide memory in use according to NVML (creates no CUDA context), or ``None``."""
    try:
        pynvml, handle = _nvml_handle()
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - a cross-check, never a reason to fail a trial
        return None


def nvml_process_used_bytes(pid: int) -> int | None:
    """Device memory NVML attributes to ``pid``, or ``None`` where NVML cannot see it."""
    try:
        pynvml, handle = _nvml_handle()
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # noqa: BLE001 - NVML is a cross-check, never a reason to fail a trial
        return None
    return None


def memory_probe(kind: str) -> MemoryProbe:
    """The probe a trial child uses on a device of ``kind`` (``cpu`` or ``cuda``)."""
    if kind == "cpu":
        return CpuMemoryProbe(unmapped_import_bytes=unmapped_import_file_bytes())
    return CudaMemoryProbe()


def unmapped_import_file_bytes() -> int:
    """File-backed resident pages the parent holds and this process does not: in a trial child, the
    library pages a freshly started interpreter touches while importing torch and transformers.

    The forkserver is such an interpreter, and its child maps none of those pages until it touches
    them (fork copies no page-table entries of file mappings). Measured here: RssFile 124 MB in the
    forkserver, 51 MB in a training child, 148 MB in the same training run as a plain process. The
    difference at the child's start (114 MiB here) is what the child's RSS lacks against the plain
    process, over-counted by the pages the child touches again later (about 17 MB here, under 2 % of
    a trial's peak: on the safe side). 0 where the parent maps fewer (a spawned child imported
    everything itself).
    """
    return max(0, _rss_file_bytes(os.getppid()) - _rss_file_bytes(os.getpid()))


def _rss_file_bytes(pid: int) -> int:
    """``RssFile`` of /proc/PID/status (resident file-backed pages); 0 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("RssFile:"):
                    return int(line.split()[1]) * 1024  # reported in kB
    except (OSError, ValueError):
        pass
    return 0


def memory_source_description(source: str) -> str:
    """What a probe's ceiling figure measures, in words for tables and notes."""
    return {
        "peak_rss_tree_bytes": "peak resident memory (RSS) of the trial's whole process tree",
        "peak_device_bytes": "peak CUDA memory: max_memory_reserved + memory outside the allocator (context)",
    }.get(source, source)


def child_address_space_budget(ceiling_bytes: int, available_bytes: int) -> int:
    """How far a CPU trial child may grow its address space before allocations fail.

    Generous above the ceiling (virtual size runs ahead of resident memory: thread stacks, malloc
    arenas), so a config just over the ceiling still runs and is measured as ``over_ceiling``;
    but never more than 90 % of the RAM available now, so the host never swaps or OOM-kills.
    """
    generous = ceiling_bytes + max(ceiling_bytes // 2, 2 * GiB)
    return min(generous, int(available_bytes * 0.9))


def limit_address_space(budget_bytes: int) -> None:
    """Cap this process's virtual memory at today's size plus ``budget_bytes``.

    A runaway batch then fails inside the trial: torch's CPU allocator raises "DefaultCPUAllocator:
    can't allocate memory", a clean OOM. Start every Python thread the trial needs before calling
    this: a thread whose bootstrap cannot allocate dies silently and leaves ``Thread.start()``
    waiting forever (CPython gh-140746, seen here as a hung trial under a 64 MiB budget).
    """
    import psutil

    current = psutil.Process().memory_info().vms
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = current + budget_bytes
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
