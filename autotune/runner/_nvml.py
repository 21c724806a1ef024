"""NVML readings a trial child takes: device-wide and per-process memory, without a CUDA context."""

from __future__ import annotations

import os

from autotune.spec.nvml_devices import nvml_device_handle, visible_device_id


def _nvml_handle():  # noqa: ANN202 - a pynvml handle
    import pynvml

    pynvml.nvmlInit()
    # Inside a trial child CUDA_VISIBLE_DEVICES names the one device the child may use: an index, a
    # GPU UUID or a MIG instance (whose memory figures are the slice's). A rank of a multi-rank trial
    # sees its trial's GPUs and uses entry LOCAL_RANK (set by torch's launcher; autotune.runner._launch).
    entry = int(os.environ.get("LOCAL_RANK", "0"))
    return pynvml, nvml_device_handle(pynvml, visible_device_id(entry), entry)


def nvml_device_used_bytes() -> int | None:
    """Device-wide memory in use according to NVML (creates no CUDA context), or ``None``."""
    try:
        pynvml, handle = _nvml_handle()
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - a cross-check, never a reason to fail a trial
        return None


def nvml_process_used_bytes(pid: int) -> int | None:
    """Device memory NVML attributes to ``pid``, or ``None`` where NVML cannot see it.

    ``None`` in a container with its own PID namespace: NVML lists host PIDs there, none of which
    is this process's ``os.getpid()``. ``usedGpuMemory`` is ``None`` where the driver does not say
    (pynvml.py maps NVML_VALUE_NOT_AVAILABLE to ``None``, e.g. under Windows WDDM).
    """
    try:
        pynvml, handle = _nvml_handle()
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:  # noqa: BLE001 - NVML is a cross-check, never a reason to fail a trial
        return None
    return None
