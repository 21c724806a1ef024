"""The trial tables and the live view in an 80-column terminal (autotune.views.search_display): no figure
split across lines, memory in one unit, no CV where one step was measured, the progress bar's count and
elapsed time whole."""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.storage import schema
from autotune.views.ranking import RankedTrial
from autotune.views.search_display import SearchView, ranking_title
from autotune.views.trial_table import COLUMNS, INTERRUPTED_NOTE, peak_cell, trial_cells, trial_table

MiB = 1024**2
GiB = 1024**3
INTERRUPTED_ERROR = (
    "the search was stopped (Ctrl-C, a signal, or its process could not start) while this trial ran; "
    "it runs again on resume"
)
LONG_CONFIG = TrialConfig(micro_batch=8, optim="adamw_torch_fused", dataloader_workers=2, compile="inductor")


def _rows() -> list[RankedTrial]:
    """The rows of the reported search: a single measured step, a predicted peak in another unit, an
    interrupted trial, one still running, and wider figures (a confirmed median, both MFUs, checkpointing)."""
    return [
        RankedTrial(
            0,
            "COMPLETE",
            LONG_CONFIG,
            TrialResult(
                status="ok",
                samples_per_s=123.4,
                model_tflops=0.00195,
                peak_memory_bytes=int(1001.91 * MiB),
                measured_steps=1,
                step_times_s=[0.1],
                wall_s=12,
                memory_peaks={schema.TRIAL_PREDICTED_PEAK_BYTES: int(1.01 * GiB)},
            ),
        ),
        RankedTrial(
            1,
            "COMPLETE",
            TrialConfig(micro_batch=16, checkpointing=True),
            TrialResult(
                status="ok",
                samples_per_s=1234.5,
                model_tflops=312.4,
                mfu=0.412,
                mfu_measured=0.48,
                hfu=0.55,
                peak_memory_bytes=int(71.3 * GiB),
                step_time_cv=0.034,
                measured_steps=5,
                step_times_s=[0.1] * 5,
                steady=True,
                wall_s=1234,
            ),
            confirmed_samples_per_s=1201.9,
            confirmation={"repeats": 3, "cv": 0.012},
        ),
        RankedTrial(
            12, "FAIL", TrialConfig(micro_batch=32), TrialResult(status="interrupted", error=INTERRUPTED_ERROR)
        ),
        RankedTrial(13, "COMPLETE", TrialConfig(micro_batch=64), TrialResult(status="over_ceiling", wall_s=40)),
        RankedTrial(14, "RUNNING", LONG_CONFIG, None),
    ]


def _render(renderable: object, width: int = 80) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, force_terminal=False)
    console.print(renderable)
    return console.export_text()


def test_at_80_columns_no_figure_is_split_across_lines():
    rows = _rows()
    for short_notes in (False, True):
        shown = _render(trial_table("Trials", rows, short_notes=short_notes))
        assert max(len(line) for line in shown.splitlines()) <= 80
        lines = shown.splitlines()
        for row in rows:
            cells = trial_cells(row.number, row.config, row.result, row.confirmed_samples_per_s, row.confirmation)
            for (header, _, wraps), cell in zip(COLUMNS, cells, strict=True):
                if wraps:
                    continue
                for part in Text.from_markup(cell).plain.splitlines():
                    # Whole on one line (a "-" or a blank says nothing of splitting).
                    assert part in ("", "-") or any(part in line for line in lines), (header, part, shown)
            # The row starts with its number and status, whole.
            status = Text.from_markup(cells[1]).plain
            assert any(line.startswith(f"{row.number:>2} {status}") for line in lines), shown


def test_the_config_column_wraps_at_spaces_and_never_splits_a_word():
    # The reported search (CPU: no peak, no checkpointing): the config keeps room to be read.
    rows = [row for row in _rows() if row.number != 1]
    shown = _render(trial_table("Trials", rows, short_notes=True))
    words = {word for line in shown.splitlines() for word in line.split()}
    assert {"mb=8", "ga=1", "fp32", "workers=2"} <= words, shown
    # A word wider than the column ends in "…"; no line holds the rest of one.
    assert not words & {"_torc", "h_fus", "ed", "h", "ducto", "r"}, shown
    assert any(word.startswith("adamw_to") for word in words), shown


def test_the_live_table_gives_an_interrupted_trial_a_short_note_and_best_all_the_whole_sentence():
    rows = _rows()[2:3]
    live = _render(trial_table("Trials", rows, short_notes=True), width=200)
    assert INTERRUPTED_NOTE in live and "Ctrl-C" not in live
    whole = _render(trial_table("All trials", rows), width=300)
    assert INTERRUPTED_ERROR in whole


def test_a_long_note_is_cut_at_a_word_in_the_live_table():
    result = TrialResult(status="error", error="RuntimeError: " + "something went wrong " * 10)
    note = trial_cells(3, TrialConfig(), result, short_notes=True)[-1]
    assert note.endswith("…") and len(note) <= 60 and note[:-1].endswith("wrong")
    assert trial_cells(3, TrialConfig(), result)[-1] == result.error  # whole where not asked short


def test_the_measured_and_predicted_peaks_are_in_one_unit():
    def cell(peak: float, predicted: float) -> str:
        memory_peaks = {schema.TRIAL_PREDICTED_PEAK_BYTES: int(predicted)}
        return peak_cell(TrialResult(status="ok", peak_memory_bytes=int(peak), memory_peaks=memory_peaks))

    assert cell(1019.41 * MiB, 1.01 * GiB) == "1.00 GiB\npred 1.01 GiB"
    assert cell(500 * MiB, 600 * MiB) == "500.00 MiB\npred 600.00 MiB"
    # A prediction far off: the small figure keeps its digits rather than read 0.00 GiB.
    assert cell(5 * MiB, 2 * GiB) == "5.00 MiB\npred 2048.00 MiB"
    assert peak_cell(TrialResult(status="ok", peak_memory_bytes=GiB)) == "1.00 GiB"


def test_one_measured_step_has_no_cv():
    one = TrialResult(status="ok", samples_per_s=10.0, measured_steps=1, step_times_s=[0.1], step_time_cv=0.0)
    assert trial_cells(0, TrialConfig(), one)[8] == "-"
    none = TrialResult(status="ok", samples_per_s=10.0)
    assert trial_cells(0, TrialConfig(), none)[8] == "-"
    five = TrialResult(status="ok", samples_per_s=10.0, measured_steps=5, step_times_s=[0.1] * 5, step_time_cv=0.0)
    assert trial_cells(0, TrialConfig(), five)[8] == "0.0%"
    caption = trial_table("Trials", [RankedTrial(0, "COMPLETE", TrialConfig(), one)]).caption
    assert "- = fewer than two steps measured" in str(caption)


def test_the_hfu_column_is_shown_only_where_a_row_recomputes_its_forward():
    rows = _rows()
    assert "HFU" in _render(trial_table("Trials", rows)).splitlines()[2]
    assert "HFU" not in _render(trial_table("Trials", rows[:1])).splitlines()[2]


def test_the_ranking_title_says_a_single_measurement_is_never_put_above_the_confirmed_leader():
    rows = _rows()[:2]
    assert ranking_title("s", rows[:1]) == "Feasible configurations of s, fastest first"
    assert ranking_title("s", rows) == (
        "Feasible configurations of s, fastest first; unconfirmed single measurements below the confirmed leader"
    )
    # Every row confirmed: no unconfirmed row to speak of.
    assert ranking_title("s", rows[1:]) == "Feasible configurations of s, fastest first"


def test_a_confirmed_rows_peak_is_the_larger_of_its_search_run_and_its_re_runs_as_export_says():
    """`best` showed the search run's peak beside the confirmed speed, `export` and the report the larger of it and
    the re-runs' (RankedTrial.peak_memory_bytes): one figure now, the one the ceiling held in every run."""
    import dataclasses

    from autotune.views.ranking import ranked_result

    confirmed = _rows()[1]
    rerun_peak = int(72.5 * GiB)
    row = dataclasses.replace(
        confirmed, confirmation={**(confirmed.confirmation or {}), "peak_memory_bytes": rerun_peak}
    )
    shown = _render(trial_table("Trials", [row]), width=200)
    assert "72.50 GiB" in shown and "71.30 GiB" not in shown
    result = ranked_result(row)
    assert result is not None and result.peak_memory_bytes == rerun_peak


def test_a_table_given_no_memory_source_names_its_rows_own():
    caption = str(trial_table("All trials", _rows()).caption)
    assert "see each trial's memory_source" not in caption
    measured = TrialResult(status="ok", samples_per_s=1.0, memory_source="peak_rss_tree_bytes")
    caption = str(trial_table("All trials", [RankedTrial(0, "COMPLETE", TrialConfig(), measured)]).caption)
    assert "peak resident memory (RSS) of the trial's whole process tree" in caption


def _view_lines(view: SearchView, console: Console) -> list[str]:
    console.print(view._render())
    return console.export_text().splitlines()


def test_the_progress_bar_counts_finished_trials_and_keeps_its_count_and_time_at_80_columns():
    console = Console(file=io.StringIO(), width=80, record=True, force_terminal=False)
    view = SearchView(console, 4, 2 * GiB, "peak RSS of the trial's process tree")
    ok = TrialResult(status="ok", samples_per_s=10.0, model_tflops=0.01, peak_memory_bytes=GiB)
    view.trial_started(0, LONG_CONFIG)
    view.trial_finished(0, LONG_CONFIG, ok)
    view.trial_started(1, LONG_CONFIG)
    view.trial_finished(1, LONG_CONFIG, TrialResult(status="interrupted", error=INTERRUPTED_ERROR))
    view.trial_started(2, LONG_CONFIG)
    view.trial_finished(2, LONG_CONFIG, TrialResult(status="oom"))
    view.trial_started(3, LONG_CONFIG)
    bar = next(line for line in _view_lines(view, console) if line.startswith("trials"))
    # Two finished (ok, oom); the interrupted one runs again. The elapsed time whole, the running config cut.
    assert " 2/4 0:00:0" in bar and "running #3: mb=8" in bar and bar.endswith("…"), bar
    assert len(bar) <= 80


def test_on_a_short_terminal_the_live_frame_fits_with_its_bar_and_the_last_frame_keeps_the_legend():
    """Rich crops a live frame taller than the terminal from the bottom: 30 rows and the legend in a 24-line
    terminal hid the bar. Each running frame shows the last trials that fit over the bar; the last frame, printed
    whole when the view closes, has every row of them and the legend."""
    console = Console(file=io.StringIO(), width=80, height=24, force_terminal=True)
    view = SearchView(console, 40, 2 * GiB, "peak RSS of the trial's process tree")
    ok = TrialResult(status="ok", samples_per_s=10.0, model_tflops=0.01, peak_memory_bytes=GiB)
    for number in range(35):
        view.trial_started(number, LONG_CONFIG)
        view.trial_finished(number, LONG_CONFIG, ok)
    lines = [segments for segments in console.render_lines(view._render(), pad=False)]
    text = ["".join(segment.text for segment in line) for line in lines]
    assert len(text) <= 24 and text[-1].startswith("trials") and "35/40" in text[-1]
    assert "the last" in " ".join(text) and sum(line[:3].strip().isdigit() for line in text) >= 3
    assert not any("steady-state median" in line for line in text)
    final = ["".join(s.text for s in line) for line in console.render_lines(view._render(final=True), pad=False)]
    assert any("steady-state median" in line for line in final) and len(final) > 24
    # In a log nothing is cropped: every frame is the whole one.
    log = Console(file=io.StringIO(), width=80, height=24, force_terminal=False)
    quiet = SearchView(log, 2, 2 * GiB, "peak RSS of the trial's process tree")
    assert any("steady-state median" in "".join(s.text for s in line) for line in log.render_lines(quiet._render()))
