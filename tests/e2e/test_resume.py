"""A killed or interrupted `autotune search`, then resumed: nothing lost, nothing left RUNNING.

Real `autotune search` subprocesses on a real SQLite study. A fault from tests/support/faults.py stalls a
trial child so the test knows a trial is mid-flight, then the test kills the orchestrator with
SIGKILL (no cleanup at all) or interrupts it with SIGINT (Ctrl-C).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.result import TrialResult
from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli_in_process
from tests.support.processes import sigint_as_from_a_terminal, wait_until_gone

pytestmark = pytest.mark.slow

STUDY = "resume"


def search_command(tmp_path: Path, fault: str, trials: int) -> list[str]:
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch: [8, 16]\n")
    return [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        "bert-tiny",
        *FAST_SEARCH_ARGS,
        "--space",
        str(space),
        "--storage",
        f"sqlite:///{tmp_path / 'study.db'}",
        "--study-name",
        STUDY,
        "--work-dir",
        str(tmp_path / "runs"),
        "--trials",
        str(trials),
        "--callback",
        f"tests.support.faults:{fault}",
        # Resuming is what is tested: no early stop, so every re-run is measured to the end under any load.
        "--prune-ratio",
        "0",
    ]


def seed_study(tmp_path: Path, micro_batches: list[int]) -> None:
    """Queue the configs in order, so each run's trials are known in advance (no sampler luck)."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name=STUDY, direction="maximize")
    for micro_batch in micro_batches:
        study.enqueue_trial({"micro_batch": micro_batch})


def start(command: list[str], tmp_path: Path, name: str) -> subprocess.Popen:
    # Output to files: the live table writes more than a pipe holds, and nobody reads a pipe here.
    return subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=open(tmp_path / f"{name}.out", "w"),
        stderr=open(tmp_path / f"{name}.err", "w"),
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
        preexec_fn=sigint_as_from_a_terminal,
    )


def wait_for_stall(process: subprocess.Popen, tmp_path: Path, name: str, timeout_s: float = 300) -> int:
    """The PID of the stalled trial child, once it has written it."""
    pid_file = tmp_path / "runs" / "stalled.pid"
    deadline = time.monotonic() + timeout_s
    while not (pid_file.exists() and pid_file.read_text()):
        if process.poll() is not None:
            pytest.fail(
                f"search exited ({process.returncode}) before a trial stalled: {(tmp_path / f'{name}.err').read_text()}"
            )
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail("no trial stalled in time")
        time.sleep(0.2)
    return int(pid_file.read_text())


def load(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name=STUDY, storage=f"sqlite:///{tmp_path / 'study.db'}")


def snapshot(trial: optuna.trial.FrozenTrial) -> tuple:
    return (trial.number, trial.state, trial.params, trial.values, trial.user_attrs, trial.datetime_complete)


def test_sigkill_mid_trial_then_rerun_keeps_completed_trials_and_reruns_the_killed_one(tmp_path):
    seed_study(tmp_path, [8, 16])
    # Enough trials for the rerun to drain the queue: the study's own seed trials (queued when the
    # first run created it) come before the killed trial's re-run.
    command = search_command(tmp_path, "StallSecondTrial", trials=4)

    first = start(command, tmp_path, "first")
    stalled_pid = wait_for_stall(first, tmp_path, "first")
    first.send_signal(signal.SIGKILL)  # the orchestrator dies with no chance to clean up
    first.wait(timeout=30)
    assert wait_until_gone(stalled_pid), "the trial child outlived its orchestrator"

    after_kill = load(tmp_path).get_trials()
    completed_before = [snapshot(t) for t in after_kill if t.state == TrialState.COMPLETE]
    assert [t[2]["micro_batch"] for t in completed_before] == [8]
    killed = [t for t in after_kill if t.state == TrialState.RUNNING]
    assert [t.params["micro_batch"] for t in killed] == [16]

    # The same command again. What is under test is what the SIGKILLed process left in the study: the rerun
    # needs no process of its own (no signal, no environment its trials must see), so it is the entry point
    # in this process (tests/support/cli.py: no second interpreter start, nor a second forkserver's preload).
    second = run_cli_in_process(*command[3:], cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "queued again" in second.stdout

    study = load(tmp_path)
    trials = study.get_trials()
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    # Every trial completed before the kill is intact, field for field.
    assert [snapshot(study.trials[t[0]]) for t in completed_before] == completed_before
    # The killed trial is recorded as interrupted, and its config ran again to completion (or,
    # if a queued seed trial measured the same config first, its re-run reused that measurement).
    killed_trial = study.trials[killed[0].number]
    assert killed_trial.state == TrialState.FAIL
    assert TrialResult.from_trial(killed_trial).status == "interrupted"
    reruns = [t for t in trials if t.system_attrs.get("failed_trial") == killed_trial.number]
    assert len(reruns) == 1
    assert reruns[0].state == TrialState.COMPLETE and reruns[0].params["micro_batch"] == 16
    assert TrialResult.from_trial(reruns[0]).status == "ok"
    # No config was measured twice: repeats of a measured config are marked as reused copies.
    measured = [
        tuple(sorted(t.params.items()))
        for t in trials
        if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs
    ]
    assert len(measured) == len(set(measured)) == 2


def test_ctrl_c_records_the_running_trial_as_interrupted_and_says_how_to_resume(tmp_path):
    process = start(search_command(tmp_path, "StallFirstTrial", trials=2), tmp_path, "run")
    stalled_pid = wait_for_stall(process, tmp_path, "run")
    process.send_signal(signal.SIGINT)  # what Ctrl-C in the terminal delivers to the orchestrator
    assert process.wait(timeout=60) == 130
    assert wait_until_gone(stalled_pid), "the trial child survived Ctrl-C"

    stderr = (tmp_path / "run.err").read_text()
    assert "Traceback" not in stderr
    assert "recorded as interrupted" in stderr
    assert f"study '{STUDY}': " in stderr and "1 interrupted" in stderr  # where the study stands
    assert "To resume, run the same command again." in stderr

    trials = load(tmp_path).get_trials()
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    assert trials[0].state == TrialState.FAIL
    interrupted = TrialResult.from_trial(trials[0])
    assert interrupted.status == "interrupted" and "Ctrl-C" in interrupted.error
    queued = [t for t in trials if t.system_attrs.get("failed_trial") == 0]  # the resume runs it again
    assert [(t.state, t.params) for t in queued] == [(TrialState.WAITING, trials[0].params)]

    # The study's reader in this process: the search above is the real process the test is about.
    listing = run_cli_in_process(
        "best", "--all", "--storage", f"sqlite:///{tmp_path / 'study.db'}", "--study-name", STUDY, cwd=tmp_path
    )
    assert listing.returncode == 0
    row = next(line for line in listing.stdout.splitlines() if line.lstrip("│ ").startswith("0 "))
    assert "interrupted" in row and "Ctrl-C" in row
