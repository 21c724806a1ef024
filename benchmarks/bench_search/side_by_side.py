"""Side by side, for real, in one run (interleaved rounds, fresh child each): autotune's winner, the
HF default ``TrainingArguments``, and ``auto_find_batch_size=True`` starting from the space's
largest micro-batch, all at the same ceiling. The ceiling is an RSS figure on the CPU; for
``auto_find_batch_size`` to react to it, its child may grow its address space by only
``ceiling - its resident size at start`` (allocations fail there, which it catches and halves on).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.runner import TrialJob, Workload, child_address_space_budget, run_isolated
from autotune.spec.devices import DeviceSpec
from autotune.spec.models import ModelSpec
from autotune.study import default_config
from autotune.units import format_bytes
from benchmarks.bench_search.batch_recorder import BATCH_FILE
from benchmarks.bench_search.grid import BENCH_MEASURE


def side_by_side(
    model: ModelSpec,
    device: DeviceSpec,
    seq_len: int,
    ceiling: int,
    winner: TrialConfig,
    auto_find_start: int,
    rounds: int,
) -> dict[str, list[TrialResult]]:
    """Interleaved rounds: autotune's winner, HF default TrainingArguments, auto_find_batch_size=True."""
    import psutil

    work = Path(tempfile.mkdtemp(prefix="bench-search-sbs-"))
    default = default_config()
    contenders: dict[str, tuple[TrialConfig, dict[str, Any]]] = {
        "autotune winner": (winner, {}),
        "HF default TrainingArguments": (default, {}),
        f"HF auto_find_batch_size=True (from {auto_find_start})": (
            dataclasses.replace(default, micro_batch=auto_find_start),
            {"auto_find_batch_size": True},
        ),
    }
    results: dict[str, list[TrialResult]] = {name: [] for name in contenders}
    for round_index in range(rounds):
        for name, (config, base_args) in contenders.items():
            work_dir = work / f"r{round_index}-{len(results[name])}-{name.split()[0]}-{config.micro_batch}"
            if base_args:
                # allocations fail once the resident set could pass the ceiling: the OOM it retries on
                budget = ceiling - _child_start_rss_bytes()
            else:
                budget = child_address_space_budget(ceiling, psutil.virtual_memory().available)
            job = TrialJob(
                workload=Workload.for_model(
                    model,
                    device=device,
                    seq_len=seq_len,
                    ceiling_bytes=ceiling,
                    measure=BENCH_MEASURE,
                    base_args=base_args,
                    address_space_bytes=budget,
                    callbacks=("benchmarks.bench_search.batch_recorder:TrainBatchSizeRecorder",),
                ),
                config=config,
                work_dir=str(work_dir),
            )
            result = run_isolated(job, timeout_s=900)
            batch_file = Path(work_dir, BATCH_FILE)
            if result.samples_per_s and batch_file.exists():
                # samples/s was computed from the batch asked for; auto_find may have trained a smaller one
                actual = int(batch_file.read_text())
                result.samples_per_s *= actual * config.grad_accum / config.global_batch
                result.memory_peaks["train_batch_size"] = actual
            results[name].append(result)
            print(
                f"  round {round_index + 1}/{rounds} {name:45s} {result.status:12s} {result.samples_per_s:7.1f} samples/s "
                f"batch {result.memory_peaks.get('train_batch_size', config.micro_batch)} peak {format_bytes(result.peak_memory_bytes)}",
                flush=True,
            )
    return results


def _child_start_rss_bytes() -> int:
    """Resident size of a trial child before it builds anything: what it may not grow its address
    space by. Not the whole CPU context prior: the library pages that adds are mapped in the child
    already and cost it no address space."""
    from autotune.estimate import CPU_CHILD_START_RSS_BYTES

    return CPU_CHILD_START_RSS_BYTES
