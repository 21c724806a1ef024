"""Classify what went wrong in a trial by what happened, never by grepping for "error".

Order (docs/facts.md): exception type, then allocator messages, then the exit signal, then the
wall-clock timeout (decided by the pool).
"""

from __future__ import annotations

import re
import signal
from typing import Any

from autotune.result import Status

# Allocator messages of every backend, for exceptions whose type does not say OOM (a RuntimeError
# from a C++ allocator, cuBLAS failing to allocate its workspace, ...). Sources: docs/facts.md.
OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "HIP out of memory",
    "MPS backend out of memory",
    "XPU out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    # torch's CUDA driver-API checks (c10/cuda/driver_api.h, C10_CUDA_DRIVER_CHECK) say "CUDA driver
    # error: out of memory" when cuMemCreate/cuMemMap fail (expandable segments, NCCL buffers).
    "CUDA driver error: out of memory",
    # Triton's launcher reports a failed CUDA call as "Triton Error [CUDA]: <cuGetErrorString>", so an
    # inductor kernel that cannot get device memory raises "Triton Error [CUDA]: out of memory"
    # (pytorch/pytorch#98186). Triton's "OutOfResources: out of resource: shared memory" is not
    # device memory (a kernel config too large for the SM), so only the device wording counts.
    "Triton Error [CUDA]: out of memory",
    "DefaultCPUAllocator: can't allocate memory",
    "std::bad_alloc",
    "Cannot allocate memory",
)

# oneDNN says only this when it cannot allocate what a new primitive needs (its scratchpad, its JIT
# code): under the CPU address-space budget that is an out-of-memory failure (seen here: a conv2d with
# RLIMIT_AS at the process's size, and the backward of a batch 64 BERT over budget); without a budget
# it means an unsupported primitive and stays an error.
ADDRESS_SPACE_OOM_MESSAGES = ("could not create a primitive",)

# cuDNN answers NOT_SUPPORTED both when no algorithm fits the memory left for its workspace and when
# the layer's shape is simply unsupported (torch/backends/cudnn, aten/src/ATen/native/cudnn/Conv_v8.cpp
# tries every engine and reports the last error). It is an OOM only with a sign of memory pressure:
# the caching allocator held most of the device when it failed (see ``memory_pressure``).
#
# cublasCreate fails with NOT_INITIALIZED when it cannot allocate the handle's memory (the first matmul
# of a new stream or of the backward pass, at a trial's peak: torch's
# aten/src/ATen/cuda/CublasHandlePool.cpp creates handles lazily; the cuBLAS docs list "resource
# allocation failed" under CUBLAS_STATUS_NOT_INITIALIZED), but just as often on a first run because
# the driver is older than the CUDA that torch was built for: an OOM only under memory pressure too,
# otherwise an error that names the library (``library_failure``).
PRESSURE_OOM_MESSAGES = ("CUDNN_STATUS_NOT_SUPPORTED", "CUBLAS_STATUS_NOT_INITIALIZED")

# What a pressure-only OOM text means when the device was not full: the library and the likely cause.
LIBRARY_FAILURES = {
    "CUBLAS_STATUS_NOT_INITIALIZED": (
        "cuBLAS could not initialise with GPU memory free: most often the NVIDIA driver does not match "
        "the CUDA that torch was built for (compare `nvidia-smi`'s CUDA version with torch.version.cuda)"
    ),
    "CUDNN_STATUS_NOT_SUPPORTED": "cuDNN does not support this layer's shape or dtype (not for want of memory)",
}

# The allocator held at least this share of the device when a failure happened: memory pressure.
# cuDNN's workspaces for a large convolution or attention are tens to hundreds of MiB, so a failure
# with more than a tenth of a GPU (>= 1.6 GB on a 16 GB V100) free is not for want of memory.
PRESSURE_RESERVED_SHARE = 0.9


def memory_pressure(reserved_bytes: int, total_bytes: int, free_bytes: int | None = None) -> bool:
    """Whether a CUDA failure happened with the device nearly full.

    Args:
        reserved_bytes: ``torch.cuda.memory_reserved()`` at the failure (what the caching allocator
            holds: freed blocks stay reserved, so it is the high-water mark of the failed step).
        total_bytes: The device's (or MIG slice's) memory, ``torch.cuda.mem_get_info()[1]``.
        free_bytes: ``torch.cuda.mem_get_info()[0]`` at the failure, if read: memory other processes
            hold counts as pressure too.
    """
    if total_bytes <= 0:
        return False
    if reserved_bytes >= PRESSURE_RESERVED_SHARE * total_bytes:
        return True
    return free_bytes is not None and free_bytes <= (1 - PRESSURE_RESERVED_SHARE) * total_bytes


def is_oom_exception(exc: BaseException, address_space_limited: bool = False, memory_pressure: bool = False) -> bool:
    """True for out-of-memory exceptions, found by type first and by allocator message second.

    Chained exceptions count: the Trainer or a dataloader may wrap the allocator's error.

    Args:
        exc: What the trial raised.
        address_space_limited: The trial ran under the CPU address-space budget, where oneDNN's
            "could not create a primitive" is a failed allocation too.
        memory_pressure: The device was nearly full when it failed (:func:`memory_pressure`), where
            cuDNN's "CUDNN_STATUS_NOT_SUPPORTED" means its workspace could not be allocated.
    """
    messages = (
        OOM_MESSAGES
        + (ADDRESS_SPACE_OOM_MESSAGES if address_space_limited else ())
        + (PRESSURE_OOM_MESSAGES if memory_pressure else ())
    )
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, MemoryError) or type(current).__name__ == "OutOfMemoryError":
            return True
        if any(message in str(current) for message in messages):
            return True
        current = current.__cause__ or current.__context__
    return False


def library_failure(exc: BaseException) -> str | None:
    """The library a CUDA failure that is not an OOM came from, and its likely cause, in one sentence.

    For the texts of ``PRESSURE_OOM_MESSAGES`` raised without memory pressure (chained exceptions
    count); ``None`` for any other failure.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for message, note in LIBRARY_FAILURES.items():
            if message in str(current):
                return note
        current = current.__cause__ or current.__context__
    return None


# torch/utils/cpp_extension.py (``_run_ninja_build``) raises ``RuntimeError("Error building extension
# '<name>': <ninja's output>")`` when a JIT-compiled op fails to build: DeepSpeed builds its ops so on
# first use (deepspeed/ops/op_builder/builder.py ``OpBuilder.jit_load``): on the CPU the
# ``deepspeed_shm_comm`` op of every ZeRO trial, and ``cpu_adam`` for offload.
_OP_BUILD_FAILED = re.compile(r"Error building extension '([\w.]+)'")
# The line of the build's output that says why (the shell's "not found", the compiler's "error:").
_BUILD_CAUSE = re.compile(r"^(?:\[rank\d+\]: )?(.*(?:not found|No such file|error:|fatal error).*)$", re.MULTILINE)


def op_build_failure(exc: BaseException) -> str | None:
    """One line for a trial whose C++ op could not be built (no compiler, no ninja, a compile
    error): the op, the build's own cause, and what it needs; ``None`` for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        match = _OP_BUILD_FAILED.search(str(current))
        if match:
            cause = _BUILD_CAUSE.search(str(current))
            why = f" ({cause.group(1).strip()[:200]})" if cause else ""
            return (
                f"could not build the C++ op {match.group(1)}{why}: DeepSpeed compiles its ops on first use and "
                "needs a C++ compiler and ninja (apt install g++; pip install ninja); the build's output is in the trial's log"
            )
        current = current.__cause__ or current.__context__
    return None


def classify_exit(exitcode: int | None, near_memory_limit: bool) -> tuple[str, str]:
    """Status and reason for a child that died without sending a result.

    Args:
        exitcode: ``multiprocessing`` exit code: negative for a signal.
        near_memory_limit: The kernel counted an OOM kill while the child ran, or the host had
            little memory left at the orchestrator's last sample (see ``_watch.killed_for_memory``).

    Returns:
        (status, one-line reason).
    """
    if exitcode is not None and exitcode < 0:
        signum = -exitcode
        name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ else str(signum)
        if signum == signal.SIGKILL and near_memory_limit:
            return "oom", f"killed by {name} with memory near the host limit (the kernel's OOM killer)"
        return "crash", f"killed by {name}"
    return "crash", f"exited with code {exitcode} without a result"


# What torch says when a rank cannot listen on the rendezvous port (c10d's TCPStore: "The server
# socket has failed to listen on any local network address ... address already in use (errno: 98)";
# torch/csrc/distributed/c10d/socket.cpp) and when the ranks did not all meet in time (the store's
# "Timed out after N seconds waiting for clients. M/N clients joined." from TCPStore's wait,
# torch/csrc/distributed/c10d/TCPStore.cpp; the elastic agent's RendezvousTimeoutError).
PORT_IN_USE_MESSAGES = ("address already in use", "EADDRINUSE", "errno: 98")
RENDEZVOUS_TIMEOUT_MESSAGES = ("waiting for clients", "RendezvousTimeoutError", "Socket Timeout", "timed out")


def classify_launch(
    outcome: dict, results: dict[int, Any], ranks: int, port: int, near_memory_limit: bool
) -> tuple[Status, str, int | None]:
    """Status, one-line reason and the rank to blame (``None``: the launch) of a multi-rank trial
    that did not end with every rank's result.

    Args:
        outcome: What the launcher saw (``launch.json``: ``failures`` by rank with ``exitcode`` and
            ``signal``; ``error``: an exception of the launch itself).
        results: The results the ranks wrote, by rank (an OOM or an error among them).
        ranks: How many ranks the trial had.
        port: Its rendezvous port.
        near_memory_limit: As :func:`classify_exit`'s.
    """
    by_rank = sorted(results.items())
    for rank, result in by_rank:  # an OOM on any rank is the trial's OOM
        if result.status == Status.OOM:
            return Status.OOM, f"rank {rank} of {ranks}: {result.error}", rank
    texts = [outcome.get("error", "")] + [result.error for _, result in by_rank]
    if any(message.lower() in text.lower() for text in texts for message in PORT_IN_USE_MESSAGES):
        return Status.CRASH, f"rendezvous port {port} already in use: the {ranks} ranks could not meet", None
    failures = {int(rank): failure for rank, failure in outcome.get("failures", {}).items()}
    # The rank that died first by a signal (the agent then stops the others with SIGTERM).
    for rank, failure in sorted(failures.items(), key=lambda item: item[1]["signal"] == "SIGTERM"):
        if rank in results:
            continue
        status, reason = classify_exit(failure["exitcode"], near_memory_limit)
        return Status(status), f"rank {rank} of {ranks} {reason}", rank
    if any(message.lower() in text.lower() for text in texts for message in RENDEZVOUS_TIMEOUT_MESSAGES):
        found = next(text for text in texts if any(m.lower() in text.lower() for m in RENDEZVOUS_TIMEOUT_MESSAGES))
        return Status.CRASH, f"rendezvous of {ranks} ranks timed out: {found}"[:500], None
    for rank, result in by_rank:
        if result.status == Status.ERROR:
            return Status.ERROR, f"rank {rank} of {ranks}: {result.error}", rank
    if outcome.get("error"):
        return Status.CRASH, f"the launch of {ranks} ranks failed: {outcome['error']}", None
    missing = [rank for rank in range(ranks) if rank not in results]
    return (
        Status.CRASH,
        f"rank {missing[0] if missing else 0} of {ranks} ended without a result",
        missing[0] if missing else None,
    )
