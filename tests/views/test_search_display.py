"""The live search view (autotune.views.search_display.SearchView) as a log or a pipe sees it."""

from __future__ import annotations

import io

from rich.console import Console

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.views.search_display import SearchView

GiB = 1024**3


def test_in_a_log_the_line_after_the_view_starts_on_its_own_line():
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    view = SearchView(console, 1, 2 * GiB, "peak RSS of the trial's process tree")
    with view:
        config = TrialConfig(micro_batch=8)
        view.trial_started(0, config)
        view.trial_finished(
            0, config, TrialResult(status="ok", samples_per_s=10.0, model_tflops=0.01, peak_memory_bytes=GiB)
        )
    console.print("12 trials measured or screened 12 distinct configs")
    lines = out.getvalue().splitlines()
    assert lines[-1] == "12 trials measured or screened 12 distinct configs"
    assert any(line.startswith("trials") and "1/1" in line for line in lines[:-1])
