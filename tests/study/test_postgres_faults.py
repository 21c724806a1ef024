"""The PostgreSQL server fails under two `autotune search` processes sharing a study (a real server,
tests/support/postgres.py): restarted, then paused for four heartbeat grace periods, mid-trial, the search goes on and loses no
finished trial; its database dropped, a search process ends with one line and leaves no process behind.
Workers killed, and concurrency: tests/study/test_postgres.py, test_postgres_killed_worker.py."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotune.storage import open_storage
from tests.support.processes import wait_until_gone
from tests.support.search_workers import FAST_HEARTBEATS, search_command, start, study_trials

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

# Four of the workers' heartbeat grace periods (FAST_HEARTBEATS): long enough that a running trial's
# heartbeat goes silent past the grace, so the stale-trial path runs, as it would after a 60 s pause under
# the default 60 s grace.
PAUSE_S = 4 * int(FAST_HEARTBEATS["AUTOTUNE_HEARTBEAT_GRACE_S"])


def _two_workers(url: str, runs: Path, cwd: Path) -> list[subprocess.Popen]:
    return [start(search_command(url, runs, "--trials", "4"), cwd) for _ in range(2)]


def _wait_for_a_trial_training(storage: optuna.storages.RDBStorage, runs: Path, workers: list) -> None:
    """Until some worker's trial child is training (its log exists and its trial is RUNNING)."""
    deadline = time.monotonic() + 600
    while True:
        for worker in workers:
            assert worker.poll() is None, worker.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "no trial started"
        time.sleep(0.5)
        try:
            trials = study_trials(storage)
        except KeyError:
            continue  # the study is not created yet
        for trial in trials:
            owner = trial.system_attrs.get("autotune_owner", {}).get("pid")
            if trial.state == TrialState.RUNNING and (runs / f"trial-{trial.number}-{owner}" / "child.log").exists():
                return


def _finished(storage: optuna.storages.RDBStorage) -> dict[int, tuple]:
    return {t.number: (t.state, t.value) for t in study_trials(storage) if t.state.is_finished()}


def test_a_restarted_then_paused_server_loses_no_finished_trial(postgres_server, postgres_url, tmp_path):
    runs, storage = tmp_path / "runs", open_storage(postgres_url)
    workers = _two_workers(postgres_url, runs, tmp_path)
    _wait_for_a_trial_training(storage, runs, workers)
    postgres_server.control.restart()
    _wait_for_a_trial_training(storage, runs, workers)  # the search goes on after the restart
    before_the_pause = _finished(storage)
    server = postgres_server.control.processes()
    for process in server:
        process.suspend()  # SIGSTOP: connections stay open, nothing answers
    time.sleep(PAUSE_S)
    for process in server:
        process.resume()
    outputs = [worker.communicate(timeout=900) for worker in workers]
    for worker, (_, stderr) in zip(workers, outputs):
        assert worker.returncode == 0, stderr[-3000:]
    after = _finished(storage)
    assert {number: after.get(number) for number in before_the_pause} == before_the_pause  # nothing finished lost
    assert [t.number for t in study_trials(storage) if t.state == TrialState.RUNNING] == []
    assert any(state == TrialState.COMPLETE for state, _ in after.values())


def test_a_dropped_database_is_one_line_and_leaves_no_process(postgres_server, postgres_url, tmp_path):
    runs, storage = tmp_path / "runs", open_storage(postgres_url)
    # One worker: each process meets the drop alone (its trial child, its forkserver), so a second adds
    # ~15 s of CPU and nothing the restart and pause test above does not share.
    workers = [start(search_command(postgres_url, runs, "--trials", "4"), tmp_path)]
    _wait_for_a_trial_training(storage, runs, workers)
    descendants = [child for worker in workers for child in psutil.Process(worker.pid).children(recursive=True)]
    storage.engine.dispose()  # the test's own connection would otherwise hold the database open
    postgres_server.execute(f"DROP DATABASE {postgres_url.rsplit('/', 1)[1]} WITH (FORCE)")
    outputs = [worker.communicate(timeout=600) for worker in workers]
    for worker, (_, stderr) in zip(workers, outputs):
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert worker.returncode == 2 and len(lines) == 1 and lines[0].startswith("autotune: error: "), stderr
        assert "does not exist" in lines[0]  # the database's own words
        assert "Traceback" not in stderr
    assert all(wait_until_gone(child.pid, timeout_s=30) for child in descendants)  # trial children, forkservers
