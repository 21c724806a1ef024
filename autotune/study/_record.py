"""Recording results: a trial's outcome, its memory constraint and its final state, written once.

Only the orchestrator writes to the storage; trial children only send results. The objective is
model TFLOPs (maximize); the memory constraint is ``peak - ceiling`` in GiB (:mod:`autotune.spec.ceiling`).
An OOM is a COMPLETE trial with value 0 and a violated constraint, so samplers learn the region
does not fit; crashes and timeouts are FAIL (they say nothing about the config).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from autotune.errors import AutotuneError
from autotune.result import (
    FAILED_STATUSES,
    UNKNOWN_EXCESS_GIB,
    Status,
    TrialResult,
    measured_constraint_gib,
    objective_value,
)
from autotune.storage import schema, storage_failure
from autotune.study._screening import screened_excess_gib, with_predicted_peaks

# A result the storage could not record (a full disk at tell), kept in the trial's work dir.
PENDING_RESULT_FILE = "pending_result.json"


def memory_constraint_gib(result: TrialResult) -> float:
    """``peak - ceiling`` in GiB: feasible when <= 0; always > 0 for an infeasible status.

    A screened trial's is predicted or inferred, never measured; any other's is
    :func:`autotune.result.measured_constraint_gib` (why an OOM or a diverged trial under the
    ceiling still gets a positive value is said there).
    """
    if result.status == Status.SCREENED:
        return screened_excess_gib(result) or UNKNOWN_EXCESS_GIB
    return measured_constraint_gib(result)


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> None:
    """Record a result: user attrs, the memory constraint, then the trial's final state."""
    with_predicted_peaks(result, trial.user_attrs)
    trial.set_user_attr(schema.TRIAL_RESULT, result.to_dict())
    trial.set_user_attr(schema.TRIAL_STATUS, result.status)
    if result.status in FAILED_STATUSES:
        _finish(study, trial, state=TrialState.FAIL)
        return
    study._storage.set_trial_system_attr(trial._trial_id, schema.TRIAL_CONSTRAINTS, [memory_constraint_gib(result)])
    if result.status == Status.PRUNED:
        trial.report(result.model_tflops, step=0)
        _finish(study, trial, state=TrialState.PRUNED)
        return
    _finish(study, trial, values=objective_value(result))


def _finish(
    study: optuna.Study, trial: optuna.Trial, values: float | None = None, state: TrialState | None = None
) -> None:
    """``study.tell``, with one error for a trial another worker finished meanwhile.

    Another worker fails a trial whose heartbeats it missed (a stalled host, a paused server) and queues it
    again. Optuna says so with ``UpdateFinishedTrialError`` where a write finds the trial finished, but with a
    ``ValueError`` ("Cannot tell a FAIL trial", optuna/study/_tell.py) where ``tell`` reads it finished first,
    which ended a search with a traceback; both become the former, which the callers handle (the queued copy
    is measured, this result dropped: ``study._loop.run_one_trial``, :func:`record_pending_results`).
    """
    try:
        study.tell(trial, values, state=state)
    except ValueError:
        if not study._storage.get_trial(trial._trial_id).state.is_finished():
            raise
        raise optuna.exceptions.UpdateFinishedTrialError(
            f"trial #{trial.number} was finished by another worker"
        ) from None


def record_interrupted(study: optuna.Study, trial: optuna.Trial, ceiling_bytes: int) -> TrialResult:
    """Record a trial stopped by Ctrl-C (or a stop signal, a stop of the search, a trial process that
    could not be started) as FAIL ``interrupted``, and queue its config to run again, first thing on resume:
    however often it was stopped before, as each stop is the user's and measured nothing of the config (a
    trial whose orchestrator died is queued once, ``_liveness.recover_orphans``: that death may be the
    trial's own doing).

    Safe wherever the interrupt landed: a trial told before it keeps its result.
    """
    stored = study._storage.get_trial(trial._trial_id)
    if stored.state != TrialState.RUNNING:
        return TrialResult.from_trial(stored) or TrialResult(status=Status.INTERRUPTED)
    result = TrialResult(
        status=Status.INTERRUPTED,
        error="the search was stopped (Ctrl-C, a signal, or its process could not start) while this trial ran; it runs again on resume",
        ceiling_bytes=ceiling_bytes,
    )
    try:
        tell(study, trial, result)
    except optuna.exceptions.UpdateFinishedTrialError:
        return result  # another worker declared it dead and queued it already
    RetryHeartbeatStaleTrialCallback(max_retry=None)(study, study._storage.get_trial(trial._trial_id))
    return result


def trial_work_dir(work_root: str, trial_label: int | str) -> str:
    """The directory of one trial run by this process (Trainer output_dir, child log, pending result)."""
    return str(Path(work_root).resolve() / f"trial-{trial_label}-{os.getpid()}")


def tell_or_keep(study: optuna.Study, trial: optuna.Trial, result: TrialResult, work_root: str) -> None:
    """:func:`tell`; if the storage fails, keep the result in the trial's work dir for the next run.

    The trial stays RUNNING in the storage; :func:`record_pending_results` tells it on the next run,
    before orphan recovery would fail and re-queue it, so the measurement is not lost.

    Raises:
        AutotuneError: The storage failed; the message says where the result is kept.
    """
    try:
        tell(study, trial, result)
    except optuna.exceptions.StorageInternalError as exc:
        reason = storage_failure(exc)
        path = Path(trial_work_dir(work_root, trial.number)) / PENDING_RESULT_FILE
        kept = {
            "study": study.study_name,
            "trial": trial.number,
            "params": trial.params,
            "distributions": {name: distribution_to_json(d) for name, d in trial.distributions.items()},
            "user_attrs": {
                k: v for k, v in trial.user_attrs.items() if k not in (schema.TRIAL_RESULT, schema.TRIAL_STATUS)
            },
            "result": result.to_dict(),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(kept))
        except OSError as write_error:
            raise AutotuneError(
                f"the study storage could not record trial #{trial.number} ({reason}), nor could {path} "
                f"({write_error.strerror}): its {result.status} result is lost; free space and run the same command again"
            ) from None
        raise AutotuneError(
            f"the study storage could not record trial #{trial.number} ({reason}); its {result.status} result is kept "
            f"in {path} and is recorded when you run the same command again, once the storage works (room "
            "freed, the database back; a new database gets it as a trial of its own)"
        ) from None


def record_pending_results(study: optuna.Study, work_root: str) -> list[int]:
    """Tell the results that :func:`tell_or_keep` kept because the storage failed; call before orphan recovery.

    A kept result is recorded onto its own trial where that is still RUNNING with the same config
    (the storage came back: room freed, the server up again); otherwise, as a new trial of its config
    (the trial is gone: a deleted SQLite file made anew, or another worker failed and queued it again,
    whose copy is then answered from this record instead of measured again), unless that config was
    measured since. The file is then renamed, so that it is not recorded twice. Files of another study
    in the same work root are left alone.

    Returns:
        Numbers of the trials recorded here.
    """
    recorded = []
    by_number = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    for path in sorted(Path(work_root).glob(f"trial-*-*/{PENDING_RESULT_FILE}")):
        try:
            kept = json.loads(path.read_text())
            result = TrialResult.from_dict(kept["result"])
            own = by_number.get(kept["trial"])
            params = kept.get("params")  # None: kept by an older autotune, which kept only the number
            if kept.get("study", study.study_name) != study.study_name:
                continue
            if own is not None and params in (None, own.params):
                trial_id = own._trial_id
            elif params is None or _measured(study, params):
                continue  # no config to record it as, or its config was measured again since
            else:
                trial_id = _new_trial_of(study, kept)
        except (OSError, ValueError, KeyError, TypeError):
            continue  # unreadable
        try:
            tell(study, optuna.Trial(study, trial_id), result)
            recorded.append(study._storage.get_trial(trial_id).number)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker failed its trial meanwhile and queued the config: that copy is measured
        path.rename(path.with_name("recorded_result.json"))
    return recorded


def _measured(study: optuna.Study, params: dict) -> bool:
    finished = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    return any(t.params == params and schema.TRIAL_RESULT in t.user_attrs for t in finished)


def _new_trial_of(study: optuna.Study, kept: dict) -> int:
    """A RUNNING trial of the kept config (its params, their distributions, its user attrs), to tell."""
    template = optuna.trial.create_trial(
        state=TrialState.RUNNING,
        params=kept["params"],
        distributions={name: json_to_distribution(d) for name, d in kept["distributions"].items()},
        user_attrs=kept.get("user_attrs") or {},
    )
    return study._storage.create_new_trial(study._study_id, template_trial=template)
