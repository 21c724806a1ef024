"""The trial table: one row per trial, every measured figure with its unit, whole at 80 columns (Rich). The live
search view (:mod:`autotune.views.search_display`), ``autotune best`` and ``best --all`` print it."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from rich import box
from rich.console import JustifyMethod
from rich.table import Table

from autotune.levers import TrialConfig
from autotune.result import (
    ACCUMULATION_MEANING,
    UNFINISHED_LABELS,
    Status,
    TrialResult,
    accumulation_note,
    memory_source_description,
    precision_note,
    setup_pass_note,
)
from autotune.storage import schema
from autotune.units import byte_unit, format_bytes
from autotune.views.ranking import RankedTrial
from autotune.views.text import for_rich

# The terminal style of each status (a test checks it covers exactly autotune.result.Status).
STATUS_STYLE: dict[str, str] = {
    Status.OK: "green",
    Status.OVER_CEILING: "yellow",
    Status.OOM: "red",
    Status.SCREENED: "magenta",
    Status.PRUNED: "cyan",
    Status.DIVERGED: "red",
    Status.RECOMPILING: "red",
    Status.TIMEOUT: "red",
    Status.CRASH: "red",
    Status.ERROR: "red",
    Status.INTERRUPTED: "yellow",
    Status.COMPILE_TIMEOUT: "red",
}

LEGEND = (
    "samples/s: steady-state median over whole optimizer steps (warm-up and compilation excluded); "
    "✓ = median of the end-of-search re-runs. model TFLOPs: useful work per second (6N + 12·L·h·s per "
    "token, N the parameters a token multiplies: a mixture of experts' routed ones, k of E; PaLM; 4N + 6N_adapter + 12·L·h·s under --peft), the ranking metric. MFU: model TFLOPs over the datasheet peak of the dtype the "
    "matmuls ran in; * = over the peak measured by `autotune devices --calibrate`; - = no peak known "
    "(never invented). HFU (checkpointing only): hardware TFLOPs, which count the recomputed forward, "
    "over the same peak. peak mem: the figure the ceiling is compared with ({source}); pred: the calibrated "
    "estimate when the config was proposed. "
    "CV: step-time coefficient of variation over the steady window; - = fewer than two steps measured "
    "(one step has no spread)."
)

# What the live table says of an interrupted trial: its error is a sentence (autotune.study._record,
# _liveness), which `autotune best --all` shows whole; the live table has no room for it.
INTERRUPTED_NOTE = "stopped; queued to run again"
# The live table's notes are cut (at a word) to this many characters: one glance a row.
SHORT_NOTE_CHARS = 60


def _fmt(value: float | None, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_tflops(value: float) -> str:
    """Three significant figures at any scale (a tiny CPU model and an H100 both read well)."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def utilisation_cell(datasheet: float | None, measured: float | None) -> str:
    """``41.2%`` against the datasheet, ``48.0%*`` against the measured peak, both when both exist (one a
    line: the column stays as narrow as one figure)."""
    parts = []
    if datasheet is not None:
        parts.append(f"{datasheet:.1%}")
    if measured is not None:
        parts.append(f"{measured:.1%}*")
    return "\n".join(parts) if parts else "-"


# The table's columns, in trial_cells' order: header, justification, and whether the column is text
# that may wrap. Every other column holds one word or figure a line and never wraps, so a number is never
# split across lines; the two text columns take what width is left (an 80-column terminal included).
COLUMNS: list[tuple[str, JustifyMethod, bool]] = [
    ("#", "right", False),
    ("status", "left", False),
    ("config", "left", True),
    ("samples/s", "right", False),
    ("model\nTFLOPs", "right", False),  # two lines: the header is no wider than its figures
    ("MFU", "right", False),
    ("HFU", "right", False),
    ("peak mem", "right", False),
    ("CV", "right", False),
    ("time", "right", False),
    ("note", "left", True),
]
HFU_COLUMN = next(i for i, (header, _, _) in enumerate(COLUMNS) if header == "HFU")


def trial_table(
    title: str, rows: Sequence[RankedTrial], memory_source: str = "", short_notes: bool = False, legend: bool = True
) -> Table:
    """One row per trial: its status, lever values and every measured figure with its unit.

    Args:
        short_notes: Cut each note to a glance (the live view); else every note is whole (``autotune best``).
        legend: Say under the table what each column is (not in the live view's running frames).
    """
    # The rows' own source where none is given (`best --all`): one probe measures every trial of a device.
    sources = [memory_source] if memory_source else sorted({r.result.memory_source for r in rows if r.result})
    source = "; ".join(memory_source_description(s) for s in sources if s) or "nothing measured"
    caption = LEGEND.format(source=source)
    if any(row.result is not None and accumulation_note(row.result) for row in rows):  # said once, not per row
        caption += f" gradients xk: {ACCUMULATION_MEANING.format(steps='k')}."
    # One space between the columns and no frame: a frame and padding take 30-odd characters, the room
    # the config and the notes need in an 80-column terminal.
    table = Table(
        title=title,
        caption=caption if legend else None,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 0),
    )
    # HFU is measured under checkpointing only: a column of blanks where no row recomputes its forward.
    shown = [i for i in range(len(COLUMNS)) if i != HFU_COLUMN or any(row.config.recomputes_forward for row in rows)]
    for i in shown:
        header, justify, wraps = COLUMNS[i]
        if wraps:
            # Wrapped at spaces; a word longer than the column (adamw_torch_fused) ends in "…", never split.
            table.add_column(header, justify=justify, overflow="ellipsis")
        else:
            table.add_column(header, justify=justify, no_wrap=True)
    for row in rows:
        cells = trial_cells(
            row.number,
            row.config,
            # A confirmed trial's peak: the larger of its search run's and its re-runs' (the ceiling held in each).
            dataclasses.replace(row.result, peak_memory_bytes=row.peak_memory_bytes) if row.result else None,
            row.confirmed_samples_per_s,
            row.confirmation,
            row.state,
            short_notes=short_notes,
        )
        table.add_row(*(cells[i] for i in shown))
    return table


def trial_cells(
    number: int,
    config: TrialConfig,
    result: TrialResult | None,
    confirmed: float | None = None,
    confirmation: dict | None = None,
    state: str = "RUNNING",
    short_notes: bool = False,
) -> list[str]:
    """The cells of one table row (Rich markup); ``-`` where a trial measured nothing.

    Args:
        short_notes: Cut the note to :data:`SHORT_NOTE_CHARS`, an interrupted trial's to
            :data:`INTERRUPTED_NOTE` (the live view); else the note is whole.
    """
    if result is None:
        label = UNFINISHED_LABELS.get(state, state.lower())
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
    hfu = utilisation_cell(result.hfu, result.hfu_measured) if config.recomputes_forward else ""
    error = INTERRUPTED_NOTE if short_notes and result.status == Status.INTERRUPTED else result.error
    notes = [error] if error else []
    if result.skipped_measured_steps:
        notes.append(f"fp16 scaler skipped {result.skipped_measured_steps}/{result.measured_steps} steps (not counted)")
    notes += [note for note in [precision_note(config.precision, result)] if note]
    if accumulation_note(result):  # explained once, under the table (trial_table's caption)
        notes.append(f"gradients x{result.gradient_scale}")
    notes += result.defects
    notes += [note for note in [setup_pass_note(result)] if note]
    if result.attempts > 1:
        notes.append(f"attempt {result.attempts}")
    if confirmation:
        runs = confirmation.get("repeats", 0)
        # One re-run (the budget allowed the first round only) shows no run-to-run noise: no CV then.
        notes.append(
            f"confirmed: {runs} re-runs, CV {confirmation.get('cv', 0.0):.1%}"
            if runs >= 2
            else f"confirmed: {runs} re-run"
        )
        if confirmation.get("ties_with_leader"):
            notes.append("ties with the leader (within noise)")
        if not confirmation.get("feasible", True):
            notes.append(f"re-runs: {', '.join(confirmation.get('statuses', []))}")
    if ran and not result.steady and result.feasible:
        notes.append("CV target not met")
    note = "; ".join(notes)  # a trial's error holds whatever its exception said: escaped below
    if short_notes and len(note) > SHORT_NOTE_CHARS:
        note = note[: SHORT_NOTE_CHARS - 1].rsplit(" ", 1)[0].rstrip(";,") + "…"
    return [
        str(number),
        status,
        config.short(),
        samples,
        format_tflops(result.model_tflops) if ran else "-",
        mfu if ran else "-",
        hfu if ran else "-",
        peak_cell(result),
        cv_cell(result) if ran else "-",
        f"{result.wall_s:.0f}s",
        for_rich(note),
    ]


def cv_cell(result: TrialResult) -> str:
    """The step-time CV, or ``-`` where fewer than two steps were measured: the runner records a CV of
    0 for a single step (``runner._step_timer``), which is no spread measured, not a steady one."""
    steps = max(result.measured_steps, len(result.step_times_s))
    return _fmt(result.step_time_cv, ".1%") if steps >= 2 else "-"


def peak_cell(result: TrialResult) -> str:
    """The measured peak, and under it the prediction made when the config was proposed
    (study._screening), both in one unit so they compare at a glance."""
    predicted = result.memory_peaks.get(schema.TRIAL_PREDICTED_PEAK_BYTES)
    if not result.peak_memory_bytes:
        return "-" if predicted is None else f"-\npred {format_bytes(predicted)}"
    if predicted is None:
        return format_bytes(result.peak_memory_bytes)
    # The larger figure's unit (the narrower cell), unless the smaller would read 0.00 in it.
    larger, smaller = max(result.peak_memory_bytes, predicted), min(result.peak_memory_bytes, predicted)
    unit = byte_unit(larger)
    if smaller < unit[1] / 100:
        unit = byte_unit(smaller)
    return f"{format_bytes(result.peak_memory_bytes, unit)}\npred {format_bytes(predicted, unit)}"
