"""Several workers in one process: `--workers N` on the CPU (the same code path as `--gpus`), the
study-wide cap, Ctrl-C with several trials running. Run against SQLite and a real PostgreSQL."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState, create_trial

from autotune.study._loop import DONE, START, WAIT, cap_decision
from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli_in_process
from tests.support.processes import sigint_as_from_a_terminal
from tests.support.search_workers import runs_by_trial

TINY_SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")
NOW = datetime.datetime(2026, 1, 1, 12, 0, 0)


def _running(started_s_ago: float) -> optuna.trial.FrozenTrial:
    trial = create_trial(state=TrialState.RUNNING)
    trial.datetime_start = NOW - datetime.timedelta(seconds=started_s_ago)
    return trial


def _complete() -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.COMPLETE, value=1.0)


class TestCapDecision:
    def test_starts_while_complete_and_running_trials_are_below_the_cap(self):
        trials = [_complete(), _running(5), create_trial(state=TrialState.FAIL)]
        assert cap_decision(trials, 3, patience_s=60, now=NOW) == START

    def test_failed_and_queued_trials_do_not_count(self):
        trials = [_complete(), create_trial(state=TrialState.FAIL), create_trial(state=TrialState.WAITING)]
        assert cap_decision(trials, 2, patience_s=60, now=NOW) == START

    def test_waits_at_the_cap_while_a_trial_may_still_fail(self):
        assert cap_decision([_complete(), _running(5)], 2, patience_s=60, now=NOW) == WAIT

    def test_done_at_the_cap_once_nothing_runs(self):
        assert cap_decision([_complete(), _complete(), create_trial(state=TrialState.WAITING)], 2, 60, NOW) == DONE

    def test_does_not_wait_for_a_trial_running_longer_than_any_live_one_could(self):
        assert cap_decision([_complete(), _running(3600)], 2, patience_s=60, now=NOW) == DONE


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def storage_url(request, tmp_path) -> str:
    """The same tests over both RDB backends, as Optuna runs its own suite over several storages."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'study.db'}"
    return request.getfixturevalue("postgres_url")


def _search_args(storage: str, runs: Path, *extra: str) -> list[str]:
    return [
        "search",
        "--model",
        "bert-tiny",
        "--device",
        "cpu",
        "--space",
        TINY_SPACE,
        "--storage",
        storage,
        "--study-name",
        "workers",
        "--work-dir",
        str(runs),
        *FAST_SEARCH_ARGS,
        *extra,
    ]


@pytest.mark.slow
def test_cpu_workers_run_trials_at_once_up_to_the_study_wide_cap(storage_url, tmp_path):
    runs = tmp_path / "runs"
    # A cap of 2 for 2 workers: both start at once below it, and the first to finish must not start a third.
    completed = run_cli_in_process(
        *_search_args(storage_url, runs, "--workers", "2", "--trials", "10", "--max-total-trials", "2"), cwd=tmp_path
    )
    assert completed.returncode == 0, completed.stderr[-3000:]

    from autotune.storage import open_storage

    trials = optuna.load_study(study_name="workers", storage=open_storage(storage_url)).get_trials()
    states = [t.state for t in trials]
    assert TrialState.RUNNING not in states and TrialState.WAITING not in states
    # One process asks under one lock: the cap is exact, whatever the 10 trials allowed.
    assert len([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == 2
    ran = runs_by_trial(runs)
    assert all(len(pids) == 1 for pids in ran.values()), ran  # no trial ran twice
    assert len({pid for pids in ran.values() for pid in pids}) == 1  # all from the one process
    measured = [t for t in trials if t.number in ran]
    # Two workers: some two trials were running at the same time.
    assert any(
        a.datetime_start < b.datetime_complete and b.datetime_start < a.datetime_complete
        for i, a in enumerate(measured)
        for b in measured[i + 1 :]
    ), [(t.number, t.datetime_start, t.datetime_complete) for t in measured]


def _processes_in(directory: Path) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cwd"]):
        if proc.info.get("cwd") == str(directory):
            found.append(proc)
    return found


@pytest.mark.slow
def test_ctrl_c_stops_every_worker_and_records_its_trial_as_interrupted(tmp_path):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    runs = tmp_path / "runs"
    # Long enough trials that both are surely still running when Ctrl-C comes.
    args = _search_args(storage, runs, "--workers", "2", "--trials", "4")
    args[args.index("--warmup-steps") + 1] = "10000"  # the most a trial may be asked for (plan._checks.MAX_STEPS)
    process = subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=sigint_as_from_a_terminal,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        deadline = time.monotonic() + 300
        while len(list(runs.glob("trial-*-*/child.log"))) < 2:
            assert process.poll() is None, process.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "two trials never started"
            time.sleep(0.5)
        os.killpg(process.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr[-3000:]
    assert "interrupted" in stderr

    from autotune.storage import open_storage

    trials = optuna.load_study(study_name="workers", storage=open_storage(storage)).get_trials()
    summary = [
        (t.number, t.state.name, t.user_attrs.get("result", {}).get("status"), t.system_attrs.get("failed_trial"))
        for t in trials
    ]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert [t.user_attrs["result"]["status"] for t in failed] == ["interrupted", "interrupted"], (
        summary,
        stderr[-3000:],
    )
    # Nothing is left RUNNING; each stopped config waits to run again on resume.
    assert [t.state for t in trials if t not in failed] == [TrialState.WAITING] * 2, (summary, stderr[-3000:])
    # The children (own sessions, not reached by the terminal's SIGINT) were killed too.
    deadline = time.monotonic() + 30
    while _processes_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_in(tmp_path) == []
