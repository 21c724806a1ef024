"""`autotune search` processes that share one study in a real PostgreSQL server, each standing for a
machine (tests/study/test_postgres.py, tests/study/test_postgres_killed_worker.py), and which
process ran each trial (``runs_by_trial``, also read by tests/study/test_loop.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna

from tests.support.cli import FAST_SEARCH_ARGS, REPO

TINY_SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")
STUDY = "shared"
# Short heartbeats, so a dead worker's trial is recovered within seconds instead of a minute.
FAST_HEARTBEATS = {"AUTOTUNE_HEARTBEAT_INTERVAL_S": "1", "AUTOTUNE_HEARTBEAT_GRACE_S": "3"}


def search_command(storage: str, runs: Path, *extra: str) -> list[str]:
    """A worker's `python -m autotune search` command line."""
    return [sys.executable, "-m", "autotune", *search_args(storage, runs, *extra)]


def search_args(storage: str, runs: Path, *extra: str) -> list[str]:
    """The arguments after `autotune` (``run_cli_in_process`` takes them as they are)."""
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
        STUDY,
        "--work-dir",
        str(runs),
        *FAST_SEARCH_ARGS,
        *extra,
    ]


def start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # PYTHONPATH: a worker's --callback names a class of tests/support (the interpreter starts in cwd).
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **FAST_HEARTBEATS},
    )


def study_trials(storage: optuna.storages.RDBStorage) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=STUDY, storage=storage).get_trials()


def runs_by_trial(runs: Path) -> dict[int, list[int]]:
    """Trial number -> the orchestrator PIDs that started a child for it (``trial-<n>-<pid>``)."""
    found: dict[int, list[int]] = {}
    for path in runs.glob("trial-*-*"):
        number, pid = path.name.split("-")[1:]
        found.setdefault(int(number), []).append(int(pid))
    return found
