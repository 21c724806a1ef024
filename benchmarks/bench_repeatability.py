"""Repeatability: one configuration measured several times in one run, each in a fresh trial child.

Each run goes through the real runner (autotune.runner.run_isolated) with the default measurement
settings (warm-up excluded, measure until the step-time CV target or the budget). The figure of
merit is the coefficient of variation of the per-run medians.

Goal (docs/benchmarks.md): CV of the medians <= 3 % on an idle machine.

The machine's own floor, measured side by side: with ``--plain`` (the default), each autotune run
alternates with a plain Trainer run of the same arguments in a fresh interpreter that imports
nothing from autotune (``bench_fidelity.py``'s plain loop: median step time over 30 steps after 3
warm-up), so the CV of autotune's medians can be read against the CV a plain training run shows
on the same machine in the same minutes. With ``--matmul-seconds`` above 0 (default 10), each run is
also followed by a fixed matmul loop with no training at all, whose GFLOP/s show how steady the
machine's raw compute is from one run to the next.

    python -m benchmarks.bench_repeatability --model bert-mini --seq-len 128 --micro-batch 16 --runs 5
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path

from autotune.levers import TrialConfig, training_arguments_kwargs
from autotune.runner import TrialJob, Workload, measure_matmul_peak, run_isolated
from autotune.spec.measure import MeasureSettings
from benchmarks._common import cv, load_average, run_plain_trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-mini")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--optim", default="adamw_torch")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--plain",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="alternate each run with a plain Trainer run of the same arguments (the machine's floor)",
    )
    parser.add_argument(
        "--matmul-seconds",
        type=float,
        default=10.0,
        help="seconds of fp32 matmuls (autotune devices --calibrate's timer) after each run (the hardware's floor); 0 leaves it out",
    )
    options = parser.parse_args()

    settings = MeasureSettings()
    config = TrialConfig(micro_batch=options.micro_batch, dtype=options.dtype, optim=options.optim)
    root = Path(tempfile.mkdtemp(prefix="bench-repeatability-"))
    job = TrialJob(
        workload=Workload.for_model(
            options.model, seq_len=options.seq_len, ceiling_bytes=16 * 1024**3, measure=settings
        ),
        config=config,
        work_dir=str(root / "run-0"),
    )
    print(f"{options.model}, seq len {options.seq_len}, {config.short()}, {options.runs} runs; measurement {settings}")
    print(load_average())
    args_file = root / "args.json"  # the one knobs -> TrainingArguments mapping, as exported
    args_file.write_text(json.dumps(training_arguments_kwargs(config, "cpu")))
    medians, plain_medians, matmul_rates = [], [], []
    extra_header = f" {'plain samples/s':>16}" if options.plain else ""
    extra_header += f" {'matmul GFLOP/s':>15}" if options.matmul_seconds > 0 else ""
    print(
        f"{'run':>3} {'samples/s':>10} {'step median s':>14} {'step CV':>8} {'steps':>6} {'steady':>7} {'peak RSS MiB':>13}{extra_header}"
    )
    for run in range(options.runs):
        result = run_isolated(dataclasses.replace(job, work_dir=str(root / f"run-{run}")), timeout_s=900)
        if result.status != "ok":
            raise SystemExit(f"run {run} failed: {result.status} {result.error}")
        medians.append(result.samples_per_s)
        extra_cells = ""
        if options.plain:
            plain_medians.append(
                run_plain_trainer(args_file, options.model, options.seq_len)["samples_per_s_median_step"]
            )
            extra_cells = f" {plain_medians[-1]:16.2f}"
        if options.matmul_seconds > 0:
            # calibrate's matmul timer (2048 x 2048 fp32, each matmul timed alone): the median rate
            matmul_rates.append(measure_matmul_peak("cpu", "fp32", seconds=options.matmul_seconds).median_tflops * 1000)
            extra_cells += f" {matmul_rates[-1]:15.1f}"
        print(
            f"{run:>3} {result.samples_per_s:10.2f} {result.step_time_median_s:14.4f} {result.step_time_cv:8.1%} "
            f"{result.measured_steps:6d} {str(result.steady):>7} {result.peak_memory_bytes / 1024**2:13.0f}{extra_cells}",
            flush=True,
        )
    print(
        f"\nautotune runner: median of the runs {statistics.median(medians):.2f} samples/s; range {min(medians):.2f}-{max(medians):.2f}; "
        f"CV of the per-run medians {cv(medians):.1%} (goal <= 3 % on an idle machine)"
    )
    if plain_medians:
        print(
            f"plain Trainer loop, alternating: median {statistics.median(plain_medians):.2f} samples/s (median step); range "
            f"{min(plain_medians):.2f}-{max(plain_medians):.2f}; CV of the per-run medians {cv(plain_medians):.1%} (the machine's floor)"
        )
    if matmul_rates:
        print(
            f"fixed matmul loop ({options.matmul_seconds:g} s each, median GFLOP/s), alternating: range {min(matmul_rates):.1f}-"
            f"{max(matmul_rates):.1f} GFLOP/s; CV {cv(matmul_rates):.1%} (the hardware's floor, no training)"
        )
    print(load_average())


if __name__ == "__main__":
    main()
