"""The memory estimator's prior against measured peaks: every config of a measured search grid, and
LoRA configs of the grid's model measured here (docs/benchmarks.md, "Memory estimator").

    python -m benchmarks.bench_estimate --grid benchmarks/data/bench_grid_llama_cpu.json --peft lora

Each row: the uncalibrated prediction (``estimate_peak`` with ``memory_prior``, what screening
starts from), the measured peak RSS of the trial's process tree, and their ratio. The grid's rows
are read from its cache; with ``--peft`` the LoRA rows are trained for real, each in a fresh child
through autotune's runner with the grid's measurement settings, on the workload a search with
``--peft`` builds (``autotune.spec.peft.with_peft``), for the grid configs of ``--lora-micro-batches``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from autotune.estimate import estimate_peak, memory_prior
from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.spec.devices import cpu_device
from autotune.spec.models import ModelSpec, resolve_model
from autotune.spec.peft import with_peft
from benchmarks._common import load_average
from benchmarks.bench_search.grid import BENCH_MEASURE, Grid


def measure_lora(model: ModelSpec, config: TrialConfig, seq_len: int, work_dir: Path) -> TrialResult:
    """One LoRA config trained for real in a fresh child, as the grid measures a config."""
    import psutil

    from autotune.runner import TrialJob, Workload, child_address_space_budget, run_isolated

    generous = 8 * 1024**3
    job = TrialJob(
        workload=Workload.for_model(
            model,
            seq_len=seq_len,
            ceiling_bytes=generous,
            measure=BENCH_MEASURE,
            address_space_bytes=child_address_space_budget(generous, psutil.virtual_memory().available),
        ),
        config=config,
        work_dir=str(work_dir),
    )
    return run_isolated(job, timeout_s=600)


def row(label: str, model: ModelSpec, config: TrialConfig, seq_len: int, measured_bytes: int) -> str:
    predicted = estimate_peak(model, config, seq_len, memory_prior(cpu_device(), {})).total_bytes
    mib = 1024**2
    return f"| {label} | {config.short()} | {predicted / mib:.0f} | {measured_bytes / mib:.0f} | {predicted / measured_bytes:.2f} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--grid", required=True, help="a measured grid (python -m benchmarks.bench_search)")
    parser.add_argument("--peft", default=None, help="also measure LoRA configs: lora or an adapter config file")
    parser.add_argument("--lora-micro-batches", default="1,4", help="micro-batches of the LoRA rows")
    options = parser.parse_args()
    grid = Grid.load(Path(options.grid))
    model, seq_len = resolve_model(grid.meta["model"]), int(grid.meta["seq_len"])
    lines = [
        f"{grid.meta['model']}, seq len {seq_len}; {load_average()}",
        "",
        "| workload | config | predicted (MiB) | measured (MiB) | predicted / measured |",
        "|---|---|---|---|---|",
    ]
    for config, result in grid.results.items():
        if result.peak_memory_bytes > 0:
            lines.append(row("full", model, config, seq_len, result.peak_memory_bytes))
    if options.peft:
        lora_model = with_peft(model, options.peft, cpu_device(), [])
        micro_batches = {int(value) for value in options.lora_micro_batches.split(",")}
        work = Path(tempfile.mkdtemp(prefix="bench-estimate-"))
        for index, config in enumerate(
            c for c in grid.results if c.micro_batch in micro_batches and not c.checkpointing
        ):
            result = measure_lora(lora_model, config, seq_len, work / f"lora-{index}")
            print(f"  {config.short()}: {result.status} peak {result.peak_memory_bytes}", file=sys.stderr, flush=True)
            if result.status == "ok":
                lines.append(row(f"LoRA ({options.peft})", lora_model, config, seq_len, result.peak_memory_bytes))
        lines.append(f"\nLoRA rows measured; {load_average()}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
