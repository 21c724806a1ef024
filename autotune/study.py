"""The Optuna study: storage, identity checks, the ask -> run -> tell loop, crash recovery.

Only the orchestrator (this module) writes to the storage; trial children only send results.
The objective is model TFLOPs (maximize); the memory constraint is ``peak - ceiling`` in GiB.
An OOM is a COMPLETE trial with value 0 and a violated constraint, so samplers learn the region
does not fit; crashes and timeouts are FAIL (they say nothing about the config).
"""

from __future__ import annotations

import dataclasses
import os
import random
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.devices import DeviceSpec, matmul_dtype
from autotune.errors import AutotuneError
from autotune.measure import MeasureSettings
from autotune.models import ModelSpec
from autotune.numerics import judge_against_default, loss_reference
from autotune.result import FAILED_STATUSES, INFEASIBLE_STATUSES, USER_ATTR_KEY, TrialResult
from autotune.runner import TrialJob, run_isolated
from autotune.screening import MeasuredTrial, screen, screened_excess_gib
from autotune.seeds import enqueue_seeds, study_seeds
from autotune.space import SearchSpace

# autotune drives heartbeats itself around ask/tell (Optuna only does so inside optimize), and
# relies on the long-stable stale-trial helpers that Optuna still labels experimental.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

GiB = 1024**3
DEFAULT_STORAGE = "sqlite:///autotune.db"
METRIC_NAME = "model TFLOPs"
# The legacy list-valued system attr: Optuna 5 reads it as constraint "0", and optuna-dashboard
# 0.21 reads only this one (trial.set_constraint writes "constraints:<key>", which it ignores).
CONSTRAINTS_ATTR = "constraints"
# The constraint of an OOM or screened trial, whose real peak is unknown: "over by at least this".
UNKNOWN_EXCESS_GIB = 1.0
# Every running trial records a heartbeat this often; one silent for the grace period is taken for
# the trial of a dead worker: another worker fails it and queues it again (see heartbeat_settings).
SQLITE_BUSY_TIMEOUT_S = 120
HEARTBEAT_INTERVAL_S = 10
HEARTBEAT_GRACE_S = 60
TABLE_CREATION_ATTEMPTS = 4
# Study system attr: which worker created the study and is setting it up.
SETUP_ATTR = "autotune_setup_by"
# Crashes and timeouts may be transient (a noisy neighbour, a driver hiccup): one more try.
MAX_ATTEMPTS = 2
RETRIED_STATUSES = ("crash", "timeout")


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """What to search: the model, the device, the space and how each trial is measured."""

    model: ModelSpec
    device: DeviceSpec
    seq_len: int
    ceiling_bytes: int
    space: SearchSpace
    measure: MeasureSettings = MeasureSettings()
    trial_timeout_s: float = 900.0
    work_root: str = "autotune_runs"
    base_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    dataset: dict[str, Any] | None = None
    callbacks: tuple[str, ...] = ()
    address_space_bytes: int | None = None
    # Matmul peaks measured by `autotune devices --calibrate` on this device, by dtype (MFU against them).
    measured_peaks_tflops: dict[str, float] = dataclasses.field(default_factory=dict)
    # Skip configs the estimator or a measured OOM says cannot fit (autotune.screening).
    screen: bool = True
    # Stop a trial once its throughput is below this fraction of the best feasible one; 0 never.
    prune_ratio: float = 0.5

    def identity(self) -> dict[str, Any]:
        """What must match for trials to be comparable in one study."""
        return {
            "model": self.model.name,
            "task": self.model.task,
            "seq_len": self.seq_len,
            "device": self.device.name,
            # Real data and fixed arguments change what a step costs (and what export writes).
            "dataset": self.dataset["label"] if self.dataset else "synthetic tokens",
            "base_args": self.base_args,
        }


def default_study_name(model_name: str, device: DeviceSpec, seq_len: int) -> str:
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_name).name if os.path.isdir(model_name) else model_name)
    return f"{model}-{device.label.replace(':', '')}-s{seq_len}"


def open_storage(url: str, storage_class: type[RDBStorage] = RDBStorage) -> RDBStorage:
    """Open an Optuna RDB storage with heartbeats, or explain in one line why it cannot be opened.

    ``storage_class`` lets the dashboard serve a subclass (see ``autotune.dashboard``).
    """
    if "://" not in url:
        raise AutotuneError(f"--storage {url!r} is not a database URL: use sqlite:///path.db or postgresql://user@host/db")
    if url.startswith("sqlite:///"):
        _check_sqlite_writable(url.removeprefix("sqlite:///"))
    heartbeat_interval_s, grace_s = heartbeat_settings()
    driver_url = with_postgres_driver(url)
    engine_kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if url.startswith("sqlite:"):
        # Worker threads write at once (--workers); sqlite3 gives up on a lock after 5 s, which a
        # loaded machine exceeds: a lost tell would leave a trial RUNNING. Wait longer instead.
        engine_kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
    try:
        for attempt in range(1, TABLE_CREATION_ATTEMPTS + 1):
            try:
                return storage_class(
                    driver_url,
                    engine_kwargs=engine_kwargs,
                    heartbeat_interval=heartbeat_interval_s,
                    grace_period=grace_s,
                    heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
                )
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
                # Workers starting together on an empty database all create Optuna's tables; on
                # PostgreSQL the losers fail ("duplicate key ... pg_type"). Once they exist, it opens.
                if attempt == TABLE_CREATION_ATTEMPTS:
                    raise
                time.sleep(attempt * random.uniform(0.5, 1.5))
        raise AssertionError("unreachable")
    except Exception as exc:  # noqa: BLE001 - any driver error means "cannot open" to the user
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AutotuneError(f"--storage {redact(url)}: cannot open it ({scrub_password(reason, url)[:200]})") from None


def with_postgres_driver(url: str) -> str:
    """``postgresql://...`` with an installed driver named: SQLAlchemy's default changed with 2.1.

    SQLAlchemy 2.0 takes a bare ``postgresql://`` to mean psycopg2, 2.1 psycopg 3; users have
    whichever ``autotune[postgres]`` or their image brought. Other URLs pass unchanged.
    """
    scheme, separator, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    import importlib.util

    for module, driver in (("psycopg", "psycopg"), ("psycopg2", "psycopg2")):
        if importlib.util.find_spec(module) is not None:
            return f"postgresql+{driver}{separator}{rest}"
    raise AutotuneError("--storage postgresql://...: no PostgreSQL driver installed; pip install 'autotune[postgres]'")


def heartbeat_settings() -> tuple[int, int]:
    """Heartbeat interval and grace period in whole seconds (Optuna takes integers).

    ``AUTOTUNE_HEARTBEAT_INTERVAL_S`` and ``AUTOTUNE_HEARTBEAT_GRACE_S`` override the defaults: a
    shorter grace re-runs a dead worker's trial sooner; it must exceed the interval, or live trials
    would be taken for dead ones.

    Raises:
        AutotuneError: A value is not a positive integer, or the grace is not above the interval.
    """
    values = []
    for name, default in (("AUTOTUNE_HEARTBEAT_INTERVAL_S", HEARTBEAT_INTERVAL_S), ("AUTOTUNE_HEARTBEAT_GRACE_S", HEARTBEAT_GRACE_S)):
        text = os.environ.get(name, str(default)).strip()
        if not text.isdigit() or int(text) <= 0:
            raise AutotuneError(f"{name}={text!r}: give a whole number of seconds above 0")
        values.append(int(text))
    interval_s, grace_s = values
    if grace_s <= interval_s:
        raise AutotuneError(
            f"AUTOTUNE_HEARTBEAT_GRACE_S={grace_s} must be above AUTOTUNE_HEARTBEAT_INTERVAL_S={interval_s} (e.g. twice it)"
        )
    return interval_s, grace_s


def _check_sqlite_writable(path: str) -> None:
    if path in ("", ":memory:"):
        return
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.exists() and not os.access(target, os.W_OK):
        raise AutotuneError(f"--storage: {target} is not writable; choose another path")
    if not target.exists() and not (directory.is_dir() and os.access(directory, os.W_OK)):
        raise AutotuneError(f"--storage: cannot create {target} (is {directory} an existing, writable directory?)")
    # os.access answers yes to root for any mode, and knows nothing of read-only or special file
    # systems (/proc): only opening the file tells. Append mode changes nothing in an existing
    # file; a new, empty file is a valid empty SQLite database.
    try:
        with open(target, "ab"):
            pass
    except OSError as exc:
        raise AutotuneError(f"--storage: cannot write {target} ({exc.strerror}); choose a writable path") from None


def redact(url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def scrub_password(text: str, url: str) -> str:
    """``text`` (a driver's error message, say) with the password of ``url`` and any URL in it redacted."""
    found = re.search(r"://[^:/@]+:([^@/]+)@", url)
    if found:
        text = text.replace(found.group(1), "***")
    return re.sub(r"[a-z0-9+]+://\S+", lambda m: redact(m.group(0)), text)


def open_study(
    storage: RDBStorage, study_name: str, request: SearchRequest, sampler_seed: int | None = None
) -> optuna.Study:
    """Create the study, or load it and refuse to mix in trials of another model or length.

    A new study gets its seed trials queued (the HF default and a best-practice guess, see
    :mod:`autotune.seeds`); what had to change to fit them in the space is kept in the study's
    ``seed_notes`` user attr. ``sampler_seed`` makes the sampler reproducible (benchmarks).
    """
    sampler = optuna.samplers.TPESampler(multivariate=True, group=False, n_startup_trials=6, seed=sampler_seed)
    # Workers on several machines may start together: exactly one creates the study (the others get
    # DuplicatedStudyError) and sets it up, so the seeds are queued once, not once per worker.
    try:
        study = optuna.create_study(storage=storage, study_name=study_name, direction="maximize", sampler=sampler)
        # Tells joining workers that the study is being set up here (see _wait_for_identity).
        study._storage.set_study_system_attr(study._study_id, SETUP_ATTR, worker_identity())
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
        created = False
    identity = request.identity()
    stored = None if created else _wait_for_identity(study)
    if stored is None:
        study.set_user_attr("metric", METRIC_NAME)
        study.set_user_attr("space", request.space.choices)
        study.set_user_attr("ceiling_bytes", request.ceiling_bytes)
        study.set_user_attr("device_kind", request.device.kind)
        study.set_user_attr("base_args", request.base_args)
        study.set_metric_names([METRIC_NAME])
        seeds = study_seeds(request.space, request.model, request.device, request.seq_len, request.ceiling_bytes)
        enqueue_seeds(study, seeds)  # before the identity: a joining worker's first ask gets a seed
        study.set_user_attr("seed_notes", [note for seed in seeds for note in seed.notes])
        study.set_user_attr("identity", identity)  # after the attrs it vouches for: joining workers wait for it
        return study
    if stored != identity:
        differs = ", ".join(f"{k} {stored.get(k)!r} there, {v!r} here" for k, v in identity.items() if stored.get(k) != v)
        raise AutotuneError(
            f"study {study_name!r} holds trials of another setup ({differs}); pass a new --study-name to start one"
        )
    if study.user_attrs.get("space") != request.space.choices:
        raise AutotuneError(
            f"study {study_name!r} was searched over another space; Optuna cannot mix spaces in one study: pass a new --study-name"
        )
    if study.user_attrs.get("ceiling_bytes") != request.ceiling_bytes:
        study.set_user_attr("ceiling_bytes", request.ceiling_bytes)
    return study


def _wait_for_identity(study: optuna.Study, patience_s: float = 30.0) -> dict[str, Any] | None:
    """The identity of a study that another worker has just created and is setting up.

    ``None`` for a study made outside autotune (trials queued by hand but no setup mark), or one
    whose creator died before finishing: this worker sets it up then.
    """
    deadline = time.monotonic() + patience_s
    while (identity := study.user_attrs.get("identity")) is None and time.monotonic() < deadline:
        being_set_up = SETUP_ATTR in study._storage.get_study_system_attrs(study._study_id)
        if not being_set_up and study.get_trials(deepcopy=False):
            return None
        time.sleep(0.2)
    return identity


def load_study(storage_url: str, study_name: str | None) -> optuna.Study:
    """Load an existing study for reading; the only one in the storage if no name is given."""
    storage = open_storage(storage_url)
    names = [s.study_name for s in storage.get_all_studies()]
    if study_name is None:
        if len(names) != 1:
            found = ", ".join(names) if names else "none"
            raise AutotuneError(f"{redact(storage_url)} holds {len(names)} studies ({found}); name one with --study-name")
        study_name = names[0]
    if study_name not in names:
        raise AutotuneError(f"no study {study_name!r} in {redact(storage_url)} (studies: {', '.join(names) or 'none'})")
    return optuna.load_study(study_name=study_name, storage=storage)


@dataclasses.dataclass
class SearchProgress:
    """Callbacks the CLI gives to watch a search. All optional."""

    on_trial_start: Callable[[int, TrialConfig], None] | None = None
    on_trial_end: Callable[[int, TrialConfig, TrialResult], None] | None = None


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
        owner = trial.system_attrs.get("autotune_owner")
        if not owner or not _owner_is_dead(owner, trial.number):
            continue
        result = TrialResult(status="interrupted", error="the orchestrator died while this trial ran; re-queued")
        try:
            study._storage.set_trial_user_attr(trial._trial_id, USER_ATTR_KEY, result.to_dict())
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


def run_search(
    study: optuna.Study,
    request: SearchRequest,
    n_trials: int | None,
    timeout_s: float | None,
    progress: SearchProgress | None = None,
) -> int:
    """Ask, run in a child, tell; until ``n_trials`` trials ran here or ``timeout_s`` passed.

    Returns:
        The number of trials this call finished.

    Raises:
        KeyboardInterrupt: After the running trial was recorded as ``interrupted``.
    """
    progress = progress or SearchProgress()
    started = time.monotonic()
    done = 0
    while (n_trials is None or done < n_trials) and (timeout_s is None or time.monotonic() - started < timeout_s):
        run_one_trial(study, request, progress)
        done += 1
    return done


def ask_trial(study: optuna.Study, request: SearchRequest) -> optuna.Trial:
    """Ask for the next config (a queued re-run comes first) and mark it as this worker's.

    The first heartbeat is recorded at once: a trial with none is never found stale, so the trial
    of a worker that died right after asking would otherwise stay RUNNING for ever.
    """
    trial = study.ask(request.space.distributions())
    _Heartbeat(study, trial).beat()
    study._storage.set_trial_system_attr(trial._trial_id, "autotune_owner", {**worker_identity(), "trial": trial.number})
    return trial


def run_one_trial(
    study: optuna.Study,
    request: SearchRequest,
    progress: SearchProgress,
    trial: optuna.Trial | None = None,
    stop: threading.Event | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
) -> TrialResult:
    """One ask -> (reuse | screen | run in a child) -> tell cycle.

    Args:
        trial: A trial the caller asked for already (see :func:`ask_trial`); asked here if ``None``.
        stop: Set by another thread to stop the search: the running child is killed and the trial
            recorded as ``interrupted``, as on Ctrl-C.
        run_trial: Runs a :class:`TrialJob` (``run_isolated``'s signature); the search benchmark
            passes a lookup in a measured grid.
    """
    if trial is None:
        trial = ask_trial(study, request)
    config = TrialConfig.from_params(trial.params)
    if progress.on_trial_start:
        progress.on_trial_start(trial.number, config)
    try:
        result = (
            _reuse_measured(study, trial)
            or _screen(study, trial, config, request)
            or judge_against_default(
                _run_with_retry(study, trial, config, request, stop, run_trial), loss_reference(study.get_trials(deepcopy=False))
            )
        )
        try:
            tell(study, trial, result)
        except optuna.exceptions.UpdateFinishedTrialError:
            # Another worker missed our heartbeats (a stalled host), failed this trial and queued a
            # re-run; that copy will be measured, so this result is dropped, not told twice.
            result.error = result.error or "declared dead by another worker (missed heartbeats); re-queued"
    except KeyboardInterrupt:
        result = record_interrupted(study, trial, request)
        if progress.on_trial_end:
            progress.on_trial_end(trial.number, config, result)
        raise
    if progress.on_trial_end:
        progress.on_trial_end(trial.number, config, result)
    return result


def record_interrupted(study: optuna.Study, trial: optuna.Trial, request: SearchRequest) -> TrialResult:
    """Record a trial stopped by Ctrl-C (or a stop of the search) as FAIL ``interrupted``, and queue
    its config to run again once, first thing on resume.

    Safe wherever the interrupt landed: a trial told before it keeps its result.
    """
    stored = study._storage.get_trial(trial._trial_id)
    if stored.state != TrialState.RUNNING:
        return TrialResult.from_trial(stored) or TrialResult(status="interrupted")
    result = TrialResult(
        status="interrupted",
        error="the search was stopped (Ctrl-C) while this trial ran; it runs again on resume",
        ceiling_bytes=request.ceiling_bytes,
    )
    try:
        tell(study, trial, result)
    except optuna.exceptions.UpdateFinishedTrialError:
        return result  # another worker declared it dead and queued it already
    RetryHeartbeatStaleTrialCallback(max_retry=1)(study, study._storage.get_trial(trial._trial_id))
    return result


def interrupt_own_running(study: optuna.Study, request: SearchRequest) -> list[int]:
    """Record every trial this process still holds RUNNING as interrupted, and queue it again.

    The last step of a stopped search, after its workers are joined: a trial whose worker thread
    was stopped between writing its result and closing the trial must not stay RUNNING.
    """
    me = worker_identity()
    swept = []
    for frozen in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = frozen.system_attrs.get("autotune_owner") or {}
        if (owner.get("host"), owner.get("pid"), owner.get("started")) != (me["host"], me["pid"], me["started"]):
            continue
        trial = optuna.Trial(study, frozen._trial_id)
        record_interrupted(study, trial, request)
        swept.append(frozen.number)
    return swept


def describe_standing(study: optuna.Study) -> str:
    """Where a study stands, in one line: trials by outcome, queued re-runs, the best feasible so far."""
    trials = study.get_trials(deepcopy=False)
    by_status: dict[str, int] = {}
    best: tuple[float, int] | None = None
    for trial in trials:
        if trial.state in (TrialState.WAITING, TrialState.RUNNING):
            by_status[trial.state.name.lower()] = by_status.get(trial.state.name.lower(), 0) + 1
            continue
        result = TrialResult.from_trial(trial)
        status = result.status if result else trial.state.name.lower()
        by_status[status] = by_status.get(status, 0) + 1
        if result and trial.state == TrialState.COMPLETE and result.feasible and "reused_from" not in trial.user_attrs:
            best = max(best or (0.0, -1), (result.samples_per_s, trial.number))
    counts = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items())) or "none"
    best_text = f"best so far #{best[1]} at {best[0]:.1f} samples/s" if best else "no feasible trial yet"
    return f"study {study.study_name!r}: {len(trials)} trials ({counts}); {best_text}"


def _run_with_retry(
    study: optuna.Study,
    trial: optuna.Trial,
    config: TrialConfig,
    request: SearchRequest,
    stop: threading.Event | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
) -> TrialResult:
    heartbeat = _Heartbeat(study, trial)

    def on_tick() -> None:
        if stop is not None and stop.is_set():
            raise KeyboardInterrupt  # run_isolated kills the child; run_one_trial records it as on Ctrl-C
        heartbeat.beat()

    job = make_job(request, config, trial.number, prune_threshold(study, request.prune_ratio))
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = run_trial(job, request.trial_timeout_s, on_tick=on_tick)  # Ctrl-C: see run_one_trial
        result.attempts = attempt
        if result.status not in RETRIED_STATUSES or attempt == MAX_ATTEMPTS:
            break
        # Keep why the first attempt failed; the retry appends to the same log, after a marker.
        trial.set_user_attr(
            "first_attempt", {"status": result.status, "error": result.error, "stderr_tail": result.stderr_tail}
        )
        if os.path.exists(job.log_path):
            with open(job.log_path, "a") as log:
                log.write(f"\n--- autotune: attempt {attempt} ended: {result.status}: {result.error}; retrying once ---\n")
    return result


def make_job(
    request: SearchRequest, config: TrialConfig, trial_number: int, prune_below_samples_per_s: float | None = None
) -> TrialJob:
    return TrialJob(
        model=request.model,
        device=request.device,
        config=config,
        seq_len=request.seq_len,
        ceiling_bytes=request.ceiling_bytes,
        measure=request.measure,
        work_dir=str(Path(request.work_root).resolve() / f"trial-{trial_number}-{os.getpid()}"),
        base_args=request.base_args,
        address_space_bytes=request.address_space_bytes,
        dataset=request.dataset,
        callbacks=request.callbacks,
        prune_below_samples_per_s=prune_below_samples_per_s,
        measured_peak_tflops=request.measured_peaks_tflops.get(
            matmul_dtype(config.dtype, bool(request.base_args.get("tf32")))
        ),
    )


class _Heartbeat:
    """Records Optuna heartbeats while a child runs, so other workers can tell this one is alive."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial) -> None:
        self._storage = study._storage
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
            self._storage.record_heartbeat(self._trial_id)
            self._last = now


def prune_threshold(study: optuna.Study, ratio: float) -> float | None:
    """``ratio`` x the best feasible samples/s so far: a trial measured below it is stopped early.

    Samples/s ranks like model TFLOPs for one model and sequence length. ``None`` (never prune)
    with ``ratio`` 0 or before any trial fits.
    """
    if ratio <= 0:
        return None
    best = 0.0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        result = TrialResult.from_trial(trial)
        if result is not None and result.feasible:
            best = max(best, result.samples_per_s)
    return best * ratio if best > 0 else None


def measured_trials(study: optuna.Study) -> list[MeasuredTrial]:
    """Trials that ran (each config once; reused and screened copies left out), for screening."""
    measured = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        result = TrialResult.from_trial(trial)
        if result is None or result.status == "screened" or "reused_from" in trial.user_attrs:
            continue
        measured.append(MeasuredTrial(trial.number, TrialConfig.from_params(trial.params), result))
    return measured


def _screen(study: optuna.Study, trial: optuna.Trial, config: TrialConfig, request: SearchRequest) -> TrialResult | None:
    """A screened result if the config is known not to fit (see :mod:`autotune.screening`), else ``None``."""
    if not request.screen:
        return None
    decision = screen(
        config, request.model, request.seq_len, request.device.kind, request.ceiling_bytes, measured_trials(study)
    )
    if decision is None:
        return None
    if decision.predicted_peak_bytes is not None:
        trial.set_user_attr("predicted_peak_bytes", decision.predicted_peak_bytes)
    return decision.to_result(request.ceiling_bytes)


def _reuse_measured(study: optuna.Study, trial: optuna.Trial) -> TrialResult | None:
    """A config measured before in this study is not run again: its result is copied."""
    for previous in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if previous.params == trial.params and USER_ATTR_KEY in previous.user_attrs:
            trial.set_user_attr("reused_from", previous.number)
            return TrialResult.from_dict(previous.user_attrs[USER_ATTR_KEY])
    return None


def memory_constraint_gib(result: TrialResult) -> float:
    """``peak - ceiling`` in GiB: feasible when <= 0; always > 0 for an infeasible status.

    An OOM can strike with the peak seen so far under the ceiling (the CPU address-space limit,
    fragmentation); the config still did not fit, so its constraint must say so: samplers, Optuna's
    ``best_trial`` and the dashboard all read feasibility from this number alone. A ``diverged``
    trial that fitted gets the same positive value: it is infeasible for numerics, not memory (this
    one constraint is the only feasibility Optuna and the dashboard read).
    """
    if result.status == "screened":
        return screened_excess_gib(result) or UNKNOWN_EXCESS_GIB  # predicted or inferred, never measured
    excess_gib = (result.peak_memory_bytes - result.ceiling_bytes) / GiB
    if result.status in INFEASIBLE_STATUSES and (result.peak_memory_bytes == 0 or excess_gib <= 0):
        return UNKNOWN_EXCESS_GIB
    return excess_gib


def tell(study: optuna.Study, trial: optuna.Trial, result: TrialResult) -> None:
    """Record a result: user attrs, the memory constraint, then the trial's final state."""
    trial.set_user_attr(USER_ATTR_KEY, result.to_dict())
    trial.set_user_attr("status", result.status)
    if result.status in FAILED_STATUSES:
        study.tell(trial, state=TrialState.FAIL)
        return
    study._storage.set_trial_system_attr(trial._trial_id, CONSTRAINTS_ATTR, [memory_constraint_gib(result)])
    if result.status == "pruned":
        trial.report(result.model_tflops, step=0)
        study.tell(trial, state=TrialState.PRUNED)
        return
    value = 0.0 if result.status in INFEASIBLE_STATUSES else result.model_tflops
    study.tell(trial, value)
