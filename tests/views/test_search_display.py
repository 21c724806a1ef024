"""The live search view (autotune.views.search_display.SearchView) as a log or a pipe sees it, and the
lines printed around it: the confirmation to come, the speedup over the HF default."""

from __future__ import annotations

import io

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from rich.console import Console

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from autotune.space import SearchSpace
from autotune.storage import schema
from autotune.study import SearchRequest
from autotune.views.search_display import SearchPrinter, SearchView, print_speedup

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


def _seeded_study(default: TrialResult, results: dict[int, TrialResult], confirmation: dict | None = None):
    """Trial #0 the HF-default seed (micro-batch 64), then ``results`` (micro-batch -> result), with a
    confirmation record as ``autotune.study._confirm`` writes it."""
    study = optuna.create_study(direction="maximize")
    distribution = CategoricalDistribution([8, 16, 32, 64])
    for micro_batch, result, attrs in [(64, default, {schema.TRIAL_SEED: schema.SEED_HF_DEFAULT})] + [
        (micro_batch, result, {}) for micro_batch, result in results.items()
    ]:
        study.add_trial(
            optuna.trial.create_trial(
                params={"micro_batch": micro_batch},
                distributions={"micro_batch": distribution},
                value=result.model_tflops,
                user_attrs={schema.TRIAL_RESULT: result.to_dict(), **attrs},
            )
        )
    if confirmation is not None:
        study.set_user_attr(schema.STUDY_CONFIRMATION, confirmation)
    return study


def _ok(samples_per_s: float) -> TrialResult:
    return TrialResult(
        status="ok", samples_per_s=samples_per_s, model_tflops=samples_per_s / 100, peak_memory_bytes=GiB
    )


def _rerun(samples_per_s: float, ties_with_leader: bool = False, unsettled: bool = False) -> dict:
    return {
        "samples_per_s": samples_per_s,
        "ties_with_leader": ties_with_leader,
        "unsettled": unsettled,
        "feasible": True,
        "repeats": 2,
    }


def _speedup_line(study) -> str:
    out = io.StringIO()
    print_speedup(Console(file=out, force_terminal=False, width=400), study)
    return out.getvalue().strip()


# #0 the HF default at 50 samples/s at search time; #1 and #2 the candidates, confirmed at 90 and 80.
SEARCHED = {8: _ok(100.0), 16: _ok(95.0)}
CANDIDATES = {"top_k": 2, "candidates": [1, 2], "repeats": 2}


def test_the_speedup_compares_the_rerun_medians_where_the_default_was_rerun_beside_the_winner():
    record = {**CANDIDATES, "reference": 0, "trials": {"1": _rerun(90.0), "2": _rerun(80.0), "0": _rerun(45.0)}}
    line = _speedup_line(_seeded_study(_ok(50.0), SEARCHED, record))
    assert line == (
        "speedup over HF default: 2.00x (winner #1 mb=8 ga=1 fp32 adamw_torch at 90.0 samples/s; HF default "
        "TrainingArguments (#0) at 45.0 samples/s; re-run medians, interleaved, same ceiling)"
    )


def test_a_winner_rerun_without_the_default_is_compared_at_the_search_time_figures_of_both():
    # A record written before the default was re-run beside the candidates: no re-run of #0.
    record = {**CANDIDATES, "trials": {"1": _rerun(90.0), "2": _rerun(80.0)}}
    line = _speedup_line(_seeded_study(_ok(50.0), SEARCHED, record))
    assert line == (
        "speedup over HF default: 2.00x (winner #1 mb=8 ga=1 fp32 adamw_torch at 100.0 samples/s; HF default "
        "TrainingArguments (#0) at 50.0 samples/s; search-time figures, one measurement each, same ceiling)"
    )
    # A default that did not fit has no figure to compare: the winner is given at the ranking's figure.
    line = _speedup_line(_seeded_study(TrialResult(status="oom"), SEARCHED, record))
    assert line.endswith("did not fit (oom); winner #1 mb=8 ga=1 fp32 adamw_torch at 90.0 samples/s")


def test_the_speedup_says_when_the_budget_ran_out_before_the_winner_and_the_default_were_told_apart():
    record = {
        **CANDIDATES,
        "reference": 0,
        "trials": {"1": _rerun(90.0, unsettled=True), "2": _rerun(80.0), "0": _rerun(88.0, unsettled=True)},
    }
    line = _speedup_line(_seeded_study(_ok(50.0), SEARCHED, record))
    assert line.startswith(
        "speedup over HF default: 1.02x, not told apart from the default before the confirmation's budget ran out "
        "(winner #1"
    )


def test_the_speedup_says_when_the_winner_ties_with_the_default_within_noise():
    record = {
        **CANDIDATES,
        "reference": 0,
        "trials": {
            "1": _rerun(90.0, ties_with_leader=True),
            "2": _rerun(80.0),
            "0": _rerun(88.0, ties_with_leader=True),
        },
    }
    line = _speedup_line(_seeded_study(_ok(50.0), SEARCHED, record))
    assert line.startswith(
        "speedup over HF default: 1.02x, within noise of the default (winner #1 mb=8 ga=1 fp32 adamw_torch at 90.0"
    )
    assert line.endswith("at 88.0 samples/s; re-run medians, interleaved, same ceiling)")


@pytest.mark.parametrize(("default", "mentioned"), [(_ok(50.0), True), (TrialResult(status="oom"), False)])
def test_the_confirming_line_names_the_hf_default_rerun_for_the_speedup(tiny_workload, tmp_path, default, mentioned):
    study = _seeded_study(default, SEARCHED)
    request = SearchRequest(
        workload=tiny_workload(), space=SearchSpace({"micro_batch": [8, 16, 32, 64]}), work_root=str(tmp_path)
    )
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=120)
    printer = SearchPrinter(console, console, n_trials=3, confirm_top=2, confirm_repeats=3, confirm_budget=0.25)
    printer.study_opened(study, "memory", request)
    printer.loop_ended(None)
    confirming = next(line for line in out.getvalue().splitlines() if line.startswith("confirming: "))
    beside = "within the measured noise of it and the HF default #0 for the speedup, interleaved,"
    assert (beside in confirming) == mentioned, confirming
