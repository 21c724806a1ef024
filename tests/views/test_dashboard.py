"""`autotune dashboard`: optuna-dashboard on a real study, read through its own JSON API."""

from __future__ import annotations

import io
import json
import os
import queue
import re
import subprocess
import sys
import threading
import urllib.request
from wsgiref.util import setup_testing_defaults

import optuna
import pytest

from tests.support.cli import run_cli

pytestmark = pytest.mark.slow

STARTUP_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def dashboard(searched_study):
    """`autotune dashboard --port 0` in a subprocess; yields its base URL (http://127.0.0.1:PORT)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune", "dashboard", "--storage", searched_study.storage, "--port", "0"],
        cwd=searched_study.workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "300"},
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        url = None
        while url is None:
            try:
                line = lines.get(timeout=STARTUP_TIMEOUT_S)
            except queue.Empty:
                pytest.fail(f"no URL from autotune dashboard within {STARTUP_TIMEOUT_S} s: {process.stderr.read()}")
            if "http://" in line:
                url = line[line.index("http://") :].split()[0]
        yield url.split("/dashboard")[0]
    finally:
        process.terminate()
        process.wait(timeout=30)


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=60) as response:
        assert response.status == 200
        return json.load(response)


def user_attr(trial: dict, key: str) -> str | None:
    return next((a["value"] for a in trial["user_attrs"] if a["key"] == key), None)


def study_detail(base: str, name: str) -> dict:
    studies = get_json(f"{base}/api/studies")["study_summaries"]
    study_id = next(s["study_id"] for s in studies if s["study_name"] == name)
    return get_json(f"{base}/api/studies/{study_id}")


def test_dashboard_listens_on_loopback_only(dashboard):
    assert dashboard.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(f"{dashboard}/dashboard/", timeout=60) as response:
        assert response.status == 200
        assert b"<html" in response.read().lower()


def test_dashboard_shows_every_trial_and_marks_the_oom_infeasible(dashboard, searched_study):
    detail = study_detail(dashboard, searched_study.study_name)
    study = optuna.load_study(study_name=searched_study.study_name, storage=searched_study.storage)
    assert sorted(t["number"] for t in detail["trials"]) == [t.number for t in study.trials]
    assert detail["objective_names"] == ["model TFLOPs"]
    statuses = set()
    for trial in detail["trials"]:
        status = user_attr(trial, "status")
        statuses.add(status)
        if trial["state"] != "Complete":
            continue  # pruned trials: the dashboard shows no value, so no feasibility either
        # The dashboard's own feasibility rule, applied to what its API serves, agrees with autotune.
        assert trial["constraints"], f"trial {trial['number']} carries no constraint"
        feasible = all(value <= 0 for value in trial["constraints"])
        assert feasible == (status == "ok"), (trial["number"], status, trial["constraints"])
    oom = next(t for t in detail["trials"] if t["number"] == searched_study.oom_trial_number)
    assert user_attr(oom, "status") == "oom" and oom["constraints"][0] > 0 and oom["values"] == [0.0]
    assert "ok" in statuses and "oom" in statuses


def test_dashboard_best_trial_is_the_fastest_feasible_one(dashboard, searched_study):
    detail = study_detail(dashboard, searched_study.study_name)
    assert len(detail["best_trials"]) == 1
    best = detail["best_trials"][0]
    assert all(value <= 0 for value in best["constraints"])
    feasible = [t for t in detail["trials"] if all(v <= 0 for v in t["constraints"])]
    assert best["values"][0] == max(t["values"][0] for t in feasible) > 0


def test_dashboard_note_ranks_configs_and_shows_the_winners_export(dashboard, searched_study):
    from autotune.views.dashboard import NOTE_SIGNATURE
    from autotune.views.export import winner_arguments

    note = study_detail(dashboard, searched_study.study_name)["note"]["body"]
    study = optuna.load_study(study_name=searched_study.study_name, storage=searched_study.storage)
    assert note.startswith(f"## {searched_study.study_name}")
    assert "model TFLOPs" in note and "ceiling **1.00 GiB**" in note
    assert re.search(r"oom [1-9]", note)  # the trial counts name the OOM
    assert "| rank | trial | config | samples/s |" in note
    exported = note.split("```json\n")[1].split("```")[0]
    assert json.loads(exported) == winner_arguments(study)
    assert "--per_device_train_batch_size" in note
    assert note.rstrip().endswith(NOTE_SIGNATURE)
    # Where the search's wall time went: the line `autotune search` ended with, the same in the note.
    printed = [line for line in searched_study.search.stdout.splitlines() if line.startswith("time: ")]
    assert len(printed) == 1 and "measured steps" in printed[0] and "confirmation 0%" in printed[0]
    assert f"Last search: {printed[0]}." in note


def call_wsgi(app, path: str) -> tuple[str, dict]:
    environ: dict = {"PATH_INFO": path, "REQUEST_METHOD": "GET", "wsgi.input": io.BytesIO()}
    setup_testing_defaults(environ)
    status: list[str] = []
    body = b"".join(app(environ, lambda s, headers, exc_info=None: status.append(s)))
    return status[0], json.loads(body)


def test_no_best_trial_while_nothing_fits(searched_study, tmp_path):
    """A study whose only finished trial ran out of memory: the Best-trial card stays empty."""
    from autotune.views.dashboard import dashboard_app, open_dashboard_storage

    source = optuna.load_study(study_name=searched_study.study_name, storage=searched_study.storage)
    url = f"sqlite:///{tmp_path / 'oom-only.db'}"
    only_oom = optuna.create_study(study_name="oom-only", storage=url, direction="maximize")
    only_oom.add_trial(source.trials[searched_study.oom_trial_number])  # the real OOM record, copied

    app = dashboard_app(open_dashboard_storage(url))
    status, detail = call_wsgi(app, f"/api/studies/{only_oom._study_id}")
    assert status.startswith("200")
    assert len(detail["trials"]) == 1 and detail["trials"][0]["constraints"][0] > 0
    assert detail["best_trials"] == []


def test_best_trial_skips_infeasible_trials_with_larger_values(tmp_path):
    """Also for studies written by other tools, where an infeasible trial may carry the largest value."""
    from optuna.distributions import CategoricalDistribution

    from autotune.views.dashboard import dashboard_app, open_dashboard_storage

    url = f"sqlite:///{tmp_path / 'other.db'}"
    study = optuna.create_study(study_name="other", storage=url, direction="maximize")
    space = {"micro_batch": CategoricalDistribution([8, 16, 32])}
    for micro_batch, value, excess_gib in ((8, 1.0, -2.0), (16, 2.0, -1.0), (32, 9.0, 0.5)):
        study.add_trial(
            optuna.trial.create_trial(
                params={"micro_batch": micro_batch},
                distributions=space,
                value=value,
                system_attrs={"constraints": [excess_gib]},
            )
        )
    app = dashboard_app(open_dashboard_storage(url))
    _, detail = call_wsgi(app, f"/api/studies/{study._study_id}")
    assert [t["number"] for t in detail["best_trials"]] == [1]


def test_dashboard_refuses_a_missing_database_in_one_line(tmp_path):
    shown = run_cli("dashboard", "--storage", f"sqlite:///{tmp_path / 'nothing.db'}", "--port", "0")
    assert shown.returncode == 2
    assert shown.stderr.count("\n") == 1 and "no such database file" in shown.stderr
    assert not (tmp_path / "nothing.db").exists()
