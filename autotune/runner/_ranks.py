"""The orchestrator's side of a trial that spans several devices: launch its ranks, wait, combine.

One trial of ``devices_per_trial`` N ranks runs under torch's own launcher
(:mod:`autotune.runner._launch`, a process of its own session started here), one process group
(gloo on the CPU, NCCL on CUDA) per trial on a port of its own. The budgets are the single child's
(:class:`autotune.runner._deadlines.TrialDeadlines`); whatever ends the wait (a result, a timeout, a
rank's death, Ctrl-C), the launcher's group and every rank's group are killed before this returns,
so no rank outlives its trial and its port is free again.

The ranks' results become one: the whole group's throughput (each rank's samples/s, summed: the
Trainer's global batch is micro_batch x grad_accum x N), the largest rank's peak (device and host),
an OOM on any rank is the trial's OOM, a rank's death or a failed launch is the trial's failure
(:func:`autotune.runner._failures.classify_launch`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import psutil

from autotune.result import Status, TrialResult
from autotune.runner._deadlines import POLL_S, TrialDeadlines, finished
from autotune.runner._failures import classify_launch
from autotune.runner._job import TrialJob
from autotune.runner._launch import (
    ORCHESTRATOR_PID_ENV,
    RANK_PORT_ENV,
    first_step_file,
    launch_file,
    rank_file,
)
from autotune.runner._limits import ranks_environment
from autotune.runner._watch import ChildWatch
from autotune.spec.devices import usable_cores

# Throughput figures that add up over the ranks (each rank measured its own share of the global batch).
SUMMED_OVER_RANKS = ("samples_per_s", "tokens_per_s", "real_tokens_per_s", "model_tflops", "hardware_tflops")


def free_port() -> int:
    """A TCP port free now on 127.0.0.1 (the kernel's choice), for one trial's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_ranks(
    job: TrialJob, timeout_s: float, on_tick: Callable[[], None] | None = None, port: int | None = None
) -> TrialResult:
    """Run one trial as ``job.workload.devices_per_trial`` ranks; never raises for a trial failure.

    Args:
        job: The trial. Its early stop is off for a multi-rank trial: a rank that stopped alone
            would leave the others waiting in their next all-reduce.
        timeout_s: Wall-clock limit, as :func:`autotune.runner.run_isolated`'s.
        on_tick: Called about every 0.2 s while the ranks run.
        port: The rendezvous port (``None``: a free one).

    Raises:
        KeyboardInterrupt: After killing every process of the trial.
    """
    ranks = job.workload.devices_per_trial
    job = dataclasses.replace(job, prune_below_samples_per_s=None)
    os.makedirs(job.work_dir, exist_ok=True)
    _remove_earlier_attempt(job.work_dir, ranks)
    job_path = os.path.join(job.work_dir, "job.pickle")
    with open(job_path, "wb") as f:
        pickle.dump(job, f)
    port = free_port() if port is None else port
    env = {
        **os.environ,
        **ranks_environment(job.workload.device, ranks, job.workload.rank_devices, job.work_dir, usable_cores()),
        ORCHESTRATOR_PID_ENV: str(os.getpid()),
        RANK_PORT_ENV: str(port),
        # The ranks import what this process imports (the package, the user's --callback modules).
        "PYTHONPATH": os.pathsep.join(path for path in sys.path if path),
    }
    started = time.perf_counter()
    with open(job.log_path, "ab") as log:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "autotune.runner._launch", "launch", job_path],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    watch = ChildWatch(launcher.pid)
    compile_timeout = job.workload.compile_timeout_s if job.config.compiled_as else None
    deadlines = TrialDeadlines(started, timeout_s, compile_timeout)
    try:
        _await_launcher(launcher, job.work_dir, watch, deadlines, on_tick)
    finally:
        kill_trial(launcher, job.work_dir, ranks)
    wall_s = time.perf_counter() - started

    results = _rank_results(job.work_dir, ranks)
    if deadlines.expired is not None:
        result, log_path = deadlines.result(job.config.compiled_as or ""), job.log_path
        result.error = _never_started(job.work_dir, ranks) + result.error
    elif len(results) == ranks and all(r.status != Status.ERROR and r.status != Status.OOM for r in results.values()):
        result, log_path = combine_ranks([results[rank] for rank in range(ranks)]), job.log_path
    else:
        outcome = _read_json(launch_file(job.work_dir)) or {"failures": {}, "error": "the launcher wrote no outcome"}
        near_limit = watch.killed_for_memory()
        status, reason, failed_rank = classify_launch(outcome, results, ranks, port, near_limit)
        result = TrialResult(status=status, error=reason)
        log_path = rank_file(job.work_dir, failed_rank, "log") if failed_rank is not None else job.log_path
    return finished(result, job, wall_s, watch, measured_itself=bool(results), log_path=log_path)


def combine_ranks(results: list[TrialResult]) -> TrialResult:
    """One trial's record out of its ranks' (rank 0 first), all of which ran.

    Throughput is the group's: each rank's figure summed (:data:`SUMMED_OVER_RANKS`). Memory is the
    largest rank's, source by source (device and host), so the ceiling judges the fullest device. A pass before
    training is the group's too: the slowest rank's time over all their samples.
    The rest (step times, loss, status) is rank 0's: the ranks step together.
    """
    first = results[0]
    combined = dataclasses.replace(first, memory_peaks={}, runtime=dict(first.runtime))
    for name in SUMMED_OVER_RANKS:
        setattr(combined, name, sum(getattr(result, name) for result in results))
    for result in results:
        for source, peak in result.memory_peaks.items():
            combined.memory_peaks[source] = max(peak, combined.memory_peaks.get(source, 0))
    combined.peak_memory_bytes = max(result.peak_memory_bytes for result in results)
    # A pass before training (DPO's precomputed reference): each rank ran it over its shard, side by side, so the
    # trial's took the slowest rank's time over every rank's samples (as the prior predicts it: a shard each).
    combined.setup_pass_s = max(result.setup_pass_s for result in results)
    combined.setup_pass_samples = sum(result.setup_pass_samples for result in results)
    combined.runtime["ranks"] = str(len(results))
    combined.runtime["rank_peak_bytes"] = ",".join(str(result.peak_memory_bytes) for result in results)
    return combined


def kill_trial(launcher: subprocess.Popen, work_dir: str, ranks: int) -> None:
    """SIGKILL the launcher's group and every rank's group (each rank leads a session of its own,
    with its dataloader workers), then reap them: nothing of the trial survives, its port is free."""
    groups = {launcher.pid}
    try:
        descendants = psutil.Process(launcher.pid).children(recursive=True)
    except psutil.Error:
        descendants = []
    for process in descendants:
        try:
            groups.add(os.getpgid(process.pid))
        except (ProcessLookupError, PermissionError):
            pass
    for rank in range(ranks):
        pid = _read_pid(rank_file(work_dir, rank, "pid"))
        if pid is not None:
            groups.add(pid)  # a rank's pid is its group's (start_new_session)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    launcher.wait(timeout=10)
    psutil.wait_procs([p for p in descendants if p.is_running()], timeout=10)


def _await_launcher(
    launcher: subprocess.Popen,
    work_dir: str,
    watch: ChildWatch,
    deadlines: TrialDeadlines,
    on_tick: Callable[[], None] | None,
) -> None:
    """Wait until the launcher exits or a budget runs out (then ``deadlines.expired`` says which)."""
    while launcher.poll() is None:
        watch.sample()
        if deadlines.first_step_at is None:
            first = _read_json(first_step_file(work_dir))
            if first is not None:
                deadlines.first_step_ended(time.perf_counter(), float(first["compile_s"]))
        if deadlines.check(time.perf_counter()):
            return
        if on_tick is not None:
            on_tick()
        time.sleep(POLL_S)


def _never_started(work_dir: str, ranks: int) -> str:
    """What a timed-out trial's reason begins with when a rank never started its trial: the others
    then waited at the rendezvous until the timeout. (With ``use_cpu`` transformers passes no
    ``ddp_timeout`` to the process group, transformers/training_args.py ``_setup_devices``, so on the
    CPU torch's 30-minute default would hold them: the trial timeout is what ends the wait.)"""
    missing = [str(rank) for rank in range(ranks) if _read_pid(rank_file(work_dir, rank, "pid")) is None]
    if not missing:
        return ""
    return f"rendezvous of {ranks} ranks timed out: rank {', '.join(missing)} never started; "


def _rank_results(work_dir: str, ranks: int) -> dict[int, TrialResult]:
    found = {}
    for rank in range(ranks):
        payload = _read_json(rank_file(work_dir, rank, "json"))
        if payload is not None:
            found[rank] = TrialResult.from_dict(payload)
    return found


def _remove_earlier_attempt(work_dir: str, ranks: int) -> None:
    """A retried trial runs in the same directory: no result, pid or outcome of the last try may count."""
    paths = [launch_file(work_dir), first_step_file(work_dir)]
    paths += [rank_file(work_dir, rank, kind) for rank in range(ranks) for kind in ("json", "pid")]
    for path in paths:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


def _read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _read_pid(path: str) -> int | None:
    try:
        with open(path) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None
