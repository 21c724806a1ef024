"""Entry point of a trial child process (started by the forkserver)."""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import threading
import traceback
from multiprocessing.connection import Connection

from autotune.result import Status, TrialResult
from autotune.runner._failures import is_oom_exception, library_failure, op_build_failure
from autotune.runner._job import TrialJob
from autotune.runner._limits import apply_allocator_env, child_environment, single_rank_environment
from autotune.runner._memory_probe import failure_memory_pressure


def child_main(conn: Connection, lifeline: Connection, job: TrialJob) -> None:
    """Set the child up, run the trial, send one ``("result", dict)`` message, exit.

    The child leads its own process group, so the orchestrator can kill it together with its
    dataloader workers, and a Ctrl-C in the terminal reaches only the orchestrator. Its stdout and
    stderr go to ``job.log_path``, whose tail is kept with the trial if something goes wrong; a
    fatal signal (SIGSEGV, SIGABRT) writes the Python stack there too.

    Args:
        conn: Where the result goes.
        lifeline: Never written to; it reads end-of-file once the orchestrator is gone, even when
            SIGKILL gave the orchestrator no chance to clean up. The child then kills itself and
            its workers, so no orphan keeps training next to the trials of a resumed search.
        job: The trial to run.
    """
    os.setsid()
    # A process the forkserver starts takes "forkserver" as its default start method (CPython's
    # multiprocessing/spawn.py: prepare(); tests/runner/test_child.py), so the Trainer's DataLoader
    # workers started through a new forkserver that imported torch from scratch: 8-15 s of every trial
    # with workers on a 2-core CPU (issue 29), which the user's run, a plain `python` process with the
    # platform's default, never pays. Back to that default.
    multiprocessing.set_start_method(None, force=True)
    signal.signal(
        signal.SIGINT, signal.default_int_handler
    )  # the forkserver ignores it (autotune/runner/_forkserver_signals.py)
    _die_with_orchestrator(lifeline)
    os.environ.update(child_environment(job.workload.device, job.work_dir))  # before anything initialises CUDA
    # DeepSpeed and FSDP both shard over a process group, even of one rank: the launcher's variables.
    if job.config.shards_over_ranks and job.workload.devices_per_trial == 1:
        os.environ.update(single_rank_environment())
    apply_allocator_env(job.workload.allocator_env)
    redirect_output(job.log_path)
    faulthandler.enable(all_threads=False)  # the crashing thread's stack: short enough for the kept tail
    conn.send(("started", os.getpid()))
    try:
        from autotune.runner._trial import train_and_measure

        result = train_and_measure(
            job,
            on_step=lambda compile_s: conn.send(("step", compile_s)),
            on_measured=lambda measured: conn.send(("measured", measured)),
        )
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a recorded result
        traceback.print_exc()
        result = failure_result(exc, job)
    conn.send(("result", result.to_dict()))
    conn.close()


def failure_result(exc: BaseException, job: TrialJob) -> TrialResult:
    """The record of a trial that raised ``exc``: an OOM (by type, then message) or an error, one line.

    The one rule of a trial process's exception, for the single child and for each rank of a
    multi-rank trial (:mod:`autotune.runner._launch`).
    """
    oom = is_oom_exception(
        exc,
        address_space_limited=job.workload.address_space_bytes is not None,
        memory_pressure=job.workload.device.kind == "cuda" and failure_memory_pressure(),
    )
    error = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    library = None if oom else library_failure(exc)
    return TrialResult(
        status=Status.OOM if oom else Status.ERROR,
        error=op_build_failure(exc) or (f"{library}. {error}" if library else error),
        ceiling_bytes=job.workload.ceiling_bytes,
    )


def _die_with_orchestrator(lifeline: Connection) -> None:
    def wait_for_orphaning() -> None:
        try:
            lifeline.recv()
        except (EOFError, OSError):
            pass
        os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=wait_for_orphaning, daemon=True, name="autotune-lifeline").start()


def redirect_output(path: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
