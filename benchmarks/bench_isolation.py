"""Isolation overhead per trial: a child from the forkserver vs a freshly spawned interpreter.

Every trial runs in a fresh process. This measures what that costs, per trial, side by side in one
run: the time from the orchestrator's start call to the child's first training step, minus the
model build (which any training run pays). What remains is process start, imports, and the
Trainer's set-up. Both modes run the same child entry point (autotune.runner._child.child_main);
only the multiprocessing start method differs. The two modes alternate, so a drifting load hits
both alike. The forkserver itself starts once per search; its first trial is reported apart.

Goal (docs/benchmarks.md): forkserver <= 0.2 s per trial, against about 5 s for a spawned interpreter.

    python -m benchmarks.bench_isolation --trials 5
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.runner._child import child_main
from autotune.runner._job import TrialJob, Workload
from autotune.runner._pool import forkserver_context
from autotune.spec.measure import MeasureSettings
from benchmarks._common import load_average, read_first_step


@dataclasses.dataclass(frozen=True)
class Timing:
    mode: str
    to_first_step_s: float  # orchestrator's start call -> first training step
    model_build_s: float  # reported by the child
    trainer_setup_s: float  # the rest of the child's set-up (Trainer, dataset), reported by the child

    @property
    def overhead_s(self) -> float:
        """Start to first step, minus the model build."""
        return self.to_first_step_s - self.model_build_s

    @property
    def process_s(self) -> float:
        """Start to the moment the child begins the trial body: process start and imports only."""
        return self.overhead_s - self.trainer_setup_s


def run_child(context: multiprocessing.context.BaseContext, job: TrialJob) -> tuple[TrialResult, float]:
    """Start ``child_main`` in ``context`` exactly as the runner does; return its result and the start time."""
    receiver, sender = context.Pipe(duplex=False)
    lifeline_reader, lifeline = context.Pipe(duplex=False)
    process = context.Process(target=child_main, args=(sender, lifeline_reader, job), name="bench-trial")
    started = time.monotonic()
    process.start()
    sender.close()
    lifeline_reader.close()
    payload = None
    while payload is None:
        kind, message = receiver.recv()
        if kind == "result":
            payload = message
    process.join(timeout=60)
    lifeline.close()
    receiver.close()
    return TrialResult.from_dict(payload), started


def measure(mode: str, context: multiprocessing.context.BaseContext, job: TrialJob) -> Timing:
    Path(job.work_dir).mkdir(parents=True, exist_ok=True)
    result, started = run_child(context, job)
    if result.status != "ok":
        raise SystemExit(f"{mode} trial failed: {result.status} {result.error}; see {job.log_path}")
    first_step = read_first_step(job.work_dir)
    return Timing(mode, first_step - started, result.model_build_s, result.setup_s - result.model_build_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-tiny")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--trials", type=int, default=5, help="Trials per mode (alternating).")
    options = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    base = TrialJob(
        workload=Workload.for_model(
            options.model,
            seq_len=options.seq_len,
            ceiling_bytes=8 * 1024**3,
            measure=MeasureSettings(warmup_steps=1, min_steps=1, max_steps=1),
            callbacks=("benchmarks._common:FirstStepClock",),
        ),
        config=TrialConfig(micro_batch=8),
        work_dir=str(root / "first"),
    )
    contexts = {"forkserver": forkserver_context(), "spawn": multiprocessing.get_context("spawn")}
    print(f"model {options.model}, seq len {options.seq_len}, {options.trials} trials per mode; {load_average()}")

    first = measure("forkserver", contexts["forkserver"], base)
    timings: list[Timing] = []
    for index in range(options.trials):
        for mode, context in contexts.items():
            job = dataclasses.replace(base, work_dir=str(root / f"{mode}-{index}"))
            timings.append(measure(mode, context, job))

    print(
        f"\n{'mode':<11} {'start->1st step':>16} {'model build':>12} {'trainer setup':>14} {'overhead':>9} "
        f"{'of it process+imports':>22}   (s, per trial)"
    )
    for t in [first, *timings]:
        label = "forkserver*" if t is first else t.mode
        print(
            f"{label:<11} {t.to_first_step_s:16.3f} {t.model_build_s:12.3f} {t.trainer_setup_s:14.3f} "
            f"{t.overhead_s:9.3f} {t.process_s:22.3f}"
        )
    print("overhead = start -> first step - model build; process+imports = overhead - Trainer set-up")
    print("* the first forkserver trial also starts the forkserver (once per search)")
    for column in ("overhead_s", "process_s"):
        medians = {mode: statistics.median(getattr(t, column) for t in timings if t.mode == mode) for mode in contexts}
        print(
            f"median {column.removesuffix('_s').replace('process', 'process+imports')} per trial: "
            f"forkserver {medians['forkserver']:.3f} s, spawn {medians['spawn']:.3f} s, "
            f"spawn/forkserver {medians['spawn'] / max(medians['forkserver'], 1e-9):.1f}x"
        )
    startup = first.overhead_s - statistics.median(t.overhead_s for t in timings if t.mode == "forkserver")
    print(f"forkserver start-up, paid once per search: {startup:.3f} s")
    print(load_average())


if __name__ == "__main__":
    main()
