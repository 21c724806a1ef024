"""Recording results (autotune.study._record): what a trial's outcome becomes in a real Optuna storage,
and a result the storage could not take kept in the work dir until the next run records it."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.errors import AutotuneError
from autotune.result import TrialResult
from autotune.storage import schema
from autotune.study._record import (
    PENDING_RESULT_FILE,
    UNKNOWN_EXCESS_GIB,
    memory_constraint_gib,
    record_pending_results,
    tell,
    tell_or_keep,
    trial_work_dir,
)

GiB = 1024**3
DISTRIBUTIONS = {"micro_batch": optuna.distributions.CategoricalDistribution([8, 16])}


def measured(status: str, peak_gib: float, ceiling_gib: float = 2.0, tflops: float = 0.5) -> TrialResult:
    return TrialResult(
        status=status,
        samples_per_s=100.0,
        model_tflops=tflops,
        peak_memory_bytes=int(peak_gib * GiB),
        ceiling_bytes=int(ceiling_gib * GiB),
    )


@pytest.fixture
def storage(tmp_path) -> optuna.storages.RDBStorage:
    """A real SQLite storage that gives up on a locked database after 0.2 s (autotune's waits 120 s)."""
    return optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path / 'study.db'}", engine_kwargs={"connect_args": {"timeout": 0.2}}
    )


def reloaded(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials as the database holds them (not Optuna's in-process cache)."""
    return optuna.load_study(study_name=study.study_name, storage=study._storage._backend.url).trials


@contextlib.contextmanager
def locked(database: Path) -> Iterator[None]:
    """Another connection holds the database's write lock, as a busy writer elsewhere would."""
    connection = sqlite3.connect(database, isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        connection.execute("ROLLBACK")
        connection.close()


def test_memory_constraint_gib_is_peak_minus_ceiling_and_positive_for_every_infeasible_status():
    assert memory_constraint_gib(measured("ok", 1.5)) == pytest.approx(-0.5)
    assert memory_constraint_gib(measured("over_ceiling", 2.75)) == pytest.approx(0.75)
    assert memory_constraint_gib(measured("oom", 3.0)) == pytest.approx(1.0)
    # An OOM with no peak, or one seen under the ceiling, still did not fit: "over by at least" 1 GiB.
    assert memory_constraint_gib(measured("oom", 0.0)) == UNKNOWN_EXCESS_GIB
    assert memory_constraint_gib(measured("oom", 1.0)) == UNKNOWN_EXCESS_GIB
    assert memory_constraint_gib(measured("diverged", 1.0)) == UNKNOWN_EXCESS_GIB  # fits, but does not train


@pytest.mark.parametrize(
    ("result", "state", "value", "constraint"),
    [
        (measured("ok", 1.5), TrialState.COMPLETE, 0.5, -0.5),
        (measured("oom", 0.0), TrialState.COMPLETE, 0.0, UNKNOWN_EXCESS_GIB),  # the sampler learns it does not fit
        (measured("over_ceiling", 2.5), TrialState.COMPLETE, 0.0, 0.5),
        (measured("pruned", 1.0, tflops=0.1), TrialState.PRUNED, 0.1, -1.0),  # Optuna keeps the last reported value
        (TrialResult(status="crash", error="exit -11"), TrialState.FAIL, None, None),  # says nothing about the config
        (TrialResult(status="timeout", error="killed after 900 s"), TrialState.FAIL, None, None),
    ],
    ids=["ok", "oom", "over_ceiling", "pruned", "crash", "timeout"],
)
def test_tell_records_the_result_the_constraint_and_the_state(storage, result, state, value, constraint):
    study = optuna.create_study(storage=storage, direction="maximize")
    tell(study, study.ask(DISTRIBUTIONS), result)
    [trial] = reloaded(study)
    assert trial.state == state and trial.value == value
    assert trial.user_attrs[schema.TRIAL_STATUS] == result.status
    assert TrialResult.from_trial(trial) == result
    if constraint is None:
        assert schema.TRIAL_CONSTRAINTS not in trial.system_attrs
    else:
        assert trial.system_attrs[schema.TRIAL_CONSTRAINTS] == [pytest.approx(constraint)]
    if state == TrialState.PRUNED:
        assert trial.intermediate_values == {0: 0.1}  # reported at step 0: what it reached before it was stopped


def test_tell_or_keep_keeps_a_result_the_storage_refused_and_record_pending_results_tells_it_once(storage, tmp_path):
    study = optuna.create_study(storage=storage, direction="maximize")
    tell(study, study.ask(DISTRIBUTIONS), measured("ok", 1.0))  # an earlier trial, recorded
    trial = study.ask(DISTRIBUTIONS)
    result = measured("ok", 1.5, tflops=0.75)
    work_root = str(tmp_path / "runs")
    with locked(tmp_path / "study.db"), pytest.raises(AutotuneError) as refused:
        tell_or_keep(study, trial, result, work_root)
    kept = Path(trial_work_dir(work_root, trial.number)) / PENDING_RESULT_FILE
    assert str(refused.value) == (
        f"the study storage could not record trial #1 (database is locked); its ok result is kept in {kept} "
        "and is recorded when you run the same command again, once the storage works (room freed, the database "
        "back; a new database gets it as a trial of its own)"
    )
    assert json.loads(kept.read_text()) == {
        "study": study.study_name,
        "trial": 1,
        "params": trial.params,
        "distributions": {"micro_batch": optuna.distributions.distribution_to_json(DISTRIBUTIONS["micro_batch"])},
        "user_attrs": {},
        "result": result.to_dict(),
    }
    assert reloaded(study)[1].state == TrialState.RUNNING  # not told

    assert record_pending_results(study, work_root) == [1]
    recorded = reloaded(study)[1]
    assert recorded.state == TrialState.COMPLETE and recorded.value == 0.75
    assert TrialResult.from_trial(recorded) == result
    assert not kept.exists() and kept.with_name("recorded_result.json").exists()
    assert record_pending_results(study, work_root) == []  # recorded once


def test_tell_or_keep_says_the_result_is_lost_when_the_work_dir_cannot_be_written_either(storage, tmp_path):
    study = optuna.create_study(storage=storage, direction="maximize")
    trial = study.ask(DISTRIBUTIONS)
    not_a_directory = tmp_path / "runs"
    not_a_directory.write_text("a file where the work dir should be")
    with locked(tmp_path / "study.db"), pytest.raises(AutotuneError) as refused:
        tell_or_keep(study, trial, TrialResult(status="oom", ceiling_bytes=GiB), str(not_a_directory))
    message = str(refused.value)
    assert message.startswith("the study storage could not record trial #0 (database is locked), nor could ")
    assert message.endswith("(Not a directory): its oom result is lost; free space and run the same command again")


def _kept(study: optuna.Study, number: int, micro_batch: int, result: TrialResult, study_name: str = "") -> str:
    distribution = optuna.distributions.distribution_to_json(DISTRIBUTIONS["micro_batch"])
    return json.dumps(
        {
            "study": study_name or study.study_name,
            "trial": number,
            "params": {"micro_batch": micro_batch},
            "distributions": {"micro_batch": distribution},
            "result": result.to_dict(),
        }
    )


def test_record_pending_results_records_a_kept_result_once_and_never_over_another_measurement(storage, tmp_path):
    study = optuna.create_study(storage=storage, direction="maximize")
    study.enqueue_trial({"micro_batch": 8})
    finished = study.ask(DISTRIBUTIONS)
    tell(study, finished, measured("ok", 1.0, tflops=0.25))
    running = study.ask(DISTRIBUTIONS)
    work_root = tmp_path / "runs"
    for label, content in (
        ("3", _kept(study, 3, 8, measured("ok", 1.0, tflops=9.0))),  # its config (micro_batch 8) measured since
        (running.number, "{truncated by a full disk"),
        ("5", _kept(study, 5, 16, measured("ok", 1.0), study_name="another-study")),  # the same work root
        ("6", json.dumps({"trial": 6, "result": measured("ok", 1.0).to_dict()})),  # an older autotune's: no config
        ("7", _kept(study, 7, 16, measured("ok", 1.0, tflops=0.5))),  # a trial this study no longer has
    ):
        path = Path(trial_work_dir(str(work_root), label)) / PENDING_RESULT_FILE
        path.parent.mkdir(parents=True)
        path.write_text(content)
    (new,) = record_pending_results(study, str(work_root))
    trials = reloaded(study)
    assert trials[finished.number].value == 0.25 and len(trials) == 3  # nothing recorded over it or twice
    assert trials[running.number].state == TrialState.RUNNING  # left for orphan recovery
    assert trials[new].params == {"micro_batch": 16} and trials[new].value == 0.5  # trial 7's, as a trial of its own
    assert sorted(p.parent.name.split("-")[1] for p in work_root.glob(f"*/{PENDING_RESULT_FILE}")) == [
        "1",
        "3",
        "5",
        "6",
    ]


def _failed_by_another_worker(url: str, study_name: str, trial_id: int) -> None:
    """What another worker's heartbeat check does to a trial it found silent: fail it, queue a copy."""
    other = optuna.load_study(study_name=study_name, storage=url)
    other._storage.set_trial_state_values(trial_id, TrialState.FAIL)
    optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=1)(other, other._storage.get_trial(trial_id))


def _losing_the_trial_between_its_writes(study: optuna.Study, url: str, trial_id: int) -> None:
    """Another worker fails the trial right after this worker's last write before ``tell``."""
    write = study._storage.set_trial_system_attr

    def write_then_lose_the_trial(written_id: int, key: str, value: object) -> None:
        write(written_id, key, value)
        if key == schema.TRIAL_CONSTRAINTS and written_id == trial_id:
            _failed_by_another_worker(url, study.study_name, trial_id)

    study._storage.set_trial_system_attr = write_then_lose_the_trial  # type: ignore[method-assign]


@pytest.mark.parametrize("when", ["before the tell", "between its writes"])
def test_a_trial_another_worker_failed_meanwhile_is_said_one_way_and_left_to_its_queued_copy(storage, tmp_path, when):
    """A paused server or a stalled host makes another worker take this one for dead: it fails the running
    trial and queues its config again. Optuna says "finished" two ways: a write that finds the trial finished
    (``UpdateFinishedTrialError``), and ``tell`` reading it finished after this worker's writes (``ValueError:
    Cannot tell a FAIL trial``, which ended a search with a traceback). Both are the first, which the loop
    handles: the queued copy is measured, this result is not told twice."""
    study = optuna.create_study(storage=storage, direction="maximize")
    trial = study.ask(DISTRIBUTIONS)
    if when == "before the tell":
        _failed_by_another_worker(str(storage.url), study.study_name, trial._trial_id)
    else:
        _losing_the_trial_between_its_writes(study, str(storage.url), trial._trial_id)

    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        tell_or_keep(study, trial, measured("ok", 1.5, tflops=0.75), str(tmp_path / "runs"))

    failed, queued = reloaded(study)
    assert (failed.state, queued.state, queued.params) == (TrialState.FAIL, TrialState.WAITING, trial.params)


def test_a_kept_result_whose_trial_another_worker_fails_while_it_is_told_is_left_to_the_queued_copy(storage, tmp_path):
    """The next run tells a kept result onto its own trial, still RUNNING; another worker's heartbeat check
    fails that trial in the middle of the tell. The start goes on (no traceback), the copy is queued, the
    kept file is not told again."""
    study = optuna.create_study(storage=storage, direction="maximize")
    trial = study.ask(DISTRIBUTIONS)
    work_root = str(tmp_path / "runs")
    with locked(tmp_path / "study.db"), pytest.raises(AutotuneError):
        tell_or_keep(study, trial, measured("ok", 1.5, tflops=0.75), work_root)  # kept, the trial left RUNNING
    _losing_the_trial_between_its_writes(study, str(storage.url), trial._trial_id)

    assert record_pending_results(study, work_root) == []
    failed, queued = reloaded(study)
    assert (failed.state, queued.state, queued.params) == (TrialState.FAIL, TrialState.WAITING, trial.params)
    assert not list(Path(work_root).glob(f"*/{PENDING_RESULT_FILE}"))  # not told again on the next run
