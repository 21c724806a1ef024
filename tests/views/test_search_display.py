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


def _seeded_study(
    default: TrialResult,
    results: dict[int, TrialResult],
    confirmation: dict | None = None,
    instead_of: dict | None = None,
):
    """Trial #0 the HF-default seed (micro-batch 64), then ``results`` (micro-batch -> result), with a
    confirmation record as ``autotune.study._confirm`` writes it; ``instead_of``: the default's values the
    space could not hold, as the seed records them."""
    study = optuna.create_study(direction="maximize")
    distribution = CategoricalDistribution([8, 16, 32, 64])
    seed = {schema.TRIAL_SEED: schema.SEED_HF_DEFAULT}
    if instead_of:
        seed[schema.TRIAL_SEED_INSTEAD_OF] = instead_of
    for micro_batch, result, attrs in [(64, default, seed)] + [
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


def test_the_speedup_names_the_nearest_config_where_the_space_cannot_hold_the_default():
    """A space without the default's micro-batch seeds the nearest choice: the line says which it measured."""
    line = _speedup_line(_seeded_study(_ok(50.0), SEARCHED, instead_of={"micro_batch": 128}))
    assert line == (
        "speedup over the nearest config to the HF default in this space: 2.00x (winner #1 mb=8 ga=1 fp32 "
        "adamw_torch at 100.0 samples/s; that config (#0: micro_batch 64 instead of 128) at 50.0 samples/s; "
        "search-time figures, one measurement each, same ceiling)"
    )


def test_a_new_study_counts_no_trial_before_any_has_run(tiny_workload, tmp_path):
    """Its queued seeds are not trials run: the line says they are queued."""
    from optuna.trial import TrialState

    study = optuna.create_study(direction="maximize")
    study.enqueue_trial({"micro_batch": 8})
    study.enqueue_trial({"micro_batch": 16})
    request = SearchRequest(
        workload=tiny_workload(), space=SearchSpace({"micro_batch": [8, 16]}), work_root=str(tmp_path)
    )
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=400)
    SearchPrinter(console, console, n_trials=3, confirm_top=0, confirm_repeats=1, confirm_budget=0.25).study_opened(
        study, "memory", request
    )
    assert [t.state for t in study.trials] == [TrialState.WAITING] * 2
    line = next(line for line in out.getvalue().splitlines() if line.startswith("study "))
    assert line.endswith(", no trial run yet, 2 queued"), line
    resumed = _seeded_study(_ok(50.0), SEARCHED)
    out.truncate(0)
    SearchPrinter(console, console, n_trials=3, confirm_top=0, confirm_repeats=1, confirm_budget=0.25).study_opened(
        resumed, "memory", request
    )
    assert next(line for line in out.getvalue().splitlines() if "study " in line).endswith(", 3 trials run so far")


def test_the_accumulation_note_is_said_once_under_the_table():
    """Every ga>1 row marks its gradients; the sentence that explains it is under the table, once."""
    from autotune.views.ranking import RankedTrial
    from autotune.views.trial_table import trial_table

    rows = [
        RankedTrial(number, "COMPLETE", TrialConfig(micro_batch=8, grad_accum=k), _scaled(k))
        for number, k in enumerate([2, 4, 1, 2])
    ]
    out = io.StringIO()
    Console(file=out, force_terminal=False, width=160).print(trial_table("trials", rows))
    text = out.getvalue()
    assert text.count("the Trainer adds up") == 1, text
    assert text.count("gradients x2") == 2 and text.count("gradients x4") == 1
    plain = io.StringIO()
    Console(file=plain, force_terminal=False, width=160).print(trial_table("trials", rows[2:3]))
    assert "the Trainer adds up" not in plain.getvalue() and "gradients x" not in plain.getvalue()


def _scaled(steps: int) -> TrialResult:
    """A trial whose Trainer added up ``steps`` micro-batch mean losses (TrialResult.gradient_scale)."""
    import dataclasses

    return dataclasses.replace(_ok(10.0), gradient_scale=steps)
