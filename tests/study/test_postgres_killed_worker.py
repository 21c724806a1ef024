"""The trial of an `autotune search` process killed mid-trial is failed and re-run once by another
process on the same study in a real PostgreSQL server (tests/postgres.py); the other workers' tests
are in tests/study/test_postgres.py."""

from __future__ import annotations

import shutil
import signal
import subprocess
import time

import pytest
from optuna.trial import TrialState

from autotune.storage import open_storage
from tests.support.search_workers import runs_by_trial, search_command, start, study_trials

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _other_host_prefix() -> list[str]:
    """A command prefix that runs a program under another host name, as on a second machine.

    Needs a UTS namespace (root, or a kernel allowing it); empty where none can be made, and the
    dead worker is then recognised on this host by its PID instead of by its heartbeat.
    """
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    probe = subprocess.run([unshare, "--uts", "true"], capture_output=True)
    if probe.returncode != 0:
        return []
    return [unshare, "--uts", "sh", "-c", 'hostname autotune-machine-b && exec "$@"', "sh"]


def test_trial_of_a_killed_worker_is_failed_and_rerun_once_by_another(postgres_url, tmp_path):
    cap = 2
    runs = tmp_path / "runs"
    other_host = _other_host_prefix()
    storage = open_storage(postgres_url)
    # The victim's child hangs in its first step (it writes hung.pid first): the kill below always lands
    # mid-trial, however fast the machine trains (a trial that finished between the poll and the kill
    # failed this test once, on a fresh clone under CI's load). The survivor runs without the callback.
    hang = ("--callback", "tests.support.faults:HangAtStep")
    victim = start(other_host + search_command(postgres_url, runs, "--trials", str(cap), *hang), tmp_path)
    try:
        deadline = time.monotonic() + 600
        killed = None
        while killed is None:
            assert victim.poll() is None, victim.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first worker never started a trial"
            time.sleep(0.5)
            try:
                running = [t for t in study_trials(storage) if t.state == TrialState.RUNNING]
            except KeyError:
                continue  # the study is not created yet
            for trial in running:
                owner = trial.system_attrs.get("autotune_owner", {})
                if owner.get("pid") == victim.pid and any(
                    (runs / f"trial-{trial.number}-{victim.pid}").rglob("hung.pid")
                ):
                    killed = trial  # its child trained a step and hangs in the next: mid-trial
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
    finally:
        if victim.poll() is None:
            victim.kill()
    assert [t.state for t in study_trials(storage) if t.number == killed.number] == [TrialState.RUNNING]

    survivor = start(search_command(postgres_url, runs, "--trials", str(cap), "--max-total-trials", str(cap)), tmp_path)
    stdout, stderr = survivor.communicate(timeout=900)
    assert survivor.returncode == 0, stderr[-3000:]

    trials = study_trials(storage)
    by_number = {t.number: t for t in trials}
    assert by_number[killed.number].state == TrialState.FAIL
    reruns = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(reruns) == 1, [(t.number, t.state, t.system_attrs.get("failed_trial")) for t in trials]
    rerun = reruns[0]
    assert rerun.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert rerun.params == killed.params
    assert rerun.system_attrs["autotune_owner"]["pid"] == survivor.pid
    ran = runs_by_trial(runs)
    assert ran.get(rerun.number, [survivor.pid]) == [survivor.pid]  # run once (or its result reused)
    # One process asked after the kill: the cap is exact, and nothing is left running or queued.
    assert len([t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]) == cap
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    marked_dead_by_pid = "orchestrator died" in by_number[killed.number].user_attrs.get("result", {}).get("error", "")
    if other_host:
        # On "another machine" no PID can be checked: only the heartbeat going silent told.
        assert not marked_dead_by_pid
    else:
        assert marked_dead_by_pid
