"""What offload keeps in host RAM, judged as the search judges it: every rank of a trial on one host
(``MemoryEstimate.host_fits``), in ``autotune estimate``'s rows, winner and tables."""

from __future__ import annotations

import dataclasses

from rich.console import Console

from autotune.estimate import MemoryFit, by_setting, plan_rows, predicted_winner
from autotune.spec.models import resolve_model
from autotune.views.plan_display import estimate_short_table, estimate_table, host_memory_note

GiB = 2**30
CHOICES = {"micro_batch": [1], "dtype": ["bf16"], "zero": ["2", "2+offload"]}


def _text(table) -> str:
    console = Console(width=250, record=True)
    console.print(table)
    return console.export_text()


def test_an_offload_row_whose_ranks_together_overflow_the_host_does_not_fit():
    model = resolve_model("llama-3.2-1b")
    two_ranks = dataclasses.replace(MemoryFit.prior("cuda"), ranks=2)
    unjudged = {row.config.zero: row for row in plan_rows(model, CHOICES, 1024, two_ranks, 200 * GiB)}
    per_rank = unjudged["2+offload"].estimate.host_bytes
    assert per_rank > 0 and unjudged["2"].estimate.host_bytes == 0
    assert all(row.fits for row in unjudged.values())

    roomy = plan_rows(model, CHOICES, 1024, two_ranks, 200 * GiB, host_ceiling_bytes=2 * per_rank)
    assert all(row.fits for row in roomy)
    # One rank's part fits this host; the trial's two do not.
    tight = plan_rows(model, CHOICES, 1024, two_ranks, 200 * GiB, host_ceiling_bytes=2 * per_rank - 1)
    verdicts = {row.config.zero: row.fits for row in tight}
    assert verdicts == {"2": True, "2+offload": False}
    assert predicted_winner(tight) is None or predicted_winner(tight).config.zero == "2"

    full = _text(estimate_table("t", tight, 200 * GiB, 1.1))
    offload_line = next(line for line in full.splitlines() if "offload" in line and "GiB" in line)
    assert "host RAM over" in offload_line
    short = _text(estimate_short_table("t", by_setting(tight), 200 * GiB, False))
    assert "host RAM over" in short and "over by -" not in short


def test_the_host_note_says_what_the_host_column_was_judged_by():
    assert "more than 4.00 GiB there does not fit" in host_memory_note("cuda", 4 * GiB)
    assert "not judged against this machine's RAM" in host_memory_note("cuda", None)
    assert "the predicted peak already holds it" in host_memory_note("cpu", 4 * GiB)
