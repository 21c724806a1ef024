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

from autotune.ceiling import fits
from autotune.estimate import TRIAL_PROCESS_IMPORTS
from autotune.result import FAILED_STATUSES, Status, TrialResult
from autotune.runner._child import child_main
from autotune.runner._failures import classify_exit
from autotune.runner._job import TrialJob
from autotune.runner._watch import ChildWatch

# Imported once by the forkserver: every child starts with torch and transformers loaded
# (about 0.01 s per child instead of about 5 s). None of them initialises CUDA on import. The CPU
# memory prior measures a process with the same imports (estimate.cpu_process_baseline_bytes).
PRELOAD = list(TRIAL_PROCESS_IMPORTS)
POLL_S = 0.2
# How long a child that sent its result may take to exit by itself before it is killed.
EXIT_GRACE_S = 10.0

_context: ForkServerContext | None = None


def forkserver_context() -> ForkServerContext:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
        _start_forkserver_deaf_to_ctrl_c()
    return _context


def _start_forkserver_deaf_to_ctrl_c() -> None:
    """Start the forkserver (and the resource tracker) with SIGINT ignored from their first instruction.

    An ignored signal stays ignored across ``exec`` (POSIX ``execve``), and Python installs no
    KeyboardInterrupt handler for a SIGINT ignored at startup: a Ctrl-C while the forkserver still
    starts Python or imports torch (seconds) then prints no traceback from it. The orchestrator
    handles Ctrl-C. ``signal.signal`` works in the main thread only; from a worker thread the
    forkserver starts as usual, and ``autotune/forkserver_signals.py`` ignores SIGINT from its first
    preload import on.
    """
    from multiprocessing import forkserver

    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)


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
        # Imported here: _ranks builds on this module's deadlines and its last word on a result.
        from autotune.runner._ranks import run_ranks

        return run_ranks(job, timeout_s, on_tick)
    context = forkserver_context()
    receiver, sender = context.Pipe(duplex=False)
    lifeline_reader, lifeline = context.Pipe(duplex=False)
    process = context.Process(target=target, args=(sender, lifeline_reader, job), name="autotune-trial")
    started = time.perf_counter()
    process.start()
    sender.close()
    lifeline_reader.close()
    assert process.pid is not None
    watch = ChildWatch(process.pid)
    payload: dict | None = None
    deadlines = TrialDeadlines(started, timeout_s, job.workload.compile_timeout_s if job.config.compile != "off" else None)
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
        result = deadlines.result(job.config.compile)
    else:
        near_limit = process.exitcode == -signal.SIGKILL and watch.killed_for_memory()
        status, reason = classify_exit(process.exitcode, near_memory_limit=near_limit)
        result = TrialResult(status=status, error=reason)
    return finished(result, job, wall_s, watch, measured_itself=payload is not None, log_path=job.log_path)


def finished(
    result: TrialResult, job: TrialJob, wall_s: float, watch: ChildWatch, measured_itself: bool, log_path: str
) -> TrialResult:
    """The parent's last word on a trial, one process or several ranks: what it watched from outside
    where the trial measured nothing, the wall time, the log's tail of a failure, the ceiling."""
    if not measured_itself and watch.peak_rss_tree_bytes:
        # The child measured nothing itself: keep what the orchestrator saw from outside.
        result.memory_peaks["orchestrator_sampled_rss_tree_bytes"] = watch.peak_rss_tree_bytes
    result.wall_s = wall_s
    result.ceiling_bytes = job.workload.ceiling_bytes
    if result.status == Status.OOM or result.status in FAILED_STATUSES:
        result.stderr_tail = tail(log_path)
    if result.status == Status.OK and not fits(result.peak_memory_bytes, result.ceiling_bytes):
        result.status = Status.OVER_CEILING
    return result


class TrialDeadlines:
    """When a trial child is killed: the compile budget, then the trial timeout.

    With ``compile_timeout_s`` (torch.compile on and ``--compile-timeout`` given), the child has that
    long to end its first optimizer step, where dynamo and inductor compile (inductor's max-autotune
    on a large model: many minutes), and ``timeout_s`` from then on; otherwise ``timeout_s`` from its
    start. ``expired`` names the budget that ran out.
    """

    def __init__(self, started: float, timeout_s: float, compile_timeout_s: float | None) -> None:
        self.started = started
        self.timeout_s = timeout_s
        self.compile_timeout_s = compile_timeout_s
        self.first_step_at: float | None = None  # when the child said its first step ended
        self.compile_s = 0.0  # dynamo's compile seconds by then, as the child read them
        self.expired: Status | None = None  # TIMEOUT or COMPILE_TIMEOUT
        self.expired_after_s = 0.0

    def first_step_ended(self, now: float, compile_s: float) -> None:
        self.first_step_at, self.compile_s = now, compile_s

    def check(self, now: float) -> bool:
        """Whether a budget ran out at ``now`` (then ``expired`` says which)."""
        if self.compile_timeout_s is not None and self.first_step_at is None:
            if now - self.started > self.compile_timeout_s:
                self.expired = Status.COMPILE_TIMEOUT
        elif now - (self.first_step_at if self.compile_timeout_s is not None else self.started) > self.timeout_s:
            self.expired = Status.TIMEOUT
        if self.expired is not None:
            self.expired_after_s = now - self.started
        return self.expired is not None

    def result(self, compile_mode: str) -> TrialResult:
        """The killed trial's record: which budget, and what the trial cost until then."""
        if self.expired == Status.COMPILE_TIMEOUT:
            return TrialResult(
                status=Status.COMPILE_TIMEOUT,
                error=f"torch.compile ({compile_mode}) still compiling after the {self.compile_timeout_s:g} s compile "
                f"timeout (--compile-timeout): killed after {self.expired_after_s:.0f} s",
                compile_s=self.expired_after_s,
            )
        after_compile = ""
        if self.first_step_at is not None and self.compile_timeout_s is not None:
            after_compile = f" after its first step (compiled in {self.compile_s:.0f} s)"
        return TrialResult(
            status=Status.TIMEOUT,
            error=f"no result within the {self.timeout_s:g} s timeout{after_compile}; killed",
            compile_s=self.compile_s,
        )


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
            if kind == "first_step":
                deadlines.first_step_ended(time.perf_counter(), float(message))
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


def tail(path: str, lines: int = 40, line_chars: int = 300) -> str:
    """The last lines of the child's log, each cut to ``line_chars`` (one huge line, such as the
    list of extension modules after a segfault, must not push the stack out of the tail)."""
    try:
        with open(path, errors="replace") as f:
            last = f.readlines()[-lines:]
    except OSError:
        return ""
    return "".join(line if len(line) <= line_chars else line[:line_chars] + " [...]\n" for line in last)
