"""The processes of a multi-rank trial: the launcher (torch's elastic agent) and each rank.

``python -m autotune.runner._launch launch <job.pickle>`` is started by the orchestrator
(:mod:`autotune.runner._ranks`) in a session of its own. It runs torch's own launcher through its
API, ``torch.distributed.launcher.api.elastic_launch`` (what ``torchrun`` calls:
torch/distributed/run.py, ``run``), with a static rendezvous on 127.0.0.1 and the job's port, no
restarts, and ``python -m autotune.runner._launch rank <job.pickle>`` as every rank's command. The
agent starts each rank in a session of its own
(torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py, ``_popen``:
``start_new_session=True``), so each rank writes its pid where the orchestrator finds it and kills
its group. What the agent saw (a rank's exit code or signal, a rendezvous or port failure) goes
into ``launch.json``; each rank writes its own result into ``rank<R>.json``.

A rank is the single child's trial (:func:`autotune.runner._trial.train_and_measure`) under the
environment torch's launcher sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
``MASTER_PORT``): the Trainer's accelerator then trains with DDP (gloo on the CPU, NCCL on CUDA),
or with whatever DeepSpeed or FSDP configuration the TrialConfig maps into ``TrainingArguments``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import pickle
import signal
import sys
import threading
import time
import traceback

from autotune.runner._job import TrialJob

ORCHESTRATOR_PID_ENV = "AUTOTUNE_ORCHESTRATOR_PID"
RANK_PORT_ENV = "AUTOTUNE_MASTER_PORT"
# How long the agent waits for every rank to join the rendezvous, and each rank's process group set-up
# (torch/distributed/elastic/rendezvous/static_tcp_rendezvous.py reads ``timeout``).
RENDEZVOUS_TIMEOUT_S = 120


def load_job(path: str) -> TrialJob:
    with open(path, "rb") as f:
        return pickle.load(f)


def launch_file(work_dir: str) -> str:
    return os.path.join(work_dir, "launch.json")


def rank_file(work_dir: str, rank: int, kind: str) -> str:
    """``rank<R>.json`` (its result), ``rank<R>.pid``, ``rank<R>.log``; ``first_step`` is rank 0's."""
    return os.path.join(work_dir, f"rank{rank}.{kind}")


def first_step_file(work_dir: str) -> str:
    return os.path.join(work_dir, "first_step")


def write_json(path: str, payload: dict) -> None:
    """Whole or nothing: the orchestrator never reads half a file."""
    with open(path + ".tmp", "w") as f:
        json.dump(payload, f)
    os.replace(path + ".tmp", path)


def die_with_orchestrator() -> None:
    """Kill this process's group once the orchestrator is gone (a SIGKILLed search leaves no rank
    training): the ranks are not its children, so no pipe's end-of-file reaches them as it reaches
    the single child (:func:`autotune.runner._child.child_main`); they poll its pid instead."""
    orchestrator = int(os.environ[ORCHESTRATOR_PID_ENV])

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(orchestrator, 0)
            except ProcessLookupError:
                os.killpg(os.getpgrp(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="autotune-lifeline").start()


def launch(job_path: str) -> None:
    """The launcher: torch's elastic agent runs the ranks; what it saw goes into ``launch.json``."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    die_with_orchestrator()
    job = load_job(job_path)
    ranks = job.workload.devices_per_trial
    port = int(os.environ[RANK_PORT_ENV])
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=ranks,
        run_id=f"autotune-{os.getpid()}",
        rdzv_backend="static",  # torchrun's own choice with --master-port (torch/distributed/run.py, config_from_args)
        rdzv_endpoint=f"127.0.0.1:{port}",
        rdzv_configs={"rank": 0, "timeout": RENDEZVOUS_TIMEOUT_S},
        max_restarts=0,  # a failed rank is the trial's failure, never a restart
        monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=os.path.join(job.work_dir, "elastic")),
        shutdown_timeout=5,  # the other ranks get SIGTERM, then SIGKILL after this
    )
    outcome: dict = {"failures": {}, "error": ""}
    try:
        elastic_launch(config, sys.executable)("-m", "autotune.runner._launch", "rank", job_path)
    except ChildFailedError as exc:
        outcome["failures"] = {
            str(rank): {"exitcode": failure.exitcode, "signal": failure.signal_name() if failure.exitcode < 0 else ""}
            for rank, failure in exc.failures.items()
        }
    except BaseException as exc:  # noqa: BLE001 - a port in use, a rendezvous that timed out: recorded
        traceback.print_exc()
        outcome["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
    write_json(launch_file(job.work_dir), outcome)


def rank(job_path: str) -> None:
    """One rank: the single child's trial, its result written to ``rank<R>.json``."""
    from autotune.runner._child import failure_result, redirect_output
    from autotune.runner._limits import apply_allocator_env

    rank_number = int(os.environ["RANK"])
    with open(rank_file(os.path.dirname(job_path), rank_number, "pid"), "w") as f:
        f.write(str(os.getpid()))
    die_with_orchestrator()
    job = load_job(job_path)
    apply_allocator_env(job.workload.allocator_env)
    redirect_output(rank_file(job.work_dir, rank_number, "log"))
    if job.workload.device.kind == "cuda":
        import torch

        # Before the memory probe's first CUDA call (``reset_peak_memory_stats`` on the current
        # device): without it every rank would open a context on GPU 0 and measure there; accelerate
        # sets the same device later (``PartialState``: ``cuda:<LOCAL_RANK>``).
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    faulthandler.enable(all_threads=False)

    steps = 0

    def first_step(compile_s: float) -> None:  # the ranks' parent reads the first step's end only
        nonlocal steps
        steps += 1
        if steps == 1:
            write_json(first_step_file(job.work_dir), {"compile_s": compile_s})

    try:
        from autotune.runner._trial import train_and_measure

        result = train_and_measure(job, on_step=first_step if rank_number == 0 else None)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes a recorded result
        traceback.print_exc()
        result = failure_result(exc, job)
    write_json(rank_file(job.work_dir, rank_number, "json"), result.to_dict())


if __name__ == "__main__":
    {"launch": launch, "rank": rank}[sys.argv[1]](sys.argv[2])
