"""Peak memory inside a trial child, one probe per device kind behind one interface.

* ``cpu``: the peak resident set of the trial's whole process tree (dataloader workers count),
  sampled by a thread and cross-checked with the kernel's own high-water mark.
* ``cuda``: the caching allocator's peak reservation plus what lives outside it (the CUDA context,
  cuBLAS/cuDNN workspaces), from one source at a time (NVML per process, else NVML's device-wide
  delta, else CUDA's ``total - free``), the one used recorded with the trial.
"""

from __future__ import annotations

import dataclasses
import os
import resource
import threading
import time
from typing import Protocol

from autotune.runner._failures import memory_pressure
from autotune.runner._nvml import nvml_device_used_bytes, nvml_process_used_bytes


class MemoryProbe(Protocol):
    """Measures peak memory inside a trial child. One per trial."""

    ceiling_source: str  # the key of :meth:`peaks` that the memory ceiling is compared against

    def start(self) -> None: ...

    def synchronize(self) -> None: ...

    def peaks(self) -> dict[str, int]: ...

    def notes(self) -> dict[str, str]: ...

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

    def __init__(
        self, interval_s: float = 0.02, relist_interval_s: float = 0.5, unmapped_import_bytes: int = 0
    ) -> None:
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

    def notes(self) -> dict[str, str]:
        """Nothing to say: the CPU probe has one source."""
        return {}

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
        cuda_device_used_now: ``total - free`` from ``torch.cuda.mem_get_info()`` (cudaMemGetInfo):
            device-wide use as CUDA counts it, which leaves out memory the driver reserves for itself.
        nvml_device_used_before: NVML's device-wide ``used`` read before this process created its
            CUDA context (``None`` if NVML could not be read).
        nvml_device_used_now: NVML's device-wide ``used`` read with the other readings: the same
            source as ``nvml_device_used_before``, so their difference holds no driver-reserved part.
        nvml_process_used: Device memory NVML attributes to this PID (``None`` where NVML cannot
            see it: in a container NVML lists host PIDs, which never equal the container's own).
    """

    max_reserved: int
    max_allocated: int
    reserved_now: int
    cuda_device_used_now: int
    nvml_device_used_before: int | None
    nvml_device_used_now: int | None
    nvml_process_used: int | None


# Where ``outside_allocator_bytes`` came from, best first (recorded with the trial).
OUTSIDE_SOURCES = {
    "nvml_process": "NVML's figure for this PID minus what the allocator holds",
    "nvml_device_delta": "NVML device-wide use now minus before the context, minus what the allocator holds",
    "cuda_device_used": "cudaMemGetInfo total - free minus what the allocator holds (includes other processes)",
}


class CudaMemoryProbe:
    """Peak device memory of this process: allocator reservations plus memory outside the allocator."""

    ceiling_source = "peak_device_bytes"

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._notes: dict[str, str] = {}
        # Read through NVML before torch creates a context, so the context shows in the delta.
        self._nvml_device_used_before = nvml_device_used_bytes()

    def start(self) -> None:
        self._torch.cuda.init()
        self._torch.cuda.reset_peak_memory_stats()

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()

    def peaks(self) -> dict[str, int]:
        cuda = self._torch.cuda
        cuda.synchronize()
        free, total = cuda.mem_get_info()
        peaks, source = cuda_peaks(
            CudaReadings(
                max_reserved=cuda.max_memory_reserved(),
                max_allocated=cuda.max_memory_allocated(),
                reserved_now=cuda.memory_reserved(),
                cuda_device_used_now=total - free,
                nvml_device_used_before=self._nvml_device_used_before,
                nvml_device_used_now=nvml_device_used_bytes(),
                nvml_process_used=nvml_process_used_bytes(os.getpid()),
            )
        )
        peaks["device_total_bytes"] = int(total)  # a MIG slice's size on a MIG instance
        self._notes = {"outside_allocator_source": source}
        return peaks

    def notes(self) -> dict[str, str]:
        """How :meth:`peaks` was taken: which source gave the memory outside the allocator."""
        return dict(self._notes)

    def stop(self) -> None:
        pass


def cuda_peaks(readings: CudaReadings) -> tuple[dict[str, int], str]:
    """Combine CUDA readings into peak figures (pure arithmetic, tested through fakes without a GPU).

    The ceiling figure is ``peak_device_bytes = max_memory_reserved + outside_allocator``, what
    ``nvidia-smi`` shows for the process at its peak. Memory outside the caching allocator (the CUDA
    context, cuBLAS/cuDNN workspaces, NCCL) is what the process holds now minus what the allocator
    holds now; it does not shrink during a run, so it adds to the allocator's peak. What the process
    holds comes from one source at a time, never a mix (NVML's ``used`` counts driver-reserved memory
    that ``cudaMemGetInfo`` does not, so mixing them under-counts by about the context):

    1. NVML's per-process figure, if NVML sees this PID and it is at least what the allocator holds
       (a smaller one cannot be this process's: it is discarded and recorded as such);
    2. NVML's device-wide use, now minus before the context (exact on a GPU nobody else uses);
    3. CUDA's device-wide ``total - free`` (an upper bound: other processes count too).

    No part is ever negative.

    Returns:
        The figures in bytes, and the name of the source used (a key of :data:`OUTSIDE_SOURCES`).
    """
    r = readings
    peaks = {
        "max_memory_reserved_bytes": r.max_reserved,
        "max_memory_allocated_bytes": r.max_allocated,
        "memory_reserved_now_bytes": r.reserved_now,
    }
    candidates: list[tuple[str, int]] = []
    if r.nvml_process_used is not None:
        peaks["nvml_process_used_bytes"] = r.nvml_process_used
        if r.nvml_process_used >= r.reserved_now:
            candidates.append(("nvml_process", r.nvml_process_used - r.reserved_now))
        else:
            peaks["nvml_process_discarded_bytes"] = r.nvml_process_used
    if r.nvml_device_used_before is not None and r.nvml_device_used_now is not None:
        delta = max(r.nvml_device_used_now - r.nvml_device_used_before - r.reserved_now, 0)
        peaks["outside_allocator_nvml_device_delta_bytes"] = delta
        candidates.append(("nvml_device_delta", delta))
    cuda_outside = max(r.cuda_device_used_now - r.reserved_now, 0)
    peaks["outside_allocator_cuda_device_used_bytes"] = cuda_outside
    candidates.append(("cuda_device_used", cuda_outside))
    source, outside = candidates[0]
    peaks["outside_allocator_bytes"] = outside
    peaks["peak_device_bytes"] = r.max_reserved + outside
    return peaks, source


def failure_memory_pressure() -> bool:
    """Whether the CUDA device was nearly full when a trial failed (read in the failing child).

    ``max_memory_reserved`` rather than the reservation now: on an allocation failure the caching
    allocator frees its cached blocks and retries before raising (c10/cuda/CUDACachingAllocator.cpp,
    ``release_cached_blocks``), so what it holds afterwards understates the pressure it was under.
    False wherever CUDA was never initialised in this process (a CPU trial).
    """
    import torch

    try:
        if not torch.cuda.is_initialized():
            return False
        free, total = torch.cuda.mem_get_info()
        return memory_pressure(torch.cuda.max_memory_reserved(), total, free)
    except Exception:  # noqa: BLE001 - a broken context after the failure: no sign either way
        return False


def memory_probe(kind: str) -> MemoryProbe:
    """The probe a trial child uses on a device of ``kind`` (``cpu`` or ``cuda``)."""
    if kind == "cpu":
        return CpuMemoryProbe(unmapped_import_bytes=unmapped_import_file_bytes())
    return CudaMemoryProbe()


def unmapped_import_file_bytes() -> int:
    """File-backed resident pages the parent holds and this process does not: in a trial child, the
    library pages a freshly started interpreter touches while importing torch and transformers.

    The forkserver is such an interpreter, and its child maps none of those pages until it touches
    them (fork copies no page-table entries of file mappings). The difference at the child's start is
    what the child's RSS lacks against the same training run as a plain process, over-counted by the
    pages the child touches again later (a small share of a trial's peak: on the safe side; the
    measured figures are in docs/benchmarks-archive.md, "Fidelity"). 0 where the parent maps fewer (a
    spawned child imported everything itself).
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
