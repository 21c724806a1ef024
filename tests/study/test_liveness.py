"""Liveness (autotune.study._liveness): who runs a trial, and recovery of the trials of a worker that
died, in a real SQLite storage with the owner of a real process that has exited."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import time

import optuna
import pytest
from optuna.trial import TrialState

from autotune.result import TrialResult
from autotune.storage import open_storage, schema
from autotune.study._liveness import Heartbeat, interrupt_own_running, mark_owner, recover_orphans, worker_identity

DISTRIBUTIONS = {"micro_batch": optuna.distributions.CategoricalDistribution([8, 16])}


@pytest.fixture
def study(sqlite_url) -> optuna.Study:
    return optuna.create_study(storage=open_storage(sqlite_url), direction="maximize")


@pytest.fixture(scope="module")
def dead_worker() -> dict:
    """The identity a worker that has exited left on its trials: this host, a PID now gone."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = {**worker_identity(), "pid": process.pid}
    process.wait()
    return identity


def asked_by(study: optuna.Study, owner: dict) -> optuna.Trial:
    trial = study.ask(DISTRIBUTIONS)
    study._storage.set_trial_system_attr(trial._trial_id, schema.TRIAL_OWNER, {**owner, "trial": trial.number})
    return trial


def trials_with_a_heartbeat(tmp_path) -> set[int]:
    """Trial ids in Optuna's heartbeat table of the study's database."""
    with sqlite3.connect(tmp_path / "study.db") as connection:
        return {row[0] for row in connection.execute("SELECT trial_id FROM trial_heartbeats")}


def test_mark_owner_names_this_worker_and_records_a_first_heartbeat(study, tmp_path):
    trial = study.ask(DISTRIBUTIONS)
    assert trials_with_a_heartbeat(tmp_path) == set()
    mark_owner(study, trial)
    stored = study._storage.get_trial(trial._trial_id)
    assert stored.system_attrs[schema.TRIAL_OWNER] == {**worker_identity(), "trial": trial.number}
    # Only a trial with a heartbeat can ever be found stale: without one, a worker that died right
    # after asking would leave it RUNNING for ever.
    assert trials_with_a_heartbeat(tmp_path) == {trial._trial_id}


@pytest.mark.slow
def test_recover_orphans_fails_a_dead_workers_trial_and_queues_its_config_once(study, dead_worker):
    orphan = asked_by(study, dead_worker)
    params = orphan.params
    assert recover_orphans(study) == [orphan.number]
    failed = study._storage.get_trial(orphan._trial_id)
    assert failed.state == TrialState.FAIL
    recorded = TrialResult.from_trial(failed)
    assert recorded is not None and recorded.status == "interrupted" and "orchestrator died" in recorded.error
    [queued] = study.get_trials(states=(TrialState.WAITING,))
    assert queued.params == params  # the next ask of any worker runs it again
    assert recover_orphans(study) == []  # once: the queued copy is not an orphan


@pytest.mark.slow
def test_recover_orphans_leaves_live_and_unseeable_workers_trials_alone(study, dead_worker):
    mine = study.ask(DISTRIBUTIONS)
    mark_owner(study, mine)  # this process: alive
    elsewhere = asked_by(
        study, {**dead_worker, "host": f"not-{socket.gethostname()}"}
    )  # its PID cannot be checked here
    other_namespace = asked_by(study, {**dead_worker, "pid_ns": -1})  # another container on this host
    reused_pid = asked_by(study, {**worker_identity(), "started": worker_identity()["started"] - 3600})  # PID reused
    copy = study.ask(DISTRIBUTIONS)  # a re-queued copy still carrying its dead original's owner
    study._storage.set_trial_system_attr(
        copy._trial_id, schema.TRIAL_OWNER, {**dead_worker, "trial": copy.number + 100}
    )
    assert recover_orphans(study) == [reused_pid.number]  # a new process under the old PID is not the owner
    running = {t.number for t in study.get_trials(states=(TrialState.RUNNING,))}
    assert running == {mine.number, elsewhere.number, other_namespace.number, copy.number}


@pytest.mark.slow
def test_interrupt_own_running_records_only_this_workers_trials_and_queues_them_again(study, dead_worker):
    mine = study.ask(DISTRIBUTIONS)
    mark_owner(study, mine)
    other = asked_by(study, dead_worker)
    assert interrupt_own_running(study, ceiling_bytes=1024**3) == [mine.number]
    stopped = study._storage.get_trial(mine._trial_id)
    assert stopped.state == TrialState.FAIL and TrialResult.from_trial(stopped).status == "interrupted"
    assert study._storage.get_trial(other._trial_id).state == TrialState.RUNNING
    assert [t.params for t in study.get_trials(states=(TrialState.WAITING,))] == [mine.params]


@pytest.mark.slow
def test_a_config_stopped_again_on_resume_is_queued_again(study):
    """A stop measures nothing of the config: the re-run of an interrupted trial, stopped too, is queued once more
    (Optuna's retry callback with ``max_retry=1`` queued it once only, and the next resume lost it)."""
    first = study.ask(DISTRIBUTIONS)
    mark_owner(study, first)
    interrupt_own_running(study, ceiling_bytes=1024**3)
    for _ in range(2):
        rerun = study.ask()  # the queued config, first thing on resume
        assert rerun.params == first.params
        mark_owner(study, rerun)
        assert interrupt_own_running(study, ceiling_bytes=1024**3) == [rerun.number]
        assert [t.params for t in study.get_trials(states=(TrialState.WAITING,))] == [first.params]


def test_a_heartbeat_is_recorded_at_most_once_per_interval(study, tmp_path):
    trial = study.ask(DISTRIBUTIONS)
    heartbeat = Heartbeat(study, trial)
    heartbeat.beat()
    assert trials_with_a_heartbeat(tmp_path) == {trial._trial_id}
    first = heartbeat_times(tmp_path)
    time.sleep(1.1)  # past the database's one-second resolution, well within the interval (10 s)
    heartbeat.beat()
    assert heartbeat_times(tmp_path) == first  # not written again


def heartbeat_times(tmp_path) -> list[str]:
    with sqlite3.connect(tmp_path / "study.db") as connection:
        return [row[0] for row in connection.execute("SELECT heartbeat FROM trial_heartbeats")]
