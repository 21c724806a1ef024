"""What bounds a trial child: its environment before CUDA starts, and its address space on the CPU."""

from __future__ import annotations

import os
import resource
import socket
from collections.abc import Mapping
from typing import Any

from autotune.runner._side_effects import TRIAL_ENVIRONMENT
from autotune.spec.devices import DeviceSpec
from autotune.spec.nvml_devices import visible_device_id
from autotune.units import GiB


def apply_allocator_env(allocator_env: dict[str, str]) -> None:
    """Make this process's allocator settings exactly ``allocator_env``, before CUDA starts."""
    for name in ALLOCATOR_ENV:
        os.environ.pop(name, None)
    os.environ.update(allocator_env)


def child_environment(device: DeviceSpec, work_dir: str | None = None) -> dict[str, str]:
    """Environment a trial child sets before anything touches CUDA.

    Args:
        device: The child's device.
        work_dir: The trial's own directory, one of the search's work root's children
            (``study._record.trial_work_dir``): the inductor cache goes in the work root, shared
            by every trial of the search, so a config compiles once (a retry, a confirmation
            re-run and configs that share graphs reuse inductor's FX graph and autotuning caches).
            A ``TORCHINDUCTOR_CACHE_DIR`` the user set is kept.
    """
    found = dict(TRIAL_ENVIRONMENT)  # no reporting to a service the user's run reports to
    if work_dir is not None and not os.environ.get(INDUCTOR_CACHE_ENV):
        found[INDUCTOR_CACHE_ENV] = os.path.join(os.path.dirname(os.path.abspath(work_dir)), "inductor-cache")
    if device.kind == "cpu":
        return {**found, "CUDA_VISIBLE_DEVICES": ""}
    # NVML numbers devices in PCI bus order; make CUDA agree before pinning the child to one. The
    # entry is passed on as the user gave it (an index, a GPU UUID or a MIG instance), so a child
    # on a MIG slice sees that slice as its device 0.
    return {**found, "CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": visible_device_id(device.index or 0)}


def single_rank_environment() -> dict[str, str]:
    """torch.distributed's rendezvous for a trial of one rank (DeepSpeed initialises a process group
    even then: deepspeed/comm/comm.py ``init_distributed`` reads these variables, and without them
    tries MPI discovery; accelerate turns FSDP on only in a distributed state, which it reads from
    ``LOCAL_RANK``/``WORLD_SIZE``: accelerate/state.py ``PartialState.__init__``). A free port on the loopback, so concurrent trials never share one; a trial
    of several ranks gets them from its launcher instead."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
    }


def ranks_environment(
    device: DeviceSpec, ranks: int, rank_devices: tuple[int, ...], work_dir: str, cpu_count: int
) -> dict[str, str]:
    """Environment of a multi-rank trial's launcher and its ranks (they inherit it).

    On CUDA, the trial sees its own GPUs (``rank_devices``) and nothing else; torch's launcher gives
    each rank its ``LOCAL_RANK``, which accelerate turns into ``cuda:<LOCAL_RANK>``
    (accelerate/state.py, ``PartialState._prepare_backend`` / ``set_device``). On the CPU each rank
    gets an equal share of the cores as its intra-op threads (``OMP_NUM_THREADS``, which torch's
    OpenMP pool reads at start), so N ranks never run more threads than there are cores; torchrun
    itself sets 1 where the variable is unset (torch/distributed/run.py, ``config_from_args``),
    which leaves most cores idle with few ranks.
    """
    found = child_environment(device, work_dir)
    if device.kind == "cpu":
        return {**found, "OMP_NUM_THREADS": str(max(1, cpu_count // ranks))}
    return {**found, "CUDA_VISIBLE_DEVICES": ",".join(visible_device_id(index) for index in rank_devices)}


# Where inductor keeps its compiled graphs and autotuning results (torch/_inductor/runtime/cache_dir_utils.py,
# ``cache_dir``: default a directory under the system's temp dir).
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


# The caching allocator's settings: PYTORCH_ALLOC_CONF, and PYTORCH_CUDA_ALLOC_CONF "for backward
# compatibility ... with lower priority" (torch/include/c10/core/AllocatorConfig.h in the installed
# torch). expandable_segments:True changes the
# reserved-over-allocated overhead, so a peak measured under it holds only under it.
ALLOCATOR_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


# The name every torch reads: the only one before the unified AllocatorConfig (torch 2.9), its
# backward-compatible alias since; PYTORCH_ALLOC_CONF is not read by every version (silently ignored
# for CUDA's expandable segments on 2.9.1: pytorch/pytorch#183387). docker/Dockerfile sets this one.
ALLOCATOR_ENV_EVERY_TORCH_READS = "PYTORCH_CUDA_ALLOC_CONF"


def allocator_settings(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allocator variables set in this process's environment (recorded with each trial)."""
    read: Mapping[str, str] = os.environ if environ is None else environ
    return {name: read[name] for name in ALLOCATOR_ENV if read.get(name)}


def allocator_read_back(torch_module: Any) -> dict[str, str]:
    """Whether the CUDA caching allocator runs with expandable segments, as torch applied it (not as a
    variable asked: a name this torch does not read is ignored silently, pytorch/pytorch#183387).

    Read from the allocator's snapshot (``torch.cuda.memory._snapshot()["allocator_settings"]``,
    the reading that issue uses); empty where this torch's snapshot has no such entry.

    Args:
        torch_module: ``torch``, in a process that used CUDA (a parameter so a fake can stand in).
    """
    try:
        settings = torch_module.cuda.memory._snapshot().get("allocator_settings")
    except Exception:  # noqa: BLE001 - a reading, never a reason to fail a trial
        return {}
    if not isinstance(settings, dict) or "expandable_segments" not in settings:
        return {}
    return {"allocator_expandable_segments": "true" if settings["expandable_segments"] else "false"}


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
