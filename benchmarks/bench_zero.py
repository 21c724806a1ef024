"""ZeRO on 1 and 2 ranks: every ``zero`` stage trained by autotune's own runner, side by side.

For one model, each stage (off, 1, 2, 2+offload, 3, 3+offload) is trained as a real trial
(``autotune.runner.run_isolated`` with ``Workload.for_model(..., devices_per_trial=N)``: on several
ranks torch's elastic launcher, gloo, DeepSpeed through the Trainer's own integration) on 1 and on 2
ranks, in one run, so a drifting machine load touches every row alike. The table gives, per row:
the global samples/s; the largest rank's peak (the figure a per-rank ceiling judges); the estimator's
prediction for one rank (``autotune.estimate.estimate_peak`` with the workload's memory prior, which carries
the N ranks) and what it says offload keeps in host memory; measured over predicted; and offload's cost,
its samples/s over the same stage's without offload, measured in the same run.

Each ZeRO rank also records where DeepSpeed put its states (``tests/support/zero_placement.py``):
the ZeRO optimizer, the optimizer that steps the partitions (DeepSpeed's CPU Adam under offload),
its offload flags and the bytes of the partitions it holds, printed against the estimator's
``host_bytes``. On the CPU device and host are the same RAM: offload cannot show a memory saving
here, only its cost and its placement (docs/benchmarks.md, "ZeRO and several ranks").

    python -m benchmarks.bench_zero --model bert-small --seq-len 32 --micro-batch 2 --ranks 2 1
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAGES = ("off", "1", "2", "2+offload", "3", "3+offload")
PLACEMENT_CALLBACK = "tests.support.zero_placement:RecordZeroPlacement"
MiB = 1024**2


@dataclasses.dataclass(frozen=True)
class Row:
    """One stage on one number of ranks: what was measured and what the estimator predicted."""

    ranks: int
    zero: str
    status: str
    samples_per_s: float
    rank_peaks_bytes: tuple[int, ...]
    predicted_bytes: int
    predicted_host_bytes: int
    placement: tuple[dict, ...] = ()
    predicted_samples_per_s: float = 0.0
    predicted_collectives_share: float = 0.0
    predicted_zero_share: float = 0.0

    @property
    def peak_bytes(self) -> int:
        return max(self.rank_peaks_bytes, default=0)


def offload_cost(rows: list[Row]) -> dict[tuple[int, str], float]:
    """Samples/s of each offload row over the same stage's without offload on as many ranks."""
    speed = {(row.ranks, row.zero): row.samples_per_s for row in rows if row.status == "ok"}
    return {
        (ranks, zero): value / speed[(ranks, zero.removesuffix("+offload"))]
        for (ranks, zero), value in speed.items()
        if zero.endswith("+offload") and speed.get((ranks, zero.removesuffix("+offload")))
    }


def ratios(
    rows: list[Row], base: Callable[[int, str], tuple[int, str] | None]
) -> dict[tuple[int, str], tuple[float, float]]:
    """Each trained row's samples/s over its ``base`` row's (``None``: no ratio), measured and predicted."""
    ok = {(row.ranks, row.zero): row for row in rows if row.status == "ok"}
    return {
        key: (row.samples_per_s / under.samples_per_s, row.predicted_samples_per_s / under.predicted_samples_per_s)
        for key, row in ok.items()
        if (other := base(*key)) is not None
        and (under := ok.get(other)) is not None
        and under.predicted_samples_per_s > 0
    }


def scaling(rows: list[Row]) -> dict[tuple[int, str], tuple[float, float]]:
    """Each stage's samples/s on several ranks over its samples/s on one, measured and predicted."""
    return ratios(rows, lambda ranks, zero: (1, zero) if ranks > 1 else None)


def stage_cost(rows: list[Row]) -> dict[tuple[int, str], tuple[float, float]]:
    """Each ZeRO row's samples/s over plain training's (``off``) on as many ranks, measured and predicted: what the
    stage costs in time, DeepSpeed's own work in its step counted (docs/estimator.md, "ZeRO's own work")."""
    return ratios(rows, lambda ranks, zero: (ranks, "off") if zero != "off" else None)


def markdown(header: list[str], align: str, cells: list[list[str]]) -> str:
    """A Markdown table: its header, each column's alignment row cell (``---`` or ``---:``), its rows."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join([align] * len(header)) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells])


def speed_table(rows: list[Row]) -> str:
    """The throughput prior against the measured samples/s: what the ranks' collectives and each ZeRO stage cost."""
    scale, cost = scaling(rows), stage_cost(rows)
    header = ["ranks", "zero", "samples/s measured", "predicted (prior)", "collectives' share of the predicted step"]
    header += ["ZeRO's own work's share", "over 1 rank: measured", "predicted", "over zero off: measured", "predicted"]
    cells = []
    for row in rows:
        if row.status != "ok":
            continue
        key = (row.ranks, row.zero)
        over = [*scale.get(key, (None, None)), *cost.get(key, (None, None))]
        cells.append(
            [str(row.ranks), row.zero, f"{row.samples_per_s:.2f}", f"{row.predicted_samples_per_s:.2f}"]
            + [f"{row.predicted_collectives_share:.0%}", f"{row.predicted_zero_share:.0%}"]
            + ["" if ratio is None else f"{ratio:.2f}x" for ratio in over]
        )
    return markdown(header, "---:", cells)


def table(rows: list[Row]) -> str:
    """The Markdown table docs/benchmarks.md records."""
    cost = offload_cost(rows)
    header = ["ranks", "zero", "samples/s (global)", "peak, largest rank (MiB)", "each rank (MiB)", "predicted (MiB)"]
    cells = []
    for row in rows:
        if row.status != "ok":
            cells.append([str(row.ranks), row.zero, row.status, "", "", f"{row.predicted_bytes / MiB:.0f}", "", "", ""])
            continue
        ratio = cost.get((row.ranks, row.zero))
        cells.append(
            [str(row.ranks), row.zero, f"{row.samples_per_s:.2f}", f"{row.peak_bytes / MiB:.0f}"]
            + [" / ".join(f"{peak / MiB:.0f}" for peak in row.rank_peaks_bytes), f"{row.predicted_bytes / MiB:.0f}"]
            + [f"{row.peak_bytes / row.predicted_bytes:.2f}"]
            + [f"{row.predicted_host_bytes / MiB:.0f}" if row.predicted_host_bytes else ""]
            + ["" if ratio is None else f"{ratio:.2f}x"]
        )
    extra = ["measured / predicted", "predicted host (MiB)", "offload: samples/s vs without"]
    return markdown([*header, *extra], "---", cells)


def placement_table(rows: list[Row]) -> str:
    """Where DeepSpeed says each rank's states are, against the estimator's host bytes."""
    from tests.support.zero_placement import offloaded_bytes

    header = ["ranks", "zero", "rank", "ZeRO optimizer", "steps the partitions", "offload optimizer / params"]
    extra = ["fp32 master partition (MiB)", "states (MiB)", "offloaded per DeepSpeed (MiB)", "predicted host (MiB)"]
    cells = [
        [str(row.ranks), row.zero, str(rank), str(placed["zero_optimizer"]), str(placed["basic_optimizer"])]
        + [f"{placed['offload_optimizer']} / {placed['offload_param']}", f"{placed['master_bytes'] / MiB:.1f}"]
        + [f"{placed['state_bytes'] / MiB:.1f}", f"{offloaded_bytes(placed) / MiB:.1f}"]
        + [f"{row.predicted_host_bytes / MiB:.1f}"]
        for row in rows
        for rank, placed in enumerate(row.placement)
    ]
    return markdown([*header, *extra], "---", cells)


def measure(model_name: str, seq_len: int, micro_batch: int, dtype: str, ranks: int, zero: str, root: Path) -> Row:
    """Train one stage on ``ranks`` ranks through autotune's runner; read its ranks' records."""
    from autotune.estimate import estimate_peak
    from autotune.levers import TrialConfig
    from autotune.runner import TrialJob, Workload, run_isolated
    from autotune.spec.measure import MeasureSettings
    from tests.support.zero_placement import placement_file

    workload = Workload.for_model(
        model_name,
        seq_len=seq_len,
        ceiling_bytes=64 * 1024**3,  # nothing is judged here: the table shows the peaks
        measure=MeasureSettings(warmup_steps=2, min_steps=5, max_steps=8, max_seconds=20.0, cv_target=0.05),
        devices_per_trial=ranks,
        callbacks=(PLACEMENT_CALLBACK,) if zero != "off" else (),
    )
    config = TrialConfig(micro_batch=micro_batch, dtype=dtype, pin_memory=False, zero=zero)
    job = TrialJob(workload=workload, config=config, work_dir=str(root / f"r{ranks}-{zero}"))
    result = run_isolated(job, timeout_s=900)
    if result.status == "crash":  # as the search does: a crash is retried once (and said)
        print(f"  {ranks} rank(s), zero {zero}: {result.error}; retried once", flush=True)
        job = dataclasses.replace(job, work_dir=job.work_dir + "-retry")
        result = run_isolated(job, timeout_s=900)
    predicted = estimate_peak(workload.model, config, seq_len, workload.memory_prior)
    speed = workload.speed_model().estimate(workload.model, config, seq_len)
    assert speed is not None  # a CPU's prior always has a peak for the dtypes it trains in
    speed_fields = {
        "predicted_samples_per_s": speed.samples_per_s,
        "predicted_collectives_share": speed.collectives_s / speed.step_s,
        "predicted_zero_share": speed.zero_s / speed.step_s,
    }
    if result.status != "ok":
        print(f"  {ranks} rank(s), zero {zero}: {result.status}: {result.error}", flush=True)
        return Row(
            ranks, zero, str(result.status), 0.0, (), predicted.total_bytes, predicted.host_bytes, (), **speed_fields
        )
    peaks = result.runtime.get("rank_peak_bytes")
    rank_peaks = tuple(int(p) for p in peaks.split(",")) if peaks else (result.peak_memory_bytes,)
    placement = tuple(
        json.loads(placement_file(job.work_dir, rank).read_text())
        for rank in range(ranks)
        if placement_file(job.work_dir, rank).exists()
    )
    return Row(
        ranks,
        zero,
        "ok",
        result.samples_per_s,
        rank_peaks,
        predicted.total_bytes,
        predicted.host_bytes,
        placement,
        **speed_fields,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert-small")
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument(
        "--dtype",
        default="bf16",
        help="bf16: DeepSpeed trains a 16-bit module (2 bytes a weight), what makes its partitions smaller than DDP's fp32 states.",
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    parser.add_argument("--json", help="Also write the rows here.")
    options = parser.parse_args()

    from benchmarks._common import load_average

    root = Path(tempfile.mkdtemp(prefix="bench-zero-"))
    print(
        f"{options.model}, seq len {options.seq_len}, micro-batch {options.micro_batch}, {options.dtype}; {load_average()}"
    )
    rows = []
    for ranks in options.ranks:
        for zero in options.stages:
            rows.append(measure(options.model, options.seq_len, options.micro_batch, options.dtype, ranks, zero, root))
            print(
                f"  {ranks} rank(s), zero {zero}: {rows[-1].samples_per_s:.2f} samples/s, peak {rows[-1].peak_bytes / MiB:.0f} MiB; {load_average()}",
                flush=True,
            )
    rows.sort(key=lambda row: (row.ranks, STAGES.index(row.zero)))
    print()
    print(table(rows))
    print()
    print(speed_table(rows))
    print()
    print(placement_table(rows))
    print(load_average())
    if options.json:
        Path(options.json).write_text(json.dumps([dataclasses.asdict(row) for row in rows], indent=1))


if __name__ == "__main__":
    main()
