"""What bounds a trial child: its environment before CUDA starts, and its address space on the CPU."""

from __future__ import annotations

import resource

from autotune.devices import DeviceSpec, physical_gpu_index
from autotune.units import GiB


def child_environment(device: DeviceSpec) -> dict[str, str]:
    """Environment a trial child sets before anything touches CUDA."""
    if device.kind == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}
    # NVML numbers devices in PCI bus order; make CUDA agree before pinning the child to one.
    return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": str(physical_gpu_index(device.index or 0))}


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
