"""The trial loop: ask -> (reuse | screen | run in a child) -> tell, with one worker per device.

This is the one loop ``autotune search`` runs, with one worker or several. Each trial cycle
(:func:`run_one_trial`) asks the sampler for a config (a queued re-run or seed comes first), answers
a repeat of a measured config from its record, screens a config known not to fit, or runs it in a
fresh child (:mod:`autotune.runner`), retrying a crash or timeout once, and records the outcome
(:mod:`._record`).


Several trials at once: workers are threads of the one orchestrator process. The trial children do the work; a worker only
waits on its child, so threads suffice, as in Optuna's own ``optimize(n_jobs=...)``. Each thread
gets its own SQLAlchemy session from the RDB storage (a scoped session per thread; SQLAlchemy 2
pools file SQLite connections across threads), and Optuna's cached storage wraps it in a lock.

Several processes or machines share a study through an RDB storage (PostgreSQL for machines); no
scheduler of ours is involved. Before every ask a worker fails the trials of dead workers
(:func:`._liveness.recover_orphans`: Optuna's heartbeat check, plus dead PIDs on this host),
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
import os
import threading
import time
from collections.abc import Callable, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.levers import TrialConfig
from autotune.result import (
    Status,
    TrialResult,
    feasible_by_speed,
    is_budget_trial,
    judge_against_default,
    judged_trials,
    loss_reference,
    worth_retrying,
)
from autotune.runner import TrialJob, run_isolated
from autotune.storage import heartbeat_settings, schema
from autotune.study._liveness import (
    Heartbeat,
    interrupt_own_running,
    mark_owner,
    recover_orphans,
)
from autotune.study._proposals import SearchFinished, stop_reason
from autotune.study._record import record_interrupted, tell, tell_or_keep, trial_work_dir
from autotune.study._request import SearchBudget, SearchProgress, SearchRequest
from autotune.study._screening import MeasuredTrial, record_predictions, screen

# Crashes and timeouts may be transient (autotune.result.worth_retrying): one more try.
MAX_ATTEMPTS = 2
# Repeats of measured configs answered from the record before the search gives up asking (the
# sampler proposes untaken configs while any are left: see ._proposals).
MAX_REPEATS_IN_A_ROW = 50
# A screened proposal costs no trial of the budget (``--trials`` counts configs that ran); from this
# many screened in a row on, they count again, so that a space the estimate puts mostly over the
# ceiling still ends within the budget.
MAX_FREE_SCREENED_IN_A_ROW = 20

# The states that count against --max-total-trials.
COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
# What the study-wide cap says a worker should do next.
START, WAIT, DONE = "start", "wait", "done"


def cap_decision(
    trials: Sequence[FrozenTrial], max_total_trials: int, patience_s: float, now: datetime.datetime
) -> str:
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
class _WorkerThreads:
    """What the workers of one invocation share: their budget, the ask lock, the stop signal."""

    study: optuna.Study
    n_trials: int | None
    deadline: float | None
    max_total_trials: int | None
    patience_s: float
    poll_s: float
    ask_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    count_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    patience: int | None = None
    run_trial: Callable[..., TrialResult] = run_isolated
    started: int = 0
    finished: int = 0
    screened_in_a_row: int = 0
    errors: list[BaseException] = dataclasses.field(default_factory=list)

    def work(self, request: SearchRequest, progress: SearchProgress) -> None:
        """Start trials on ``request.workload.device`` until the budget, the cap or a stop says no more.

        ``--trials`` counts configs that ran (measured, or failed on every attempt): a screened
        proposal gives its place in the budget back (up to :data:`MAX_FREE_SCREENED_IN_A_ROW` in a row).
        """
        while not self.stop.is_set():
            with self.ask_lock:
                if not self._may_start(request):
                    return
                try:
                    trial = ask_trial(self.study, request, self.patience)
                except SearchFinished:
                    return
                self.started += 1
            result = run_one_trial(self.study, request, progress, trial=trial, stop=self.stop, run_trial=self.run_trial)
            with self.count_lock:
                self.finished += 1
                screened = result.status == Status.SCREENED
                self.screened_in_a_row = self.screened_in_a_row + 1 if screened else 0
            if screened and self.screened_in_a_row <= MAX_FREE_SCREENED_IN_A_ROW:
                with self.ask_lock:
                    self.started -= 1

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
        """This invocation's own budget first, then the study-wide cap (waiting while it says so).
        Whether the search is done (the space measured, ``--patience``) is :func:`ask_trial`'s to say."""
        while not self.stop.is_set():
            if self.n_trials is not None and self.started >= self.n_trials:
                return False
            if self.deadline is not None and time.monotonic() >= self.deadline:
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


def run_search(
    study: optuna.Study,
    request: SearchRequest,
    budget: SearchBudget,
    progress: SearchProgress | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
    stop: threading.Event | None = None,
) -> int:
    """Run one worker per device of ``request.worker_devices`` on ``study`` until the budget says stop
    or the search is done (:func:`._proposals.stop_reason`: the space measured, ``--patience``).

    With one worker it runs in the calling thread, where Ctrl-C arrives; with several, each is a
    thread and the calling thread waits for them.

    Args:
        study: The study every worker asks and tells on.
        request: What to search; each worker trains on its own device of ``request.worker_devices``
            (``request.workload.device`` alone when that is empty).
        budget: Trials to start, time to start them in, the study-wide cap (see the module doc).
        progress: Called from the worker threads; must be thread-safe.
        run_trial: Runs a :class:`TrialJob` (``run_isolated``'s signature); the search benchmark
            passes a lookup in a measured grid.
        stop: Set by the caller (a progress callback, say) to start no more trials; a trial still
            running then is stopped and recorded as ``interrupted``, as on Ctrl-C.

    Returns:
        The number of trials this invocation finished.

    Raises:
        KeyboardInterrupt: After every running trial was stopped and recorded as ``interrupted``.
    """
    interval_s, grace_s = heartbeat_settings()
    workers = _WorkerThreads(
        study=study,
        n_trials=budget.trials,
        deadline=None if budget.timeout_s is None else time.monotonic() + budget.timeout_s,
        max_total_trials=budget.max_total_trials,
        # A live trial ends within its attempts' timeouts; a dead worker's is failed one grace later.
        patience_s=MAX_ATTEMPTS * request.trial_timeout_s + 2 * grace_s,
        poll_s=float(interval_s),
        patience=budget.patience,
        run_trial=run_trial,
        stop=stop or threading.Event(),
    )
    progress = progress or SearchProgress()
    requests = request.worker_requests()
    if len(requests) == 1:
        workers.work(requests[0], progress)  # in the main thread, where Ctrl-C arrives
        return workers.finished
    finished = [threading.Event() for _ in requests]
    threads = [
        threading.Thread(
            target=workers.work_in_thread,
            args=(worker_request, progress, done),
            name=f"autotune-worker-{i}-{worker_request.workload.device.label}",
        )
        for i, (worker_request, done) in enumerate(zip(requests, finished))
    ]
    for thread in threads:
        thread.start()
    try:
        _wait_for(finished)
    except KeyboardInterrupt:
        workers.stop.set()  # each worker kills its child and records the trial as interrupted
        _wait_for(finished)
        interrupt_own_running(study, request.ceiling_bytes)
        if workers.errors:  # recording a trial failed: say so rather than claim all is recorded
            raise workers.errors[0] from None
        raise
    for thread in threads:
        thread.join()  # each has set its event: no wait left for a signal to land in
    if workers.errors:
        raise workers.errors[0]
    return workers.finished


def _wait_for(events: Sequence[threading.Event]) -> None:
    """Wait, in the main thread, until every event is set; Ctrl-C interrupts the wait safely.

    Not ``Thread.join``: on Python < 3.13 a KeyboardInterrupt landing inside ``join(timeout)`` marks
    the still-running thread as stopped (CPython gh-90882), so a later ``join()`` returns at once
    and the interpreter exits while that worker is still recording its trial (its re-queue lost).
    """
    while not all(event.is_set() for event in events):
        time.sleep(0.1)


def ask_trial(study: optuna.Study, request: SearchRequest, patience: int | None = None) -> optuna.Trial:
    """Ask for the next config (a queued re-run comes first) and mark it as this worker's.

    Before each ask, the one check that the search is done (:func:`._proposals.stop_reason`: the
    space measured, ``patience``). A proposal that repeats a measured config is not a trial of the
    user's budget: it is recorded as a copy of the measured trial (``reused_from``: the dashboard
    and ``best --all`` show how often the sampler came back) and the sampler is asked again. So the
    trial returned is never such a repeat: :func:`run_one_trial` does not check again.

    The first heartbeat is recorded at once (see :func:`._liveness.mark_owner`).

    Raises:
        SearchFinished: The search is done, or the sampler kept proposing measured configs.
    """
    for _ in range(MAX_REPEATS_IN_A_ROW):
        if (reason := stop_reason(study, request.space.size, patience)) is not None:
            raise SearchFinished(reason)
        trial = study.ask(request.space.distributions())
        mark_owner(study, trial)
        repeat = _reuse_measured(study, trial)
        if repeat is None:
            return trial
        tell(study, trial, repeat)
    raise SearchFinished(
        f"the sampler proposed only measured configs, {MAX_REPEATS_IN_A_ROW} times in a row; the rest of the space is running elsewhere"
    )


def run_one_trial(
    study: optuna.Study,
    request: SearchRequest,
    progress: SearchProgress,
    trial: optuna.Trial | None = None,
    stop: threading.Event | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
) -> TrialResult:
    """One ask (a repeat answered from the record there) -> (screen | run in a child) -> tell cycle.

    Args:
        trial: A trial the caller asked for already with :func:`ask_trial` (never a repeat of a
            measured config); asked here if ``None``.
        stop: Set by another thread to stop the search: the running child is killed and the trial
            recorded as ``interrupted``, as on Ctrl-C.
        run_trial: Runs a :class:`TrialJob` (``run_isolated``'s signature); the search benchmark
            passes a lookup in a measured grid.
    """
    if trial is None:
        trial = ask_trial(study, request)
    config = TrialConfig.from_params(trial.params)
    record_predictions(trial, config, request.workload, measured_trials(study))
    if progress.on_trial_start:
        progress.on_trial_start(trial.number, config)
    try:
        result = _screen(study, trial, config, request) or judge_against_default(
            _run_with_retry(study, trial, config, request, stop, run_trial),
            loss_reference(study.get_trials(deepcopy=False)),
        )
    except BaseException:
        # Whatever ended the run with no result (Ctrl-C or a stop signal, a trial whose process could
        # not be started): the trial is recorded interrupted and queued again, never left RUNNING.
        _record_stopped(study, trial, config, request, progress)
        raise
    try:
        tell_or_keep(study, trial, result, request.work_root)
    except optuna.exceptions.UpdateFinishedTrialError:
        # Another worker missed our heartbeats (a stalled host), failed this trial and queued a
        # re-run; that copy will be measured, so this result is dropped, not told twice.
        result.error = result.error or "declared dead by another worker (missed heartbeats); re-queued"
    except KeyboardInterrupt:  # a tell the storage refused keeps its result instead (tell_or_keep)
        _record_stopped(study, trial, config, request, progress)
        raise
    if progress.on_trial_end:
        progress.on_trial_end(trial.number, config, result)
    return result


def _record_stopped(
    study: optuna.Study, trial: optuna.Trial, config: TrialConfig, request: SearchRequest, progress: SearchProgress
) -> None:
    result = record_interrupted(study, trial, request.ceiling_bytes)
    if progress.on_trial_end:
        progress.on_trial_end(trial.number, config, result)


def _run_with_retry(
    study: optuna.Study,
    trial: optuna.Trial,
    config: TrialConfig,
    request: SearchRequest,
    stop: threading.Event | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
) -> TrialResult:
    heartbeat = Heartbeat(study, trial)

    def on_tick() -> None:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt  # run_isolated kills the child; run_one_trial records it as on Ctrl-C
        heartbeat.beat()

    job = make_job(request, config, trial.number, *prune_threshold(study, request.prune_ratio))
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = run_trial(job, request.trial_timeout_s, on_tick=on_tick)  # Ctrl-C: see run_one_trial
        result.attempts = attempt
        if not worth_retrying(result) or attempt == MAX_ATTEMPTS:
            break
        # Keep why the first attempt failed; the retry appends to the same log, after a marker.
        trial.set_user_attr(
            schema.TRIAL_FIRST_ATTEMPT,
            {"status": result.status, "error": result.error, "stderr_tail": result.stderr_tail},
        )
        if os.path.exists(job.log_path):
            with open(job.log_path, "a") as log:
                log.write(
                    f"\n--- autotune: attempt {attempt} ended: {result.status}: {result.error}; retrying once ---\n"
                )
    return result


def make_job(
    request: SearchRequest,
    config: TrialConfig,
    trial_label: int | str,
    prune_below_samples_per_s: float | None = None,
    prune_step_noise: float = 0.0,
) -> TrialJob:
    """The child's job for ``config``: the request's workload, in a work directory of this trial's own."""
    return TrialJob(
        workload=request.workload,
        config=config,
        work_dir=trial_work_dir(request.work_root, trial_label),
        prune_below_samples_per_s=prune_below_samples_per_s,
        prune_step_noise=prune_step_noise,
    )


def prune_threshold(study: optuna.Study, ratio: float) -> tuple[float | None, float]:
    """``ratio`` x the best feasible samples/s so far, below which a trial is stopped early, and the
    step-time CV of that best trial (the noise an early judgement allows for:
    :func:`autotune.spec.measure.clearly_slower`).

    Samples/s ranks like model TFLOPs for one model and sequence length. ``(None, 0)`` (never prune)
    with ``ratio`` 0 or before any trial fits.
    """
    if ratio <= 0:
        return None, 0.0
    fitting = feasible_by_speed(judged_trials(study.get_trials(deepcopy=False)))
    best = max((result for _, result in fitting), key=lambda result: result.samples_per_s, default=None)
    if best is None or best.samples_per_s <= 0:
        return None, 0.0
    return best.samples_per_s * ratio, best.step_time_cv


def measured_trials(study: optuna.Study) -> list[MeasuredTrial]:
    """Trials that ran (each config once; reused and screened copies left out), for screening."""
    measured = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        result = TrialResult.from_trial(trial)
        if result is None or result.status == Status.SCREENED or schema.TRIAL_REUSED_FROM in trial.user_attrs:
            continue
        measured.append(MeasuredTrial(trial.number, TrialConfig.from_params(trial.params), result))
    return measured


def _screen(
    study: optuna.Study, trial: optuna.Trial, config: TrialConfig, request: SearchRequest
) -> TrialResult | None:
    """A screened result if the config is known not to fit (see :mod:`._screening`), else ``None``."""
    if not request.screen:
        return None
    decision = screen(config, request.workload, measured_trials(study))
    if decision is None:
        return None
    if decision.predicted_peak_bytes is not None:
        trial.set_user_attr(schema.TRIAL_PREDICTED_PEAK_BYTES, decision.predicted_peak_bytes)
    return decision.to_result(request.ceiling_bytes)


def _reuse_measured(study: optuna.Study, trial: optuna.Trial) -> TrialResult | None:
    """A config measured before in this study is not run again: its result is copied."""
    for previous in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if previous.params == trial.params and schema.TRIAL_RESULT in previous.user_attrs:
            trial.set_user_attr(schema.TRIAL_REUSED_FROM, previous.number)
            return TrialResult.from_dict(previous.user_attrs[schema.TRIAL_RESULT])
    return None
