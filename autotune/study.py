"""The Optuna study: storage, identity checks, the ask -> run -> tell loop, crash recovery.

Only the orchestrator (this module) writes to the storage; trial children only send results.
The objective is model TFLOPs (maximize); the memory constraint is ``peak - ceiling`` in GiB.
An OOM is a COMPLETE trial with value 0 and a violated constraint, so samplers learn the region
does not fit; crashes and timeouts are FAIL (they say nothing about the config).
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.devices import DeviceSpec
from autotune.errors import AutotuneError
from autotune.measure import MeasureSettings
from autotune.models import ModelSpec
from autotune.result import FAILED_STATUSES, INFEASIBLE_STATUSES, USER_ATTR_KEY, TrialResult
from autotune.runner import TrialJob, run_isolated
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
HEARTBEAT_INTERVAL_S = 10
HEARTBEAT_GRACE_S = 60
# Crashes and timeouts may be transient (a noisy neighbour, a driver hiccup): one more try.
MAX_ATTEMPTS = 2


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

    def identity(self) -> dict[str, Any]:
        """What must match for trials to be comparable in one study."""
        return {
            "model": self.model.name,
            "task": self.model.task,
            "seq_len": self.seq_len,
            "device": self.device.name,
        }


def default_study_name(model_name: str, device: DeviceSpec, seq_len: int) -> str:
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_name).name if os.path.isdir(model_name) else model_name)
    return f"{model}-{device.label.replace(':', '')}-s{seq_len}"


def open_storage(url: str) -> RDBStorage:
    """Open an Optuna RDB storage with heartbeats, or explain in one line why it cannot be opened."""
    if "://" not in url:
        raise AutotuneError(f"--storage {url!r} is not a database URL: use sqlite:///path.db or postgresql://user@host/db")
    if url.startswith("sqlite:///"):
        _check_sqlite_writable(url.removeprefix("sqlite:///"))
    try:
        return RDBStorage(
            url,
            engine_kwargs={"pool_pre_ping": True},
            heartbeat_interval=HEARTBEAT_INTERVAL_S,
            grace_period=HEARTBEAT_GRACE_S,
            heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
        )
    except Exception as exc:  # noqa: BLE001 - any driver error means "cannot open" to the user
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AutotuneError(f"--storage {redact(url)}: cannot open it ({reason[:200]})") from None


def _check_sqlite_writable(path: str) -> None:
    if path in ("", ":memory:"):
        return
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if target.exists() and not os.access(target, os.W_OK):
        raise AutotuneError(f"--storage: {target} is not writable; choose another path")
    if not target.exists() and not (directory.is_dir() and os.access(directory, os.W_OK)):
        raise AutotuneError(f"--storage: cannot create {target} (is {directory} an existing, writable directory?)")


def redact(url: str) -> str:
    """The URL with any password replaced, for messages and logs."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


def open_study(storage: RDBStorage, study_name: str, request: SearchRequest) -> optuna.Study:
    """Create the study, or load it and refuse to mix in trials of another model or length."""
    sampler = optuna.samplers.TPESampler(multivariate=True, group=False, n_startup_trials=6, seed=None)
    study = optuna.create_study(
        storage=storage, study_name=study_name, direction="maximize", sampler=sampler, load_if_exists=True
    )
    identity = request.identity()
    stored = study.user_attrs.get("identity")
    if stored is None:
        study.set_user_attr("identity", identity)
        study.set_user_attr("metric", METRIC_NAME)
        study.set_user_attr("space", request.space.choices)
        study.set_user_attr("ceiling_bytes", request.ceiling_bytes)
        study.set_user_attr("device_kind", request.device.kind)
        study.set_user_attr("base_args", request.base_args)
        study.set_metric_names([METRIC_NAME])
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

    Trials of a live orchestrator on this host are left alone. Trials of other hosts are left to
    Optuna's heartbeat check (``fail_stale_trials``), which retries them the same way.

    Returns:
        Numbers of the trials failed here.
    """
    optuna.storages.fail_stale_trials(study)
    retry = RetryHeartbeatStaleTrialCallback(max_retry=1)
    recovered = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.system_attrs.get("autotune_owner")
        if not owner or owner.get("host") != socket.gethostname() or _pid_alive(owner.get("pid", -1)):
            continue
        result = TrialResult(status="interrupted", error="the orchestrator died while this trial ran; re-queued")
        study._storage.set_trial_user_attr(trial._trial_id, USER_ATTR_KEY, result.to_dict())
        try:
            study._storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # another orchestrator got there first
        retry(study, study._storage.get_trial(trial._trial_id))
        recovered.append(trial.number)
    return recovered


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


def run_one_trial(study: optuna.Study, request: SearchRequest, progress: SearchProgress) -> TrialResult:
    """One ask -> (reuse | run in a child) -> tell cycle."""
    trial = study.ask(request.space.distributions())
    study._storage.set_trial_system_attr(
        trial._trial_id, "autotune_owner", {"host": socket.gethostname(), "pid": os.getpid()}
    )
    config = TrialConfig.from_params(trial.params)
    if progress.on_trial_start:
        progress.on_trial_start(trial.number, config)
    result = _reuse_measured(study, trial) or _run_with_retry(study, trial, config, request)
    tell(study, trial, result)
    if progress.on_trial_end:
        progress.on_trial_end(trial.number, config, result)
    return result


def _run_with_retry(study: optuna.Study, trial: optuna.Trial, config: TrialConfig, request: SearchRequest) -> TrialResult:
    heartbeat = _Heartbeat(study, trial)
    job = make_job(request, config, trial.number)
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            result = run_isolated(job, request.trial_timeout_s, on_tick=heartbeat.beat)
        except KeyboardInterrupt:
            interrupted = TrialResult(status="interrupted", error="stopped by the user (Ctrl-C)", ceiling_bytes=request.ceiling_bytes)
            tell(study, trial, interrupted)
            raise
        result.attempts = attempt
        if result.status not in ("crash", "timeout"):
            break
    return result


def make_job(request: SearchRequest, config: TrialConfig, trial_number: int) -> TrialJob:
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
    )


class _Heartbeat:
    """Records Optuna heartbeats while a child runs, so other workers can tell this one is alive."""

    def __init__(self, study: optuna.Study, trial: optuna.Trial) -> None:
        self._storage = study._storage
        self._trial_id = trial._trial_id
        self._last = 0.0

    def beat(self) -> None:
        now = time.monotonic()
        if now - self._last >= HEARTBEAT_INTERVAL_S and isinstance(self._storage, RDBStorage):
            self._storage.record_heartbeat(self._trial_id)
            self._last = now


def _reuse_measured(study: optuna.Study, trial: optuna.Trial) -> TrialResult | None:
    """A config measured before in this study is not run again: its result is copied."""
    for previous in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        if previous.params == trial.params and USER_ATTR_KEY in previous.user_attrs:
            trial.set_user_attr("reused_from", previous.number)
            return TrialResult.from_dict(previous.user_attrs[USER_ATTR_KEY])
    return None


def memory_constraint_gib(result: TrialResult) -> float:
    """``peak - ceiling`` in GiB: feasible when <= 0."""
    if result.status in ("oom", "screened") and result.peak_memory_bytes == 0:
        return UNKNOWN_EXCESS_GIB
    return (result.peak_memory_bytes - result.ceiling_bytes) / GiB


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
