"""Classify what went wrong in a trial by what happened, never by grepping for "error".

Order (docs/facts.md): exception type, then allocator messages, then the exit signal, then the
wall-clock timeout (decided by the pool).
"""

from __future__ import annotations

import signal

# Allocator messages of every backend, for exceptions whose type does not say OOM (a RuntimeError
# from a C++ allocator, cuBLAS failing to allocate its workspace, ...). Sources: docs/facts.md.
OOM_MESSAGES = (
    "CUDA out of memory",
    "CUDA error: out of memory",
    "HIP out of memory",
    "MPS backend out of memory",
    "XPU out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_NOT_SUPPORTED",  # cuDNN gives this when its workspace cannot be allocated
    "DefaultCPUAllocator: can't allocate memory",
    "std::bad_alloc",
    "Cannot allocate memory",
)

# oneDNN says only this when it cannot allocate what a new primitive needs (its scratchpad, its JIT
# code): under the CPU address-space budget that is an out-of-memory failure (seen here: a conv2d with
# RLIMIT_AS at the process's size, and the backward of a batch 64 BERT over budget); without a budget
# it means an unsupported primitive and stays an error.
ADDRESS_SPACE_OOM_MESSAGES = ("could not create a primitive",)


def is_oom_exception(exc: BaseException, address_space_limited: bool = False) -> bool:
    """True for out-of-memory exceptions, found by type first and by allocator message second.

    Chained exceptions count: the Trainer or a dataloader may wrap the allocator's error.

    Args:
        exc: What the trial raised.
        address_space_limited: The trial ran under the CPU address-space budget, where oneDNN's
            "could not create a primitive" is a failed allocation too.
    """
    messages = OOM_MESSAGES + (ADDRESS_SPACE_OOM_MESSAGES if address_space_limited else ())
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
