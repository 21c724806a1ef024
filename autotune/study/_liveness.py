"""Liveness: which worker runs a trial, its heartbeats, and recovery of trials whose worker died.

A worker marks each trial it asks for with its identity (host, PID namespace, PID, start time) and
records Optuna heartbeats while the child runs. Before every ask, any worker fails the trials of dead
workers (:func:`recover_orphans`) and Optuna's ``RetryHeartbeatStaleTrialCallback`` queues each once
more as a WAITING trial, which the next ``study.ask`` of any worker pops and runs. A stopped search
records what it still holds as interrupted (:func:`interrupt_own_running`).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import Any

import optuna
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import FrozenTrial, TrialState

from autotune.result import Status, TrialResult
from autotune.storage import STOP_SIGNALS, schema
from autotune.study._record import record_interrupted


def mark_owner(study: optuna.Study, trial: optuna.Trial) -> None:
    """Mark ``trial`` as this worker's and record its first heartbeat at once.

    A trial with no heartbeat is never found stale, so the trial of a worker that died right after
    asking would otherwise stay RUNNING for ever.
    """
    Heartbeat(study, trial).beat()
    study._storage.set_trial_system_attr(
        trial._trial_id, schema.TRIAL_OWNER, {**worker_identity(), "trial": trial.number}
    )


def recover_orphans(study: optuna.Study) -> list[int]:
    """Fail RUNNING trials whose orchestrator is gone, and queue each again (once).

    Called at start and before every ask, so a live worker picks up what a dead one left. Trials of
    a live orchestrator are left alone; so are trials of other hosts or PID namespaces (containers),
    whose processes cannot be seen from here: Optuna's heartbeat check (``fail_stale_trials``) fails
    those once silent for the grace period, and retries them the same way.

    Returns:
        Numbers of the trials failed here.
    """
    optuna.storages.fail_stale_trials(study)
    retry = RetryHeartbeatStaleTrialCallback(max_retry=1)
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.system_attrs.get(schema.TRIAL_OWNER)
        if not owner or not _owner_is_dead(owner, trial.number):
            continue
        result = TrialResult(status=Status.INTERRUPTED, error="the orchestrator died while this trial ran; re-queued")
        try:
            study._storage.set_trial_user_attr(trial._trial_id, schema.TRIAL_RESULT, result.to_dict())
            if not study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL):
                continue
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another orchestrator got there first
        retry(study, study._storage.get_trial(trial._trial_id))
        recovered.append(trial.number)
    return recovered


def worker_identity() -> dict[str, Any]:
    """Who runs a trial: host, PID namespace, PID and its start time (PIDs are reused)."""
    import psutil

    return {
        "host": socket.gethostname(),
        "pid_ns": _pid_namespace(),
        "pid": os.getpid(),
        "started": psutil.Process().create_time(),
    }


def run_by_this_process(trial: FrozenTrial) -> bool:
    """Whether this process ran (or runs) ``trial``: its owner is this host, PID and start time."""
    owner = trial.system_attrs.get(schema.TRIAL_OWNER) or {}
    me = worker_identity()
    return (owner.get("host"), owner.get("pid"), owner.get("started")) == (me["host"], me["pid"], me["started"])


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def _owner_is_dead(owner: dict[str, Any], trial_number: int) -> bool:
    """True only when the owner provably ran here and its process is gone."""
    if owner.get("trial", trial_number) != trial_number:
        return False  # a re-queued copy still carries its dead original's owner until it is claimed
    if owner.get("host") != socket.gethostname():
        return False
    if owner.get("pid_ns") is not None and owner.get("pid_ns") != _pid_namespace():
        return False
    if not _pid_alive(owner.get("pid", -1)):
        return True
    if owner.get("started") is None:
        return False
    import psutil

    try:
        return abs(psutil.Process(owner["pid"]).create_time() - owner["started"]) > 1.0
    except psutil.Error:
        return True


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def interrupt_own_running(study: optuna.Study, ceiling_bytes: int) -> list[int]:
    """Record every trial this process still holds RUNNING as interrupted, and queue it again.

    The last step of a stopped search, after its workers are joined: a trial whose worker thread
    was stopped between writing its result and closing the trial must not stay RUNNING.
    """
    swept = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not run_by_this_process(frozen):
            continue
        trial = optuna.Trial(study, frozen._trial_id)
        record_interrupted(study, trial, ceiling_bytes)
        swept.append(frozen.number)
    return swept


class Heartbeat:
    """Records Optuna heartbeats while a child runs, so other workers can tell this one is alive."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial) -> None:
        self._storage: Any = (
            study._storage
        )  # a heartbeat-capable storage (RDBStorage); BaseStorage names no record_heartbeat
        self._trial_id = trial._trial_id
        self._last: float | None = None
        # The study wraps the RDBStorage in Optuna's _CachedStorage: ask the wrapper, which
        # forwards heartbeats, rather than checking for RDBStorage (that check never matches).
        interval = getattr(self._storage, "get_heartbeat_interval", lambda: None)()
        self._interval_s: float | None = float(interval) if interval else None

    def beat(self) -> None:
        if self._interval_s is None:
            return
        now = time.monotonic()
        if self._last is None or now - self._last >= self._interval_s:
            try:
                self._storage.record_heartbeat(self._trial_id)
            except optuna.exceptions.StorageInternalError:
                return  # a full disk, a busy database: the trial keeps running; the next tick retries
            self._last = now


def stop_as_on_ctrl_c() -> list[int]:
    """Make each of :data:`STOP_SIGNALS` raise KeyboardInterrupt; returns the list the signals received
    are appended to (SIGINT's number until one is), for the exit status: 128 + the signal, as shells report it.

    A signal the search was started with ignored stays ignored: ``nohup`` ignores SIGHUP so that the
    search outlives the terminal, and a shell starts background jobs with SIGINT ignored.
    """
    received = [int(signal.SIGINT)]

    def stop(signum: int, frame: object) -> None:
        received.append(signum)
        raise KeyboardInterrupt

    for stop_signal in STOP_SIGNALS:
        if signal.getsignal(stop_signal) != signal.SIG_IGN:
            signal.signal(stop_signal, stop)
    return received
