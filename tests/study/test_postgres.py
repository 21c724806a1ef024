"""Many `autotune search` processes on one study in a real PostgreSQL server (tests/postgres.py).

Each process stands for a machine: they share nothing but the database. Optuna's RDB storage is
the coordinator: trials must be neither lost nor run twice, the study-wide cap must hold, and the
trial of a worker killed mid-trial must be failed and re-run once by another worker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.storage import open_storage
from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TINY_SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")
STUDY = "shared"
# Short heartbeats, so a dead worker's trial is recovered within seconds instead of a minute.
FAST_HEARTBEATS = {"AUTOTUNE_HEARTBEAT_INTERVAL_S": "1", "AUTOTUNE_HEARTBEAT_GRACE_S": "3"}


def _search_command(storage: str, runs: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "autotune", "search", "--model", "bert-tiny", "--device", "cpu", "--space", TINY_SPACE,
        "--storage", storage, "--study-name", STUDY, "--work-dir", str(runs), *FAST_SEARCH_ARGS, *extra,
    ]


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "COLUMNS": "200", **FAST_HEARTBEATS},
    )


def _trials(storage: optuna.storages.RDBStorage) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=STUDY, storage=storage).get_trials()


def _runs_by_trial(runs: Path) -> dict[int, list[int]]:
    """Trial number -> the orchestrator PIDs that started a child for it (``trial-<n>-<pid>``)."""
    found: dict[int, list[int]] = {}
    for path in runs.glob("trial-*-*"):
        number, pid = path.name.split("-")[1:]
        found.setdefault(int(number), []).append(int(pid))
    return found


def _all_text(trials: list[optuna.trial.FrozenTrial], study: optuna.Study) -> str:
    attrs = [study.user_attrs, study._storage.get_study_system_attrs(study._study_id)]
    for trial in trials:
        attrs += [trial.user_attrs, trial.system_attrs, trial.params]
    return repr(attrs)


def test_concurrent_workers_lose_and_duplicate_no_trial(postgres_server, postgres_url, tmp_path):
    workers, cap = 3, 4
    runs = tmp_path / "runs"
    processes = [
        _start(_search_command(postgres_url, runs, "--trials", str(cap), "--max-total-trials", str(cap)), tmp_path)
        for _ in range(workers)
    ]
    outputs = [process.communicate(timeout=900) for process in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-3000:]

    storage = open_storage(postgres_url)
    trials = _trials(storage)
    counted = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # Processes check the cap and ask without a common lock: each other one may slip one trial in.
    assert cap <= len(counted) <= cap + workers - 1
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    # The three started together, yet one of them set the study up: its seed configs were queued once.
    seed_labels = [t.user_attrs["seed"] for t in trials if "seed" in t.user_attrs and "failed_trial" not in t.system_attrs]
    assert seed_labels and len(seed_labels) == len(set(seed_labels)), seed_labels
    ran = _runs_by_trial(runs)
    assert all(len(pids) == 1 for pids in ran.values()), ran  # no trial was run twice
    assert all(t.number in ran or "reused_from" in t.user_attrs for t in counted)  # none was lost
    assert len({pids[0] for pids in ran.values()}) >= 2  # the processes really shared the work
    owners = {t.number: t.system_attrs["autotune_owner"]["pid"] for t in trials}
    assert all(owners[number] == pids[0] for number, pids in ran.items())

    # The URL carried a password: no output and no stored attribute may show it.
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert postgres_server.password in postgres_url
    for stdout, stderr in outputs:
        assert postgres_server.password not in stdout + stderr
        assert "autotune:***@" in stdout  # the storage is still named, redacted
    assert postgres_server.password not in _all_text(trials, study)


def test_workers_opening_a_new_study_at_once_set_it_up_once(postgres_url, cpu, tiny_workload):
    import threading

    from autotune.space import load_space
    from autotune.study import SearchRequest, open_study

    request = SearchRequest(
        workload=tiny_workload(ceiling_bytes=2 * 1024**3),
        space=load_space(TINY_SPACE, cpu),
    )
    # Four "machines" at once on an empty database: each opens its own storage (Optuna creates its
    # tables then) and creates the study.
    workers = 4
    barrier = threading.Barrier(workers)
    errors: list[BaseException] = []

    def join() -> None:
        barrier.wait()
        try:
            open_study(open_storage(postgres_url), STUDY, request)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=join) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    storage = open_storage(postgres_url)
    seeds = [t.user_attrs["seed"] for t in _trials(storage)]
    assert seeds and len(seeds) == len(set(seeds)), seeds  # queued once, not once per worker
    study = optuna.load_study(study_name=STUDY, storage=storage)
    assert study.user_attrs["identity"] == request.identity()


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
    victim = _start(other_host + _search_command(postgres_url, runs, "--trials", str(cap)), tmp_path)
    try:
        deadline = time.monotonic() + 600
        killed = None
        while killed is None:
            assert victim.poll() is None, victim.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the first worker never started a trial"
            time.sleep(0.5)
            try:
                running = [t for t in _trials(storage) if t.state == TrialState.RUNNING]
            except KeyError:
                continue  # the study is not created yet
            for trial in running:
                owner = trial.system_attrs.get("autotune_owner", {})
                if owner.get("pid") == victim.pid and (runs / f"trial-{trial.number}-{victim.pid}" / "child.log").exists():
                    killed = trial  # its child is training: mid-trial
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
    finally:
        if victim.poll() is None:
            victim.kill()
    assert [t.state for t in _trials(storage) if t.number == killed.number] == [TrialState.RUNNING]

    survivor = _start(_search_command(postgres_url, runs, "--trials", str(cap), "--max-total-trials", str(cap)), tmp_path)
    stdout, stderr = survivor.communicate(timeout=900)
    assert survivor.returncode == 0, stderr[-3000:]

    trials = _trials(storage)
    by_number = {t.number: t for t in trials}
    assert by_number[killed.number].state == TrialState.FAIL
    reruns = [t for t in trials if t.system_attrs.get("failed_trial") == killed.number]
    assert len(reruns) == 1, [(t.number, t.state, t.system_attrs.get("failed_trial")) for t in trials]
    rerun = reruns[0]
    assert rerun.state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert rerun.params == killed.params
    assert rerun.system_attrs["autotune_owner"]["pid"] == survivor.pid
    ran = _runs_by_trial(runs)
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


def test_a_password_in_the_url_is_never_printed_even_when_the_connection_fails(postgres_server, tmp_path):
    wrong_password = "wrong-" + postgres_server.password[::-1]
    url = postgres_server.url("postgres", password=wrong_password)
    completed = run_cli(
        "search", "--model", "bert-tiny", "--device", "cpu", "--storage", url, "--trials", "1", cwd=tmp_path, timeout=120
    )
    assert completed.returncode == 2
    assert "cannot open it" in completed.stderr
    assert "autotune:***@" in completed.stderr
    assert wrong_password not in completed.stdout + completed.stderr
