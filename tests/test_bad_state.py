"""Faults that must cost nothing already measured (issue 16, groups 4 and 5): the readers of a study
(best, export, report) on a full disk or a read-only database, and a resumed study's failed seeds.
A full disk or Ctrl-C while a search runs: tests/test_bad_state_search.py.

Real file systems: a full disk is a small tmpfs filled to the last byte
(``tests.support.faults.fill_file_system``), a read-only database lives on a tmpfs remounted
read-only (``tests.support.filesystems``). Mounting needs root (CI runs as root); elsewhere those
cases are skipped with the reason. The one-line cases of bad options and files are in
tests/test_bad_input.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from optuna.trial import TrialState

from autotune.result import TrialResult
from tests.support.bad_input import TINY_SPACE, assert_one_error_line
from tests.support.cli import run_cli_in_process
from tests.support.filesystems import remount_read_only, tmpfs

# --- real file systems: full and read-only --------------------------------------------------------


@pytest.mark.slow
def test_read_only_database_serves_best_and_export(searched_study, tmp_path):
    """Only `search` writes the storage: `best`, `export` and `report` read a database on a read-only file system."""
    with tmpfs(tmp_path / "ro", "16m") as mount:
        shutil.copy(searched_study.workdir / "autotune.db", mount / "study.db")
        remount_read_only(mount)
        storage = f"sqlite:///{mount / 'study.db'}"
        best = run_cli_in_process("best", "--storage", storage, cwd=tmp_path)
        export = run_cli_in_process("export", "--storage", storage, "--out", str(tmp_path / "best.json"), cwd=tmp_path)
        report = run_cli_in_process(
            "report", "--storage", storage, "--out", str(tmp_path / "report.html"), cwd=tmp_path
        )
    for completed in (best, export, report):
        assert completed.returncode == 0, completed.stderr[-3000:]
        assert "Traceback" not in completed.stderr
    assert "winner: #" in best.stdout
    assert "per_device_train_batch_size" in json.loads((tmp_path / "best.json").read_text())


@pytest.mark.slow
def test_report_on_a_full_disk_keeps_the_previous_report(searched_study, tmp_path):
    """The report is written beside the old one and renamed: a full disk leaves the old one whole."""
    from tests.support.faults import fill_file_system

    with tmpfs(tmp_path / "full", "8m") as mount:
        previous = mount / "report.html"
        first = run_cli_in_process("report", "--storage", searched_study.storage, "--out", str(previous), cwd=tmp_path)
        assert first.returncode == 0, first.stderr[-3000:]
        good = previous.read_bytes()
        fill_file_system(str(mount))
        second = run_cli_in_process(
            "report", "--storage", searched_study.storage, "--out", str(previous), "--force", cwd=tmp_path
        )
        assert_one_error_line(second, "No space left on device")
        assert previous.read_bytes() == good
        assert sorted(p.name for p in mount.iterdir()) == ["filler", "report.html"]  # no temporary file left


@pytest.mark.slow
def test_export_onto_a_full_disk_keeps_the_previous_export(searched_study, tmp_path):
    from tests.support.faults import fill_file_system

    with tmpfs(tmp_path / "full", "1m") as mount:
        previous = mount / "best_args.json"
        previous.write_text('{"previous": true}\n')
        fill_file_system(str(mount))
        completed = run_cli_in_process(
            "export", "--storage", searched_study.storage, "--out", str(previous), "--force", cwd=tmp_path
        )
        assert_one_error_line(completed, "No space left on device")
        assert previous.read_text() == '{"previous": true}\n'


@pytest.mark.slow
def test_export_to_dev_full_is_one_line(searched_study, tmp_path):
    completed = run_cli_in_process("export", "--storage", searched_study.storage, "--out", "/dev/full", cwd=tmp_path)
    assert_one_error_line(completed, "--out /dev/full: cannot write it (No space left on device)")
    assert Path("/dev/full").is_char_device()  # written in place, never replaced by a regular file


@pytest.mark.slow
def test_report_to_standard_output(searched_study, tmp_path):
    completed = run_cli_in_process("report", "--storage", searched_study.storage, "--out", "-", cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.startswith("<!DOCTYPE html>")
    assert completed.stdout.rstrip().endswith("</html>")  # the page only: no "wrote ..." line mixed in
    assert not (tmp_path / "-").exists()


# --- seeds ---------------------------------------------------------------------------------------


def test_a_failed_seed_is_queued_again_on_the_next_run(sqlite_url, cpu, tiny_workload):
    """A seed that only failed (here a timeout) measured nothing: resuming queues it again, once."""
    from autotune.space import load_space
    from autotune.storage import open_storage
    from autotune.storage.schema import SEED_HF_DEFAULT as HF_DEFAULT
    from autotune.storage.schema import TRIAL_SEED as SEED_ATTR
    from autotune.study import SearchRequest, open_study
    from autotune.study._record import tell

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
    assert any(
        t.system_attrs["fixed_params"] == default_params for t in waiting if t.user_attrs[SEED_ATTR] == HF_DEFAULT
    )
    again = open_study(open_storage(sqlite_url), "seeds", request)  # still queued: not queued twice
    assert len([t for t in again.trials if t.state == TrialState.WAITING]) == len(seeds)
