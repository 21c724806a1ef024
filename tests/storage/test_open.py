"""Opening a study storage (autotune.storage._open): a SQLite file another process keeps locked is waited
for with one line that says so, for a bounded time, by every command; a real lock held by a real sqlite3
connection."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest

from autotune.storage import open_storage
from autotune.storage._open import SQLITE_READ_TIMEOUT_S
from tests.support.bad_input import create_study
from tests.support.cli import run_cli


@contextlib.contextmanager
def exclusive_lock(path: Path, release_after_s: float | None = None) -> Iterator[None]:
    """Another connection holds SQLite's exclusive lock on ``path`` (as an open ``sqlite3`` shell in a
    ``BEGIN EXCLUSIVE`` transaction does), until the block ends or ``release_after_s`` passed."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")
    timer = threading.Timer(release_after_s, holder.rollback) if release_after_s is not None else None
    if timer is not None:
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.join()
        holder.close()


@pytest.mark.slow
def test_a_reader_says_what_it_waits_for_and_gives_up_after_a_bounded_time(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    create_study(url, "locked", 1024**3)
    with exclusive_lock(tmp_path / "study.db"):
        started = time.monotonic()
        completed = run_cli("best", "--storage", url, cwd=tmp_path, timeout=SQLITE_READ_TIMEOUT_S + 60)
        waited_s = time.monotonic() - started
    lines = completed.stderr.splitlines()
    assert completed.returncode == 2, completed.stderr
    assert lines == [
        f"autotune: waiting for {url}: another process holds a lock on it (giving up after {SQLITE_READ_TIMEOUT_S} s)",
        f"autotune: error: --storage {url}: another process has held a lock on this database for "
        f"{SQLITE_READ_TIMEOUT_S} s (a search holds one only for moments: an open sqlite3 shell or a backup "
        "holds it longer); end it, then run the command again",
    ]
    assert waited_s < SQLITE_READ_TIMEOUT_S + 30  # bounded (not the search's two minutes, not for ever)


def test_a_search_says_it_waits_and_goes_on_once_the_lock_is_released(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    create_study(url, "locked", 1024**3)
    capsys.readouterr()
    with exclusive_lock(tmp_path / "study.db", release_after_s=3.0):
        storage = open_storage(url)  # as `autotune search` opens it: for writing
    assert [s.study_name for s in storage.get_all_studies()] == ["locked"]
    assert capsys.readouterr().err == (
        f"autotune: waiting for {url}: another process holds a lock on it (giving up after 120 s)\n"
    )


@pytest.mark.postgres
@pytest.mark.slow
def test_a_call_while_the_postgres_server_restarts_waits_for_it(postgres_server, postgres_url, capsys):
    storage = open_storage(postgres_url)
    study = optuna.create_study(storage=storage, study_name="restarting")
    capsys.readouterr()
    postgres_server.control.stop_serving()  # the pooled connection dies; a new one is refused until it is back
    back = threading.Timer(3.0, postgres_server.control.serve_again)
    back.start()
    try:
        trial = study.ask()  # without the wait: StorageInternalError (Connection refused)
    finally:
        back.join()
    assert trial.number == 0 and study.trials[0].state == optuna.trial.TrialState.RUNNING
    notice = capsys.readouterr().err.splitlines()
    assert len(notice) == 1 and notice[0].startswith("autotune: the study's database is not answering (")
    assert "Connection refused" in notice[0] and postgres_server.password not in notice[0]
