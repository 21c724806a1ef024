"""Faults that must cost nothing already measured (issue 16, groups 4 and 5): a full disk at a write,
a read-only database, a resumed study's failed seeds, Ctrl-C at start-up and during confirmation.

Real file systems: a full disk is a small tmpfs filled to the last byte
(``tests.support.faults.fill_file_system``), a read-only database lives on a tmpfs remounted
read-only. Mounting needs root (CI runs as root); elsewhere those cases are skipped with the reason.
The one-line cases of bad options and files are in tests/test_bad_input.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

from autotune.result import TrialResult
from tests.support.bad_input import TINY_SPACE, assert_one_error_line, create_study
from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli

# --- real file systems: full and read-only --------------------------------------------------------


@contextlib.contextmanager
def tmpfs(directory: Path, size: str):
    """A real tmpfs of ``size`` mounted on ``directory``; skips the test where mounting is not allowed."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def remount_read_only(directory: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)


def test_read_only_database_serves_best_and_export(searched_study, tmp_path):
    """Only `search` writes the storage: `best`, `export` and `report` read a database on a read-only file system."""
    with tmpfs(tmp_path / "ro", "16m") as mount:
        shutil.copy(searched_study.workdir / "autotune.db", mount / "study.db")
        remount_read_only(mount)
        storage = f"sqlite:///{mount / 'study.db'}"
        best = run_cli("best", "--storage", storage, cwd=tmp_path)
        export = run_cli("export", "--storage", storage, "--out", str(tmp_path / "best.json"), cwd=tmp_path)
        report = run_cli("report", "--storage", storage, "--out", str(tmp_path / "report.html"), cwd=tmp_path)
    for completed in (best, export, report):
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert "Traceback" not in completed.stderr
    assert "winner: #" in best.stdout
    assert "per_device_train_batch_size" in json.loads((tmp_path / "best.json").read_text())


def test_report_on_a_full_disk_keeps_the_previous_report(searched_study, tmp_path):
    """The report is written beside the old one and renamed: a full disk leaves the old one whole."""
    from tests.support.faults import fill_file_system

    with tmpfs(tmp_path / "full", "8m") as mount:
        previous = mount / "report.html"
        first = run_cli("report", "--storage", searched_study.storage, "--out", str(previous), cwd=tmp_path)
        assert first.returncode == 0, first.stderr[-3000:]
        good = previous.read_bytes()
        fill_file_system(str(mount))
        second = run_cli("report", "--storage", searched_study.storage, "--out", str(previous), cwd=tmp_path)
        assert_one_error_line(second, "No space left on device")
        assert previous.read_bytes() == good
        assert sorted(p.name for p in mount.iterdir()) == ["filler", "report.html"]  # no temporary file left


def test_export_onto_a_full_disk_keeps_the_previous_export(searched_study, tmp_path):
    from tests.support.faults import fill_file_system

    with tmpfs(tmp_path / "full", "1m") as mount:
        previous = mount / "best_args.json"
        previous.write_text('{"previous": true}\n')
        fill_file_system(str(mount))
        completed = run_cli("export", "--storage", searched_study.storage, "--out", str(previous), cwd=tmp_path)
        assert_one_error_line(completed, "No space left on device")
        assert previous.read_text() == '{"previous": true}\n'


def test_export_to_dev_full_is_one_line(searched_study, tmp_path):
    completed = run_cli("export", "--storage", searched_study.storage, "--out", "/dev/full", cwd=tmp_path)
    assert_one_error_line(completed, "--out /dev/full: cannot write it (No space left on device)")
    assert Path("/dev/full").is_char_device()  # written in place, never replaced by a regular file


def test_report_to_standard_output(searched_study, tmp_path):
    completed = run_cli("report", "--storage", searched_study.storage, "--out", "-", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.startswith("<!DOCTYPE html>")
    assert completed.stdout.rstrip().endswith("</html>")  # the page only: no "wrote ..." line mixed in
    assert not (tmp_path / "-").exists()


def _search_on(storage: str, runs: Path, *extra: str) -> list[str]:
    return [
        "search", "--model", "bert-tiny", "--space", TINY_SPACE, "--storage", storage, "--study-name", "full",
        "--memory-ceiling", "1GiB", "--work-dir", str(runs), *FAST_SEARCH_ARGS, "--prune-ratio", "0", *extra,
    ]


def test_full_disk_at_tell_keeps_the_result_and_the_next_run_records_it(tmp_path):
    """The database's disk fills while a trial trains: its result is kept in the trial's work dir
    (on another file system) and recorded, unchanged, by the next run."""
    runs = tmp_path / "runs"
    with tmpfs(tmp_path / "db", "2m") as mount:
        storage = f"sqlite:///{mount / 'study.db'}"
        first = run_cli(
            *_search_on(storage, runs, "--trials", "1", "--callback", "tests.support.faults:FillDiskAtTrainEnd"),
            cwd=tmp_path, env={"PYTHONPATH": str(REPO), "AUTOTUNE_FAULT_FILL_DIR": str(mount)},
        )
        assert_one_error_line(first, "database or disk is full")
        pending = list(runs.glob("trial-*-*/pending_result.json"))
        assert len(pending) == 1 and str(pending[0]) in first.stderr
        kept = json.loads(pending[0].read_text())
        study = optuna.load_study(study_name="full", storage=storage)
        assert study.trials[kept["trial"]].state == TrialState.RUNNING  # not told: the disk was full

        (mount / "filler").unlink()
        second = run_cli(*_search_on(storage, runs, "--trials", "1"), cwd=tmp_path)
        assert second.returncode == 0, second.stderr[-3000:]
        assert f"trial(s) {kept['trial']} measured while the storage was full: recorded now" in second.stdout
        trial = optuna.load_study(study_name="full", storage=storage).trials[kept["trial"]]
    assert trial.state == TrialState.COMPLETE
    recorded = TrialResult.from_trial(trial)
    assert recorded is not None and recorded.samples_per_s == kept["result"]["samples_per_s"] > 0
    assert not pending[0].exists() and pending[0].with_name("recorded_result.json").exists()  # recorded once


def test_full_disk_at_ask_is_one_line(tmp_path):
    from tests.support.faults import fill_file_system

    with tmpfs(tmp_path / "db", "2m") as mount:
        storage = f"sqlite:///{mount / 'study.db'}"
        create_study(storage, "full", 1024**3)
        fill_file_system(str(mount))
        completed = run_cli(*_search_on(storage, tmp_path / "runs", "--trials", "1"), cwd=tmp_path)
    assert_one_error_line(completed, "the study storage failed (")
    assert "database or disk is full" in completed.stderr


# --- seeds ---------------------------------------------------------------------------------------


def test_a_failed_seed_is_queued_again_on_the_next_run(sqlite_url, cpu, tiny_workload):
    """A seed that only failed (here a timeout) measured nothing: resuming queues it again, once."""
    from autotune.schema import SEED_HF_DEFAULT as HF_DEFAULT
    from autotune.schema import TRIAL_SEED as SEED_ATTR
    from autotune.space import load_space
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study, tell

    request = SearchRequest(
        workload=tiny_workload(ceiling_bytes=1024**3),
        space=load_space(TINY_SPACE, cpu),
    )
    study = open_study(open_storage(sqlite_url), "seeds", request)
    seeds = {t.user_attrs[SEED_ATTR] for t in study.trials}
    for _ in seeds:  # the seeds come first: each fails the way a zero timeout made them fail
        trial = study.ask(request.space.distributions())
        tell(study, trial, TrialResult(status="timeout", error="killed after 0 s", ceiling_bytes=request.ceiling_bytes))
    default_params = next(t.params for t in study.trials if t.user_attrs.get(SEED_ATTR) == HF_DEFAULT)

    resumed = open_study(open_storage(sqlite_url), "seeds", request)
    waiting = [t for t in resumed.trials if t.state == TrialState.WAITING]
    assert {t.user_attrs[SEED_ATTR] for t in waiting} == seeds
    # A queued trial keeps its params in Optuna's "fixed_params" until it is asked for.
    assert any(t.system_attrs["fixed_params"] == default_params for t in waiting if t.user_attrs[SEED_ATTR] == HF_DEFAULT)
    again = open_study(open_storage(sqlite_url), "seeds", request)  # still queued: not queued twice
    assert len([t for t in again.trials if t.state == TrialState.WAITING]) == len(seeds)


# --- Ctrl-C --------------------------------------------------------------------------------------


def _start(args: list[str], cwd: Path, name: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        stdout=open(cwd / f"{name}.out", "w"),
        stderr=open(cwd / f"{name}.err", "w"),
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        start_new_session=True,  # its own process group: the test's SIGINT reaches it as a terminal's Ctrl-C would
        # A test run in the background inherits SIGINT ignored, and Python then keeps ignoring it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def _wait_for(condition, timeout_s: float = 300.0) -> None:  # noqa: ANN001 - a callable
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _forkserver_of(process: subprocess.Popen) -> psutil.Process | None:
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(process.pid).children():
            if "forkserver" in " ".join(child.cmdline()):
                return child
    return None


def test_ctrl_c_while_the_forkserver_imports_torch_is_one_line(tmp_path):
    """Ctrl-C to the whole process group (as a terminal sends it) while the forkserver still imports
    torch: the interrupted line, exit 130, no traceback from the forkserver.

    The signal lands within 0.05 s of the forkserver's start, seconds before its preload (torch and
    transformers, about 5 s cold) ends."""
    process = _start(_search_on(f"sqlite:///{tmp_path / 'study.db'}", tmp_path / "runs", "--trials", "1"), tmp_path, "early")
    _wait_for(lambda: _forkserver_of(process) is not None or process.poll() is not None)
    forkserver = _forkserver_of(process)
    assert forkserver is not None, (tmp_path / "early.err").read_text()
    os.killpg(process.pid, signal.SIGINT)
    process.wait(timeout=120)
    _wait_for(lambda: not forkserver.is_running() or forkserver.status() == psutil.STATUS_ZOMBIE, timeout_s=60)
    stderr = (tmp_path / "early.err").read_text()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr, stderr
    assert "interrupted:" in stderr


def test_ctrl_c_during_confirmation_exits_130_and_says_what_the_ranking_rests_on(tmp_path):
    process = _start(
        _search_on(f"sqlite:///{tmp_path / 'study.db'}", tmp_path / "runs", "--trials", "2", "--confirm-top", "2", "--confirm-repeats", "2"),
        tmp_path, "confirm",
    )
    out = tmp_path / "confirm.out"
    _wait_for(lambda: "confirming:" in out.read_text() or process.poll() is not None)
    assert process.poll() is None, (tmp_path / "confirm.err").read_text()
    os.killpg(process.pid, signal.SIGINT)
    process.wait(timeout=120)
    stdout, stderr = out.read_text(), (tmp_path / "confirm.err").read_text()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "confirmation interrupted: none of its re-runs is recorded; the ranking below rests on single search measurements" in stderr
    assert "(single measurement, not confirmed)" in stdout  # the winner line says the same
    assert "interleaved re-runs" not in stdout.split("confirming:")[1]
