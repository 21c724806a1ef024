"""What the user watches and reads: the live search view and the trial tables (Rich)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autotune.config import TrialConfig
from autotune.ranking import RankedTrial
from autotune.result import TrialResult
from autotune.units import format_bytes

STATUS_STYLE = {
    "ok": "green", "over_ceiling": "yellow", "oom": "red", "screened": "magenta", "pruned": "cyan",
    "timeout": "red", "crash": "red", "error": "red", "interrupted": "yellow",
}

LEGEND = (
    "samples/s and tokens/s: steady-state median over whole optimizer steps (warm-up excluded). "
    "model TFLOPs: useful work per second (6N + 12·L·h·s per token, PaLM), the ranking metric; "
    "HFU counts checkpointing's recomputed forward too. MFU/HFU: against the datasheet peak for the dtype"
    " (mfu*: against the peak measured by `autotune devices --calibrate`). "
    "peak mem: what the ceiling is compared with ({source}). CV: step-time coefficient of variation."
)


def _fmt(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def trial_table(title: str, rows: Sequence[RankedTrial], memory_source: str = "") -> Table:
    """One row per trial: its status, knobs and every measured figure with its unit."""
    table = Table(title=title, caption=LEGEND.format(source=memory_source or "see each trial's memory_source"),
                  caption_justify="left")
    for header, justify in [
        ("#", "right"), ("status", "left"), ("config", "left"), ("samples/s", "right"),
        ("model TFLOPs", "right"), ("MFU/HFU", "right"), ("peak mem", "right"), ("CV", "right"),
        ("time", "right"), ("note", "left"),
    ]:
        table.add_column(header, justify=justify, overflow="fold")
    for row in rows:
        table.add_row(*trial_cells(row.number, row.config, row.result, row.confirmed_samples_per_s))
    return table


def trial_cells(number: int, config: TrialConfig, result: TrialResult | None, confirmed: float | None = None) -> list[str]:
    """The cells of one table row; ``-`` where a trial measured nothing."""
    if result is None:
        return [str(number), "running", config.short()] + ["-"] * 7
    status = f"[{STATUS_STYLE.get(result.status, '')}]{result.status}[/]"
    ran = result.samples_per_s > 0
    samples = "-"
    if ran:
        samples = f"{confirmed:.1f} ✓" if confirmed is not None else f"{result.samples_per_s:.1f}"
    if result.mfu is not None:
        utilisation = f"{result.mfu:.1%}"
    elif result.mfu_measured is not None:
        utilisation = f"{result.mfu_measured:.1%}*"
    else:
        utilisation = "-"
    if config.checkpointing and result.hfu is not None:
        utilisation += f"/{result.hfu:.1%}"
    note = result.error
    if not note and result.attempts > 1:
        note = f"attempt {result.attempts}"
    return [
        str(number), status, config.short(), samples,
        _fmt(result.model_tflops, ".4f") if ran else "-",
        utilisation if ran else "-",
        format_bytes(result.peak_memory_bytes) if result.peak_memory_bytes else "-",
        _fmt(result.step_time_cv, ".1%") if ran else "-",
        f"{result.wall_s:.0f}s", note[:60],
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

    def _render(self) -> Group:
        title = f"Trials (ceiling {format_bytes(self._ceiling)} of {self._memory_source})"
        return Group(trial_table(title, self._rows[-30:], self._memory_source), self._progress)

    def __enter__(self) -> SearchView:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.update(self._render())
        self._live.__exit__(*exc)  # type: ignore[arg-type]

    def trial_started(self, number: int, config: TrialConfig) -> None:
        self._trial_started = time.monotonic()
        self._progress.update(self._task, description=f"running #{number}: {config.short()}")

    def trial_finished(self, number: int, config: TrialConfig, result: TrialResult) -> None:
        self._rows.append(RankedTrial(number=number, state="", config=config, result=result))
        self._progress.update(self._task, advance=1, description="")
        self._live.update(self._render())
