"""Divergence is judged in one place: a trial told before the HF default's loss existed (as happens
with several workers) is judged against it once it exists, and `autotune best`, the dashboard, the
export, the report and confirmation all name the same winner.

The trials are recorded through the real record step (``run_one_trial``: judge, then tell) into a
real SQLite study; only the training is replaced, by a lookup of prepared results (the ``run_trial``
seam the search benchmark uses), so that the runaway loss is exactly the one asked for.
"""

from __future__ import annotations

import optuna
import pytest

from autotune.result import TrialResult
from autotune.space import SearchSpace
from autotune.storage import open_storage
from autotune.study import SearchProgress, SearchRequest, open_study
from autotune.study._loop import ask_trial, run_one_trial
from tests.support.cli import run_cli_in_process

GiB = 1024**3
# Loss of every step (one warm-up step): the HF default falls; micro-batch 16 runs away, 10x at the end.
DEFAULT_LOSSES = [2.0, 1.9, 1.8, 1.7, 1.6, 1.5]
RUNAWAY_LOSSES = [2.0, 3.0, 5.0, 8.0, 12.0, 20.0]


def measured(losses: list[float], samples_per_s: float) -> TrialResult:
    """An ``ok`` result that fits the 8 GiB ceiling, with its loss curve."""
    return TrialResult(
        status="ok",
        samples_per_s=samples_per_s,
        model_tflops=samples_per_s / 1000,
        peak_memory_bytes=GiB,
        memory_source="peak_rss_tree_bytes",
        ceiling_bytes=8 * GiB,
        loss_curve=list(losses),
        loss_measured_from=2,
        measured_steps=5,
        steady=True,
    )


def prepared(job, timeout_s, on_tick=None) -> TrialResult:
    """The run_trial seam: micro-batch 8 trains like the HF default, 16 twice as fast but runs away."""
    if job.config.micro_batch == 8:
        return measured(DEFAULT_LOSSES, samples_per_s=10.0)
    return measured(RUNAWAY_LOSSES, samples_per_s=20.0)


@pytest.fixture
def told_before_the_default(tmp_path, sqlite_url, tiny_workload):
    """The runaway config told first, while the HF default (asked first) still ran; then the default."""
    request = SearchRequest(
        workload=tiny_workload(),
        space=SearchSpace(choices={"micro_batch": [8, 16], "pin_memory": [False]}),
        work_root=str(tmp_path / "runs"),
        screen=False,
        prune_ratio=0.0,
    )
    study = open_study(open_storage(sqlite_url), "judged", request)
    default_trial, runaway_trial = ask_trial(study, request), ask_trial(study, request)
    assert default_trial.params["micro_batch"] == 8 and runaway_trial.params["micro_batch"] == 16
    run_one_trial(study, request, SearchProgress(), trial=runaway_trial, run_trial=prepared)  # no reference yet
    run_one_trial(study, request, SearchProgress(), trial=default_trial, run_trial=prepared)
    return study, sqlite_url, default_trial.number, runaway_trial.number


def test_the_runaway_was_stored_unjudged(told_before_the_default):
    """The situation the judgement is for: the record step had no reference, Optuna keeps the record."""
    study, _, _, runaway = told_before_the_default
    stored = study.get_trials()[runaway]
    assert TrialResult.from_trial(stored).status == "ok" and stored.system_attrs["constraints"][0] <= 0


def test_every_reader_names_the_hf_default_the_winner(told_before_the_default, tmp_path):
    from autotune.result import diverged_trials
    from autotune.spec.files import Destination
    from autotune.study._confirm import confirmation_candidates
    from autotune.views.dashboard import dashboard_app, open_dashboard_storage, study_note
    from autotune.views.export import export_winner
    from autotune.views.ranking import all_trials, describe_standing, speedup_over_default, study_ranking
    from autotune.views.report import trial_rows
    from tests.views.test_dashboard import call_wsgi, user_attr

    study, url, default, runaway = told_before_the_default
    trials = study.get_trials()
    assert [r.number for r in study_ranking(study)] == [default]
    assert export_winner(study, "json", Destination(str(tmp_path / "best.json"))).number == default
    assert [number for number, _ in confirmation_candidates(study, 3)] == [default]
    assert speedup_over_default(trials).best_trial == default
    assert [number for number, _ in diverged_trials(trials)] == [runaway]
    assert f"best so far #{default} at 10.0 samples/s" in describe_standing(study)
    # `autotune best --all` and the report list it as diverged, with the reason.
    listed = {row.number: row.result for row in all_trials(trials)}
    assert listed[runaway].status == "diverged" and listed[runaway].error.startswith(
        "diverged: training loss 2 at step 1"
    )
    assert {row.number: row.status for row in trial_rows(trials)} == {default: "ok", runaway: "diverged"}
    # The dashboard: its own feasibility rule on what its API serves, and its Best-trial card.
    app = dashboard_app(open_dashboard_storage(url))
    _, detail = call_wsgi(app, f"/api/studies/{study._study_id}")
    served = {t["number"]: t for t in detail["trials"]}
    assert user_attr(served[runaway], "status") == "diverged"
    assert served[runaway]["constraints"][0] > 0 and served[runaway]["values"] == [0.0]
    assert all(value <= 0 for value in served[default]["constraints"])
    assert [t["number"] for t in detail["best_trials"]] == [default]
    note = study_note(optuna.load_study(study_name=study.study_name, storage=url))
    assert f"### Winner: trial {default}" in note and "diverged 1" in note


def test_autotune_best_names_the_hf_default(told_before_the_default, tmp_path):
    study, url, default, runaway = told_before_the_default
    shown = run_cli_in_process("best", "--storage", url, "--study-name", study.study_name, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert f"winner: #{default} at 10.0 samples/s" in shown.stdout
    everything = run_cli_in_process("best", "--storage", url, "--study-name", study.study_name, "--all", cwd=tmp_path)
    # The table has no frame (room for an 80-column terminal): a row's first two words are its number and status.
    cells = [line.split()[:2] for line in everything.stdout.splitlines() if line[:1].isdigit()]
    assert [str(runaway), "diverged"] in cells and [str(default), "ok"] in cells


def test_judging_twice_changes_nothing(told_before_the_default):
    from autotune.result import judged_trials

    study, _, _, _ = told_before_the_default
    once = judged_trials(study.get_trials())
    twice = judged_trials(once)
    assert [(t.number, t.value, t.system_attrs["constraints"], t.user_attrs["status"]) for t in twice] == [
        (t.number, t.value, t.system_attrs["constraints"], t.user_attrs["status"]) for t in once
    ]
