"""Opening a study storage (autotune.storage._open): a SQLite file another process keeps locked is waited
for with one line that says so, for a bounded time, by every command; a real lock held by a real sqlite3
connection. A file that is not a whole SQLite database is one line for every command that opens one, and
SQLite's own URI form (read-only) is read."""

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
from autotune.storage._open import SQLITE_READ_TIMEOUT_S, sqlite_file, sqlite_read_timeout_s
from tests.support.bad_input import TINY_SPACE, assert_one_error_line, create_study
from tests.support.cli import run_cli_in_process


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


# A reader's wait shortened through AUTOTUNE_SQLITE_READ_TIMEOUT_S (the default, SQLITE_READ_TIMEOUT_S, is
# 15 s): the test waits all of it.
READ_TIMEOUT_S = 3


@pytest.mark.slow
def test_a_reader_says_what_it_waits_for_and_gives_up_after_a_bounded_time(tmp_path):
    url = f"sqlite:///{tmp_path / 'study.db'}"
    create_study(url, "locked", 1024**3)
    with exclusive_lock(tmp_path / "study.db"):
        started = time.monotonic()
        # The reader's entry point in this process (its lock wait is SQLite's, whichever process holds the
        # lock: the search below waits on the same holder here): no interpreter start before the wait.
        completed = run_cli_in_process(
            "best", "--storage", url, cwd=tmp_path, env={"AUTOTUNE_SQLITE_READ_TIMEOUT_S": str(READ_TIMEOUT_S)}
        )
        waited_s = time.monotonic() - started
    lines = completed.stderr.splitlines()
    assert completed.returncode == 2, completed.stderr
    assert lines == [
        f"autotune: waiting for {url}: another process holds a lock on it (giving up after {READ_TIMEOUT_S} s)",
        f"autotune: error: --storage {url}: another process has held a lock on this database for "
        f"{READ_TIMEOUT_S} s (a search holds one only for moments: an open sqlite3 shell or a backup "
        "holds it longer); end it, then run the command again",
    ]
    assert waited_s < READ_TIMEOUT_S + 30  # bounded (not the search's two minutes, not for ever)


def test_a_readers_wait_is_15_s_unless_the_environment_says_otherwise(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTOTUNE_SQLITE_READ_TIMEOUT_S", raising=False)
    assert sqlite_read_timeout_s() == SQLITE_READ_TIMEOUT_S == 15
    monkeypatch.setenv("AUTOTUNE_SQLITE_READ_TIMEOUT_S", "40")
    assert sqlite_read_timeout_s() == 40
    url = f"sqlite:///{tmp_path / 'study.db'}"
    create_study(url, "study", 1024**3)
    completed = run_cli_in_process(
        "best", "--storage", url, cwd=tmp_path, env={"AUTOTUNE_SQLITE_READ_TIMEOUT_S": "soon"}
    )
    assert_one_error_line(completed, "AUTOTUNE_SQLITE_READ_TIMEOUT_S='soon': give a whole number of seconds above 0")


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


# --- a file that is not a whole SQLite database ------------------------------------------------------------


def _random_bytes(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 64)


def _cut_at_a_page(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: 2 * 4096])  # a copy interrupted, a disk that filled while copying


def _cut_inside_its_last_page(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-300])  # SQLite itself reads this one: zeros for the missing bytes


DAMAGES = {
    "random bytes": (_random_bytes, "(file is not a database)"),
    "cut at a page": (_cut_at_a_page, "(database disk image is malformed)"),
    "cut inside its last page": (_cut_inside_its_last_page, "(truncated: "),
}
STORAGE_COMMANDS = {
    "search": ["search", "--model", "bert-tiny", "--space", TINY_SPACE, "--seq-len", "32", "--trials", "1"],
    "best": ["best"],
    "export": ["export", "--out", "best.json"],
    "report": ["report", "--out", "report.html"],
    "dashboard": ["dashboard", "--port", "0"],
    "estimate": ["estimate", "--model", "bert-tiny", "--space", TINY_SPACE, "--seq-len", "32"],
}


@pytest.mark.parametrize("damage", DAMAGES)
@pytest.mark.parametrize("command", STORAGE_COMMANDS)
def test_a_damaged_study_file_is_one_line_for_every_command_that_opens_it(tmp_path, command, damage):
    path = tmp_path / "study.db"
    create_study(f"sqlite:///{path}", "damaged", 1024**3)
    spoil, reason = DAMAGES[damage]
    spoil(path)
    damaged = path.read_bytes()
    completed = run_cli_in_process(*STORAGE_COMMANDS[command], "--storage", f"sqlite:///{path}", cwd=tmp_path)
    assert_one_error_line(completed, f"{path} is not a readable study database {reason}")
    assert path.read_bytes() == damaged  # left as it was, for the user to restore or inspect
    assert not list(tmp_path.glob("best.json")) + list(tmp_path.glob("report.html"))


@pytest.mark.parametrize(
    ("url", "file"),
    [
        ("sqlite:///study.db", "study.db"),
        ("sqlite:////data/study.db?timeout=5", "/data/study.db"),
        ("sqlite:///file:/data/study.db?mode=ro&uri=true", "/data/study.db"),
        ("sqlite:///file:///data/my%20study.db?uri=1&mode=ro", "/data/my study.db"),
        ("sqlite:///file:study.db?mode=ro&uri=true", "study.db"),
        ("sqlite:///file:study.db?mode=ro", "file:study.db"),  # no uri=true: SQLite takes the name as it is
        ("sqlite:///file:shared?mode=memory&cache=shared&uri=true", ":memory:"),
    ],
)
def test_the_file_of_a_sqlite_url_is_the_one_sqlite_opens(url, file):
    assert sqlite_file(url) == file


@pytest.mark.parametrize("form", ["file:{path}", "file://{path}", "file:study.db"])
def test_sqlites_read_only_uri_is_read(tmp_path, form):
    """``sqlite:///file:PATH?mode=ro&uri=true`` (SQLite's read-only open, through SQLAlchemy) reads the study."""
    path = tmp_path / "study.db"
    create_study(f"sqlite:///{path}", "read-only", 1024**3)
    before = path.read_bytes()
    storage = f"sqlite:///{form.format(path=path)}?mode=ro&uri=true"
    completed = run_cli_in_process("best", "--all", "--storage", storage, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert "All trials of read-only" in completed.stdout
    assert path.read_bytes() == before
    missing = run_cli_in_process("best", "--storage", storage.replace("study.db", "other.db"), cwd=tmp_path)
    assert_one_error_line(missing, "no such database file")
    assert not (tmp_path / "other.db").exists()


def test_reading_a_database_of_no_study_says_to_search_first_and_of_several_to_name_one(tmp_path):
    from autotune.errors import AutotuneError
    from autotune.storage import load_study

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    storage = open_storage(url)
    with pytest.raises(AutotuneError, match="holds no study: run autotune search with this --storage first"):
        load_study(url, None)
    for name in ("a", "b"):
        optuna.create_study(storage=storage, study_name=name)
    with pytest.raises(AutotuneError, match=r"holds 2 studies \(a, b\); name one with --study-name"):
        load_study(url, None)
