"""A Ctrl-C during a storage call is raised after the call (autotune/storage/_ctrl_c.py), on a real SQLite study.

The signal is sent from SQLAlchemy's ``after_cursor_execute`` event: right after a SELECT is executed, before
its rows are fetched, where a KeyboardInterrupt left the statement holding SQLite's read lock and the next
write of the search waited out the busy timeout ("database is locked": CI's Ctrl-C during the confirmation).
"""

from __future__ import annotations

import signal

import optuna
import pytest
import sqlalchemy.event

from autotune.storage import STOP_SIGNALS, open_storage
from autotune.storage import _open as storage_open
from autotune.study import stop_as_on_ctrl_c

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


@pytest.fixture
def searchs_handlers():
    """The search's stop handlers in this process, as ``autotune search`` installs them from a terminal; pytest's
    back after. A test run started as a background job of a non-interactive shell starts with SIGINT ignored
    (POSIX, "Shell Command Language" 2.11), and the search keeps an ignored signal ignored (``stop_as_on_ctrl_c``):
    SIGINT is set as a terminal's process has it first, as ``tests/support/processes.py`` does for a search."""
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    stop_as_on_ctrl_c()
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler)


def _study_with_trials(tmp_path, monkeypatch) -> optuna.Study:
    # The old code's write waits the busy timeout before it fails: 2 s here, not the search's 120.
    monkeypatch.setattr(storage_open, "SQLITE_BUSY_TIMEOUT_S", 2)
    study = optuna.create_study(storage=open_storage(f"sqlite:///{tmp_path / 'study.db'}"), study_name="s")
    for value in range(6):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        trial.set_user_attr("result", {"samples_per_s": float(value)})
        study.tell(trial, float(value))
    return study


def _ctrl_c_after_a_select(study: optuna.Study, signals: int) -> list[str]:
    """Send ``signals`` SIGINTs right after the next SELECT is executed; returns every statement executed
    from then on (the one the signals follow first)."""
    executed: list[str] = []
    engine = study._storage._backend.engine  # Optuna's _CachedStorage wraps the RDB storage

    @sqlalchemy.event.listens_for(engine, "after_cursor_execute")
    def ctrl_c(connection, cursor, statement, parameters, context, executemany):
        if executed or statement.lstrip().upper().startswith("SELECT"):
            executed.append(statement)
        if len(executed) == 1 and statement is executed[0]:
            for _ in range(signals):
                signal.raise_signal(signal.SIGINT)

    return executed


def test_a_ctrl_c_during_a_read_is_raised_after_it_and_the_next_write_is_not_locked_out(
    tmp_path, monkeypatch, searchs_handlers
):
    study = _study_with_trials(tmp_path, monkeypatch)
    executed = _ctrl_c_after_a_select(study, signals=1)
    with pytest.raises(KeyboardInterrupt):
        study.get_trials(deepcopy=False)
    assert len(executed) > 1, executed  # the read went on to its end: its other SELECTs ran after the signal
    assert signal.getsignal(signal.SIGINT).__name__ == "stop"  # the search's handler is back
    study.set_user_attr("written after the Ctrl-C", 1)  # the old code: "database is locked" after 2 s
    assert optuna.load_study(study_name="s", storage=study._storage).user_attrs["written after the Ctrl-C"] == 1


def test_a_second_ctrl_c_during_one_call_is_not_held(tmp_path, monkeypatch, searchs_handlers):
    """A call that waits long (a PostgreSQL server restarting) still ends at a second Ctrl-C."""
    study = _study_with_trials(tmp_path, monkeypatch)
    executed = _ctrl_c_after_a_select(study, signals=2)
    with pytest.raises(KeyboardInterrupt):
        study.get_trials(deepcopy=False)
    assert len(executed) == 1, executed  # stopped inside the call, at its first SELECT
    assert signal.getsignal(signal.SIGINT).__name__ == "stop"
