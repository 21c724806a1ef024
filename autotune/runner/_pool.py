"""Start trial children from a forkserver, enforce the timeout, collect the result."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess

from autotune.errors import AutotuneError
from autotune.result import Status, TrialResult
from autotune.runner._baseline import trial_process_imports
from autotune.runner._child import child_main
from autotune.runner._deadlines import POLL_S, TrialDeadlines, finished
from autotune.runner._failures import classify_exit
from autotune.runner._job import TrialJob
from autotune.runner._ranks import run_ranks
from autotune.runner._side_effects import TRIAL_ENVIRONMENT
from autotune.runner._watch import ChildWatch

# How long a child that sent its result may take to exit by itself before it is killed.
EXIT_GRACE_S = 10.0

_context: ForkServerContext | None = None
_preload: tuple[str, ...] = ()


def forkserver_context(device_kind: str) -> ForkServerContext:
    """The process's one forkserver, started on first use with the imports of trials on ``device_kind``.

    Imported once by the forkserver (``runner._baseline.trial_process_imports``): every child starts
    with torch and transformers loaded (about 0.01 s per child instead of about 5 s). None of them
    initialises CUDA on import. The CPU memory prior measures a process with the CPU's imports
    (runner._baseline.cpu_process_baseline_bytes).

    Raises:
        RuntimeError: The forkserver runs already with another device's imports (a process runs the
            trials of one device: its search's).
    """
    global _context, _preload
    preload = trial_process_imports(device_kind)
    if _context is None:
        # The forkserver inherits this environment and imports transformers (hence huggingface_hub,
        # which reads its telemetry switch once) before any child sets its own.
        os.environ.update(TRIAL_ENVIRONMENT)
        _context, _preload = multiprocessing.get_context("forkserver"), preload
        _context.set_forkserver_preload(list(preload))
        _start_forkserver_deaf_to_ctrl_c()
    elif preload != _preload:
        raise RuntimeError(f"the forkserver preloaded {_preload} for another device than {device_kind!r}")
    return _context


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the forkserver with SIGINT blocked from its first instruction (the resource tracker, which
    shields itself, first), and the Ctrl-C of that moment kept for the orchestrator.

    A blocked signal stays blocked across ``fork`` and ``exec`` (POSIX: the signal mask is inherited): a
    Ctrl-C while the forkserver still starts Python or imports torch (seconds) waits unseen there, and
    ``autotune/runner/_forkserver_signals.py``, its first preload import, ignores SIGINT (which discards a
    pending one) before it unblocks it. It printed a KeyboardInterrupt traceback from the forkserver before.
    The orchestrator handles Ctrl-C. ``signal.signal`` works in the main thread only; from a worker thread
    the forkserver starts as usual, and ``_forkserver_signals`` ignores SIGINT from its first preload
    import on.
    """
    from multiprocessing import forkserver, resource_tracker

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    # The resource tracker first, on its own: it blocks SIGINT and SIGTERM while it starts, then unblocks
    # both whatever was blocked before (CPython 3.11-3.13, bpo-33613), which inside the block below would
    # undo it.
    resource_tracker.ensure_running()
    # Blocked in this thread only (a signal mask is a thread's): a Ctrl-C meanwhile reaches another thread
    # of this process, a native library's (OpenBLAS starts its own) or Python's, or waits here. It is
    # never ignored: SIGINT ignored here, as the forkserver once inherited it, was discarded by whichever
    # other thread took it, and the search ran on to its end (tests/runner/test_forkserver_signals.py).
    # Its Python handler runs in this thread once the forkserver has started: kept meanwhile, then given
    # to the orchestrator's own handler.
    caught: list[int] = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one pending on this thread reaches `previous` now
    if caught:  # one another thread took while the forkserver started
        signal.raise_signal(signal.SIGINT)


def run_isolated(
    job: TrialJob,
    timeout_s: float,
    on_tick: Callable[[], None] | None = None,
    target: Callable[..., None] = child_main,
) -> TrialResult:
    """Run one trial in a fresh child process and return its result; never raises for a trial failure.

    A trial of several ranks (``job.workload.devices_per_trial > 1``) runs under torch's launcher
    instead (:func:`autotune.runner._ranks.run_ranks`), with the same budgets and the same result.

    Args:
        job: The trial to run.
        timeout_s: Wall-clock limit; the child and its workers are killed past it.
        on_tick: Called about every 0.2 s while the child runs (the orchestrator's heartbeat).
        target: The child's entry point, called as ``target(conn, lifeline, job)``.

    Raises:
        KeyboardInterrupt: After killing the child, so the caller can record the interruption.
    """
    os.makedirs(job.work_dir, exist_ok=True)
    if job.workload.devices_per_trial > 1:
        return run_ranks(job, timeout_s, on_tick)
    context = forkserver_context(job.workload.device.kind)
    receiver, sender = context.Pipe(duplex=False)
    lifeline_reader, lifeline = context.Pipe(duplex=False)
    process = context.Process(target=target, args=(sender, lifeline_reader, job), name="autotune-trial")
    started = time.perf_counter()
    try:
        process.start()
    except (EOFError, OSError) as exc:
        # The forkserver died before it forked the child (killed while it imported torch, say):
        # multiprocessing reads EOF where the child's PID should be (popen_forkserver.py, _launch),
        # or finds its socket refused. Not a result of the trial's config: the caller records the
        # trial as interrupted (study._loop.run_one_trial), and this says why in one line.
        for end in (receiver, sender, lifeline_reader, lifeline):
            end.close()
        reason = f"{type(exc).__name__}: {exc}".rstrip(": ")
        raise AutotuneError(
            f"could not start the trial's process: multiprocessing's forkserver, which starts every trial, died "
            f"({reason}); nothing was measured, and the trial runs first when you run the same command again"
        ) from None
    sender.close()
    lifeline_reader.close()
    assert process.pid is not None
    watch = ChildWatch(process.pid)
    payload: dict | None = None
    deadlines = TrialDeadlines(started, timeout_s, job.workload.compile_timeout_s if job.config.compiled_as else None)
    try:
        payload = _await_result(receiver, process, watch, deadlines, on_tick)
        if payload is not None:
            process.join(timeout=EXIT_GRACE_S)  # let it exit by itself: its log gets flushed
    finally:
        # Whatever happened (a result, a timeout, Ctrl-C): nothing of the trial outlives this call.
        _kill_tree(process)
        receiver.close()
        lifeline.close()
    wall_s = time.perf_counter() - started

    if payload is not None:
        result = TrialResult.from_dict(payload)
    elif deadlines.expired is not None:
        result = deadlines.result(job.config.compiled_as or "")
    else:
        near_limit = process.exitcode == -signal.SIGKILL and watch.killed_for_memory()
        status, reason = classify_exit(process.exitcode, near_memory_limit=near_limit)
        result = TrialResult(status=Status(status), error=reason)
    return finished(result, job, wall_s, watch, measured_itself=payload is not None, log_path=job.log_path)


def _await_result(
    receiver: Connection,
    process: BaseProcess,
    watch: ChildWatch,
    deadlines: TrialDeadlines,
    on_tick: Callable[[], None] | None,
) -> dict | None:
    """Wait for the child's result message; ``None`` if it died first or a budget ran out (``deadlines.expired``)."""
    while True:
        if receiver.poll(POLL_S):
            try:
                kind, message = receiver.recv()
            except (EOFError, OSError):  # the child died without a result (or in the middle of sending it)
                return None
            if kind == "result":
                return message
            if kind == "step":
                deadlines.step_ended(time.perf_counter(), float(message))
            elif kind == "measured":  # the timed steps' figures, before the step on the fullest batch
                deadlines.steps_measured = TrialResult.from_dict(message)
            continue
        watch.sample()
        if not process.is_alive() and not receiver.poll(0):
            return None
        if deadlines.check(time.perf_counter()):
            return None
        if on_tick is not None:
            on_tick()


def _kill_tree(process: BaseProcess) -> None:
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
