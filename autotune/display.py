"""What the user watches and reads: the live search view and the trial tables (Rich)."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from autotune.ceiling import fits
from autotune.config import TrialConfig
from autotune.devices import DeviceSpec
from autotune.estimate import EstimateRow, FitAdvice, MemoryEstimate
from autotune.ranking import RankedTrial
from autotune.result import TrialResult, memory_source_description, precision_note
from autotune.units import format_bytes

STATUS_STYLE = {
    "ok": "green", "over_ceiling": "yellow", "oom": "red", "screened": "magenta", "pruned": "cyan",
    "diverged": "red", "timeout": "red", "crash": "red", "error": "red", "interrupted": "yellow",
}

LEGEND = (
    "samples/s: steady-state median over whole optimizer steps (warm-up and compilation excluded); "
    "✓ = median of the end-of-search re-runs. model TFLOPs: useful work per second (6N + 12·L·h·s per "
    "token, PaLM), the ranking metric. MFU: model TFLOPs over the datasheet peak of the dtype the "
    "matmuls ran in; * = over the peak measured by `autotune devices --calibrate`; - = no peak known "
    "(never invented). HFU (checkpointing only): hardware TFLOPs, which count the recomputed forward, "
    "over the same peak. peak mem: the figure the ceiling is compared with ({source}). "
    "CV: step-time coefficient of variation over the steady window."
)

def _fmt(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_tflops(value: float) -> str:
    """Three significant figures at any scale (a tiny CPU model and an H100 both read well)."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def utilisation_cell(datasheet: float | None, measured: float | None) -> str:
    """``41.2%`` against the datasheet, ``48.0%*`` against the measured peak, both when both exist."""
    parts = []
    if datasheet is not None:
        parts.append(f"{datasheet:.1%}")
    if measured is not None:
        parts.append(f"{measured:.1%}*")
    return " / ".join(parts) if parts else "-"


def trial_table(title: str, rows: Sequence[RankedTrial], memory_source: str = "") -> Table:
    """One row per trial: its status, knobs and every measured figure with its unit."""
    source = memory_source_description(memory_source) or "see each trial's memory_source"
    table = Table(title=title, caption=LEGEND.format(source=source), caption_justify="left")
    for header, justify in [
        ("#", "right"), ("status", "left"), ("config", "left"), ("samples/s", "right"),
        ("model TFLOPs", "right"), ("MFU", "right"), ("HFU", "right"), ("peak mem", "right"), ("CV", "right"),
        ("time", "right"), ("note", "left"),
    ]:
        table.add_column(header, justify=justify, overflow="fold")
    for row in rows:
        table.add_row(
            *trial_cells(row.number, row.config, row.result, row.confirmed_samples_per_s, row.confirmation, row.state)
        )
    return table


def trial_cells(
    number: int,
    config: TrialConfig,
    result: TrialResult | None,
    confirmed: float | None = None,
    confirmation: dict | None = None,
    state: str = "RUNNING",
) -> list[str]:
    """The cells of one table row; ``-`` where a trial measured nothing."""
    if result is None:
        label = {"WAITING": "queued", "RUNNING": "running"}.get(state, state.lower())
        return [str(number), label, config.short()] + ["-"] * 8
    status = f"[{STATUS_STYLE.get(result.status, '')}]{result.status}[/]"
    ran = result.samples_per_s > 0
    samples = "-"
    if ran:
        samples = f"{confirmed:.1f} ✓" if confirmed is not None else f"{result.samples_per_s:.1f}"
    if confirmation and confirmation.get("figures"):
        # Show the figures at the confirmed median, the one the row is ranked by.
        result = dataclasses.replace(result, **confirmation["figures"])
    mfu = utilisation_cell(result.mfu, result.mfu_measured)
    hfu = utilisation_cell(result.hfu, result.hfu_measured) if config.checkpointing else ""
    notes = [result.error] if result.error else []
    if result.skipped_measured_steps:
        notes.append(f"fp16 scaler skipped {result.skipped_measured_steps}/{result.measured_steps} steps (not counted)")
    notes += [note for note in [precision_note(config.dtype, result)] if note]
    notes += result.defects
    if result.attempts > 1:
        notes.append(f"attempt {result.attempts}")
    if confirmation:
        runs = confirmation.get("repeats", 0)
        notes.append(f"confirmed: {runs} re-runs, CV {confirmation.get('cv', 0.0):.1%}")
        if confirmation.get("ties_with_leader"):
            notes.append("ties with the leader (within noise)")
        if not confirmation.get("feasible", True):
            notes.append(f"re-runs: {', '.join(confirmation.get('statuses', []))}")
    if ran and not result.steady and result.status == "ok":
        notes.append("CV target not met")
    return [
        str(number), status, config.short(), samples,
        format_tflops(result.model_tflops) if ran else "-",
        mfu if ran else "-",
        hfu if ran else "-",
        format_bytes(result.peak_memory_bytes) if result.peak_memory_bytes else "-",
        _fmt(result.step_time_cv, ".1%") if ran else "-",
        f"{result.wall_s:.0f}s", "; ".join(notes)[:90],
    ]


class SearchView:
    """A live progress bar over a growing table of finished trials."""

    def __init__(self, console: Console, n_trials: int | None, ceiling_bytes: int, memory_source: str) -> None:
        self._console = console
        self._rows: list[RankedTrial] = []
        self._memory_source = memory_source
        self._ceiling = ceiling_bytes
        self._progress = Progress(
            TextColumn("[bold]trials"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.description}"), console=console,
        )
        self._task = self._progress.add_task("starting", total=n_trials)
        self._live = Live(self._render(), console=console, refresh_per_second=4, transient=False)
        self._trial_started = 0.0
        self._running: dict[int, TrialConfig] = {}
        # Several workers (threads) report trials; one at a time changes the rows and the bar.
        self._lock = threading.Lock()

    def _render(self) -> Group:
        title = f"Trials (ceiling {format_bytes(self._ceiling)} of {self._memory_source})"
        return Group(trial_table(title, self._rows[-30:], self._memory_source), self._progress)

    def __enter__(self) -> SearchView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._live.update(self._render())
        self._live.__exit__(*exc)  # type: ignore[arg-type]
        if not self._console.is_terminal:
            # Rich ends the last render with a newline only on a terminal (rich/live.py: Live.stop);
            # in a log or a pipe the next line would run on from the progress bar.
            self._console.line()

    def trial_started(self, number: int, config: TrialConfig) -> None:
        with self._lock:
            self._trial_started = time.monotonic()
            self._running[number] = config
            self._progress.update(self._task, description=self._running_description())

    def trial_finished(self, number: int, config: TrialConfig, result: TrialResult) -> None:
        with self._lock:
            self._running.pop(number, None)
            self._rows.append(RankedTrial(number=number, state="", config=config, result=result))
            self._progress.update(self._task, advance=1, description=self._running_description())
            self._live.update(self._render())

    def _running_description(self) -> str:
        if len(self._running) == 1:
            number, config = next(iter(self._running.items()))
            return f"running #{number}: {config.short()}"
        return f"running {', '.join(f'#{n}' for n in sorted(self._running))}" if self._running else ""


def estimate_table(
    title: str, rows: Sequence[tuple[TrialConfig, MemoryEstimate]], ceiling_bytes: int, screen_margin: float
) -> Table:
    """Predicted peak memory per config, by part, against the ceiling (``autotune estimate``)."""
    table = Table(
        title=title,
        caption=(
            "weights: fp32 parameters (+ 16-bit copies under fp16/bf16 autocast); gradients: fp32; optimizer "
            "states: per optimizer; activations: Korthikanti et al. 2022 per layer, calibrated scale; logits: "
            "three fp32 b·s·V tensors of the LM loss; allocator: CUDA caching allocator's workspaces and "
            "fragmentation (0 on the CPU); context: CUDA context, or on the CPU the process baseline "
            f"(per dataloader worker too). fits: predicted peak <= ceiling; screened: > ceiling x {screen_margin:.2f}, "
            "a search would not run it."
        ),
        caption_justify="left",
    )
    parts = list(rows[0][1].parts()) if rows else []
    headers = ["config", *parts, "predicted peak", "vs ceiling"]
    for header in headers:
        table.add_column(header, justify="left" if header == "config" else "right")
    for config, estimate in rows:
        total = estimate.total_bytes
        if fits(total, ceiling_bytes):
            verdict = "[green]fits[/]"
        elif fits(total, ceiling_bytes * screen_margin):
            verdict = "[yellow]over (would run)[/]"
        else:
            verdict = "[magenta]screened[/]"
        table.add_row(config.short(), *(format_bytes(v) for v in estimate.parts().values()), format_bytes(total), verdict)
    return table


def estimate_short_table(title: str, chosen: Sequence[tuple[EstimateRow, bool]], ceiling_bytes: int) -> Table:
    """``autotune estimate``'s default: per setting of the other memory knobs, the largest micro-batch
    predicted to fit and its predicted peak (:func:`autotune.estimate.largest_fitting`)."""
    table = Table(
        title=title,
        caption="largest micro-batch: of the space's micro-batches, the largest whose predicted peak is at most the "
        "ceiling; predicted peak: that config's (--all: every row by part; --json: every row for scripts).",
        caption_justify="left",
    )
    for header in ("dtype", "checkpointing", "optimizer", "other knobs", "largest micro-batch", "predicted peak", "vs ceiling"):
        table.add_column(header, justify="right" if header in ("largest micro-batch", "predicted peak") else "left")
    for row, any_fits in chosen:
        config = row.config
        others = " ".join(
            part for part in (
                f"attn={config.attn_implementation}" if config.attn_implementation else "",
                f"workers={config.dataloader_workers}" if config.dataloader_workers else "",
            ) if part
        )
        batch = str(config.micro_batch) if any_fits else f"none (smallest {config.micro_batch})"
        verdict = "[green]fits[/]" if any_fits else f"[magenta]over by {format_bytes(row.estimate.total_bytes - ceiling_bytes)}[/]"
        table.add_row(
            config.dtype, "on" if config.checkpointing else "off", config.optim, others or "-",
            batch, format_bytes(row.estimate.total_bytes), verdict,
        )
    return table


def what_would_fit_table(advice: FitAdvice) -> Table:
    """``autotune estimate`` when no config of the space fits: the smallest config with one lever
    changed at a time, predicted (:func:`autotune.estimate.what_would_fit`, the search's answer too)."""
    smallest = advice.smallest
    table = Table(
        title=f"Nothing in the space fits: the smallest predicted peak is {format_bytes(smallest.estimate.total_bytes)} "
        f"({smallest.config.short()}); one lever changed at a time",
        caption=advice.advice(),
        caption_justify="left",
    )
    for header in ("lever", "value", "predicted peak", "vs ceiling"):
        table.add_column(header, justify="right" if header == "predicted peak" else "left")

    def verdict(total: int) -> str:
        return "[green]fits[/]" if fits(total, advice.ceiling_bytes) else f"[magenta]over by {format_bytes(total - advice.ceiling_bytes)}[/]"

    for change in advice.changes:
        value = str(change.value).lower() if isinstance(change.value, bool) else str(change.value)
        table.add_row(change.lever, value, format_bytes(change.estimate.total_bytes), verdict(change.estimate.total_bytes))
    leanest = advice.leanest
    if advice.changes:
        table.add_row("all of them", leanest.config.short(), format_bytes(leanest.estimate.total_bytes), verdict(leanest.estimate.total_bytes))
    return table


def known_gpus_table() -> Table:
    """``autotune devices --known``: the GPUs ``autotune estimate --gpu-type`` plans for."""
    from autotune.devices import KNOWN_GPUS

    table = Table(title="GPUs to plan for without having them (autotune estimate --gpu-type NAME)")
    for header in ("name", "GPU (as NVML names it)", "memory", "compute capability", "dtypes", "datasheet peaks (TFLOPS)", "memory figure from"):
        table.add_column(header)
    for gpu in KNOWN_GPUS:
        device = gpu.device()
        entry = device.datasheet_entry()
        peaks = ", ".join(f"{d} {v:g}" for d, v in entry.peaks_tflops.items()) if entry else "-"
        table.add_row(
            gpu.key, gpu.nvml_name, format_bytes(gpu.memory_bytes), f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
            ", ".join(device.supported_dtypes), peaks, gpu.memory_source,
        )
    return table


def devices_table(devices: Sequence[DeviceSpec], measured_peaks: dict[str, dict[str, float]]) -> tuple[Table, list[str]]:
    """``autotune devices``: each device's memory and peak TFLOPS per dtype, datasheet / measured, and a
    note per device saying what MFU is measured against.

    Args:
        devices: The devices found.
        measured_peaks: Peaks measured by ``autotune devices --calibrate``, by device name and dtype.
    """
    from autotune.calibrate import peak_note
    from autotune.levers import DTYPES

    table = Table(
        title="Devices: peak TFLOPS per dtype, datasheet / measured* ('-' = unknown, never invented; n/a = unsupported)"
    )
    for header in ["device", "name", "memory", "datasheet", *DTYPES]:
        table.add_column(header)
    notes = []
    for spec in devices:
        measured = measured_peaks.get(spec.name, {})
        cells = []
        for dtype in DTYPES:
            if dtype not in spec.supported_dtypes:
                cells.append("n/a")
                continue
            datasheet = spec.datasheet_peak_tflops(dtype)
            cells.append(
                f"{'-' if datasheet is None else format_tflops(datasheet)} / "
                f"{format_tflops(measured[dtype]) + '*' if dtype in measured else '-'}"
            )
        entry = spec.datasheet_entry()
        table.add_row(spec.label, spec.name, format_bytes(spec.total_memory_bytes), entry.label if entry else "-", *cells)
        notes.append(f"{spec.label}: {peak_note(spec, measured)}")
    return table, notes
