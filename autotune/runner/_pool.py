"""Start trial children from a forkserver, enforce the timeout, collect the result."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.context import ForkServerContext

from autotune.result import TrialResult
from autotune.runner._child import child_main
from autotune.runner._failures import classify_exit
from autotune.runner._job import TrialJob

# Imported once by the forkserver: every child starts with torch and transformers loaded
# (about 0.01 s per child instead of about 5 s). None of them initialises CUDA on import.
PRELOAD = ["autotune.runner._trial"]

_context: ForkServerContext | None = None


def forkserver_context() -> ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def run_isolated(
    job: TrialJob,
    timeout_s: float,
    on_tick: Callable[[], None] | None = None,
    target: Callable[..., None] = child_main,
) -> TrialResult:
    """Run one trial in a fresh child process and return its result; never raises for a trial failure.

    Args:
        job: The trial to run.
        timeout_s: Wall-clock limit; the child and its workers are killed past it.
        on_tick: Called about every 0.2 s while the child runs (the orchestrator's heartbeat).
        target: The child's entry point (tests pass others to inject faults).

    Raises:
        KeyboardInterrupt: After killing the child, so the caller can record the interruption.
    """
    os.makedirs(job.work_dir, exist_ok=True)
    context = forkserver_context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=target, args=(sender, job), name="autotune-trial")
    started = time.perf_counter()
    process.start()
    sender.close()
    payload: dict | None = None
    timed_out = False
    try:
        while payload is None:
            if receiver.poll(0.2):
                try:
                    kind, message = receiver.recv()
                except EOFError:  # the child died without a result
                    break
                if kind == "result":
                    payload = message
                continue
            if not process.is_alive() and not receiver.poll(0):
                break
            if time.perf_counter() - started > timeout_s:
                timed_out = True
                break
            if on_tick is not None:
                on_tick()
    except KeyboardInterrupt:
        _kill_tree(process)
        raise
    finally:
        receiver.close()
    if timed_out or payload is None:
        _kill_tree(process)
    process.join(timeout=30)
    _kill_tree(process)  # dataloader workers left behind
    wall_s = time.perf_counter() - started

    if payload is not None:
        result = TrialResult.from_dict(payload)
    elif timed_out:
        result = TrialResult(status="timeout", error=f"no result within the {timeout_s:.0f} s timeout; killed")
    else:
        status, reason = classify_exit(process.exitcode, near_memory_limit=False)
        result = TrialResult(status=status, error=reason)
    result.wall_s = wall_s
    result.ceiling_bytes = job.ceiling_bytes
    if result.status != "ok":
        result.stderr_tail = _tail(job.log_path)
    if result.status == "ok" and result.peak_memory_bytes > job.ceiling_bytes:
        result.status = "over_ceiling"
    return result


def _kill_tree(process: multiprocessing.process.BaseProcess) -> None:
    """SIGKILL the child's process group (the child and its dataloader workers)."""
    if process.pid is None:
        return
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.is_alive():
        process.kill()
    process.join(timeout=10)


def _tail(path: str, lines: int = 25) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])[-4000:]
    except OSError:
        return ""
