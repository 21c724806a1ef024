"""Several trials at once: one worker per device, all asking and telling on one study.

Workers are threads of the one orchestrator process. The trial children do the work; a worker only
waits on its child, so threads suffice, as in Optuna's own ``optimize(n_jobs=...)``. Each thread
gets its own SQLAlchemy session from the RDB storage (a scoped session per thread; SQLAlchemy 2
pools file SQLite connections across threads), and Optuna's cached storage wraps it in a lock.

Several processes or machines share a study through an RDB storage (PostgreSQL for machines); no
scheduler of ours is involved. Before every ask a worker fails the trials of dead workers
(:func:`autotune.study.recover_orphans`: Optuna's heartbeat check, plus dead PIDs on this host),
and Optuna's ``RetryHeartbeatStaleTrialCallback`` queues each once more as a WAITING trial, which
the next ``study.ask`` of any worker pops and runs.

The study-wide cap (``--max-total-trials``) counts trials that are COMPLETE, PRUNED or RUNNING,
except repeats of a measured config answered from the record (``reused_from``: not a trial).
FAIL trials (crashes, timeouts, a dead worker's trial) do not count; the re-run of a dead worker's
trial does. WAITING trials are a queue, not counted until a worker starts one. Within one process,
checking the cap and asking happen under one lock, so threads never overshoot it; workers in
other processes can each ask in the same few milliseconds, so the study can end at most one trial
over the cap per other process asking at that moment. When the cap is reached while trials still
run, a worker waits for them instead of exiting: one of them may fail or turn out to belong to a
dead worker, and its slot must be filled for the study to end with the number asked for.
"""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.devices import DeviceSpec, resolve_device
from autotune.errors import AutotuneError
from autotune.proposals import SearchFinished, is_budget_trial, stop_reason
from autotune.study import (
    MAX_ATTEMPTS,
    SearchProgress,
    SearchRequest,
    ask_trial,
    heartbeat_settings,
    interrupt_own_running,
    recover_orphans,
    run_one_trial,
)

# The states that count against --max-total-trials.
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
# What the study-wide cap says a worker should do next.
START, WAIT, DONE = "start", "wait", "done"


def worker_devices(device: str | None, gpu: int | None, gpus: str | None, workers: int) -> list[DeviceSpec]:
    """The device of each worker: ``--gpus 0,1`` gives one worker per GPU, ``--workers N`` N on the CPU.

    Raises:
        AutotuneError: Options that contradict each other, a malformed list, GPUs of different kinds.
    """
    if workers < 1:
        raise AutotuneError("--workers must be 1 or more")
    if gpus is None:
        spec = resolve_device(device, gpu)
        if workers > 1 and spec.kind != "cpu":
            raise AutotuneError(
                "--workers runs several trials on one device, which only the CPU allows; for GPUs use --gpus 0,1,... (one trial per GPU)"
            )
        return [spec] * workers
    if device is not None or gpu is not None or workers != 1:
        raise AutotuneError("--gpus gives one worker per GPU: leave out --gpu, --device and --workers")
    numbers = [part.strip() for part in gpus.split(",")]
    if not all(part.isdigit() for part in numbers) or len(set(numbers)) != len(numbers):
        raise AutotuneError(f"--gpus {gpus!r}: give distinct CUDA device numbers separated by commas, e.g. --gpus 0,1,2,3")
    specs = [resolve_device(None, int(part)) for part in numbers]
    kinds = {(spec.name, spec.total_memory_bytes) for spec in specs}
    if len(kinds) > 1:
        found = ", ".join(f"{spec.label} is {spec.name}" for spec in specs)
        raise AutotuneError(
            f"--gpus {gpus}: {found}; one study measures one kind of GPU: run one search per kind (--gpus with the same model)"
        )
    return specs


def cap_decision(trials: Sequence[FrozenTrial], max_total_trials: int, patience_s: float, now: datetime.datetime) -> str:
    """What the study-wide cap allows: start a trial, wait for running ones to end, or stop.

    Args:
        trials: The study's trials (any states).
        max_total_trials: The cap on COMPLETE + PRUNED + RUNNING trials.
        patience_s: A RUNNING trial started longer ago than this is not waited for (a worker that
            died before its first heartbeat, or a run of an older version, leaves one for ever).
        now: The current time, as Optuna stamps ``datetime_start``.
    """
    counted = [t for t in trials if t.state in COUNTED_STATES and is_budget_trial(t)]
    if len(counted) < max_total_trials:
        return START
    for trial in counted:
        if trial.state == TrialState.RUNNING and (
            trial.datetime_start is None or (now - trial.datetime_start).total_seconds() < patience_s
        ):
            return WAIT
    return DONE


@dataclasses.dataclass
class _Pool:
    """What the workers of one invocation share: their budget, the ask lock, the stop signal."""

    study: optuna.Study
    n_trials: int | None
    deadline: float | None
    max_total_trials: int | None
    patience_s: float
    poll_s: float
    patience: int | None = None
    ask_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    count_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    started: int = 0
    finished: int = 0
    errors: list[BaseException] = dataclasses.field(default_factory=list)

    def work(self, request: SearchRequest, progress: SearchProgress) -> None:
        """Start trials on ``request.device`` until the budget, the cap or a stop says no more."""
        while not self.stop.is_set():
            with self.ask_lock:
                if not self._may_start(request):
                    return
                try:
                    trial = ask_trial(self.study, request)
                except SearchFinished:
                    return
                self.started += 1
            run_one_trial(self.study, request, progress, trial=trial, stop=self.stop)
            with self.count_lock:
                self.finished += 1

    def work_in_thread(self, request: SearchRequest, progress: SearchProgress, finished: threading.Event) -> None:
        """:meth:`work` in a worker thread; sets ``finished`` once its trial is recorded, however it ended."""
        try:
            self.work(request, progress)
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which re-raises
            if not isinstance(exc, KeyboardInterrupt):
                self.errors.append(exc)
            self.stop.set()
        finally:
            finished.set()

    def _may_start(self, request: SearchRequest) -> bool:
        """This invocation's own budget first, then whether the search is done (the space measured,
        ``--patience``), then the study-wide cap (waiting while it says so)."""
        while not self.stop.is_set():
            if self.n_trials is not None and self.started >= self.n_trials:
                return False
            if self.deadline is not None and time.monotonic() >= self.deadline:
                return False
            if stop_reason(self.study, request.space.size, self.patience) is not None:
                return False
            recover_orphans(self.study)  # before every ask: a dead worker's trial is queued again
            if self.max_total_trials is None:
                return True
            decision = cap_decision(
                self.study.get_trials(deepcopy=False), self.max_total_trials, self.patience_s, datetime.datetime.now()
            )
            if decision != WAIT:
                return decision == START
            self.stop.wait(self.poll_s)
        return False


def run_workers(
    study: optuna.Study,
    request: SearchRequest,
    devices: Sequence[DeviceSpec],
    n_trials: int | None,
    timeout_s: float | None,
    progress: SearchProgress | None = None,
    max_total_trials: int | None = None,
    patience: int | None = None,
) -> int:
    """Run one worker per entry of ``devices`` on ``study`` until the budget or the cap is reached,
    or the search is done (:func:`autotune.proposals.stop_reason`).

    Args:
        study: The study every worker asks and tells on.
        request: What to search; each worker gets a copy with its own device.
        devices: One entry per worker (the same CPU several times for ``--workers N``).
        n_trials: Trials this invocation starts at most, over all its workers.
        timeout_s: No trial starts after this many seconds.
        progress: Called from the worker threads; must be thread-safe.
        max_total_trials: The study-wide cap, over every worker of every process (see the module doc).
        patience: Start no trial once this many in a row did not raise the best above the noise.

    Returns:
        The number of trials this invocation finished.

    Raises:
        KeyboardInterrupt: After every running trial was stopped and recorded as ``interrupted``.
    """
    if not devices:
        raise ValueError("run_workers needs at least one device")
    interval_s, grace_s = heartbeat_settings()
    pool = _Pool(
        study=study,
        n_trials=n_trials,
        deadline=None if timeout_s is None else time.monotonic() + timeout_s,
        max_total_trials=max_total_trials,
        # A live trial ends within its attempts' timeouts; a dead worker's is failed one grace later.
        patience_s=MAX_ATTEMPTS * request.trial_timeout_s + 2 * grace_s,
        poll_s=float(interval_s),
        patience=patience,
    )
    progress = progress or SearchProgress()
    requests = [dataclasses.replace(request, device=device) for device in devices]
    if len(requests) == 1:
        pool.work(requests[0], progress)  # in the main thread, where Ctrl-C arrives
        return pool.finished
    finished = [threading.Event() for _ in requests]
    threads = [
        threading.Thread(
            target=pool.work_in_thread, args=(worker_request, progress, done), name=f"autotune-worker-{i}-{worker_request.device.label}"
        )
        for i, (worker_request, done) in enumerate(zip(requests, finished))
    ]
    for thread in threads:
        thread.start()
    try:
        _wait_for(finished)
    except KeyboardInterrupt:
        pool.stop.set()  # each worker kills its child and records the trial as interrupted
        _wait_for(finished)
        interrupt_own_running(study, request)
        if pool.errors:  # recording a trial failed: say so rather than claim all is recorded
            raise pool.errors[0]
        raise
    for thread in threads:
        thread.join()  # each has set its event: no wait left for a signal to land in
    if pool.errors:
        raise pool.errors[0]
    return pool.finished


def _wait_for(events: Sequence[threading.Event]) -> None:
    """Wait, in the main thread, until every event is set; Ctrl-C interrupts the wait safely.

    Not ``Thread.join``: on Python < 3.13 a KeyboardInterrupt landing inside ``join(timeout)`` marks
    the still-running thread as stopped (CPython gh-90882), so a later ``join()`` returns at once
    and the interpreter exits while that worker is still recording its trial (its re-queue lost).
    """
    while not all(event.is_set() for event in events):
        time.sleep(0.1)
