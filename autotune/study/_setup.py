"""Study set-up: create a study (queueing its seed trials) or join one, refusing to mix setups.

Trials are comparable only when they trained the same model, task, sequence length, data and fixed
arguments on the same kind of device, over the same space: the study's ``identity`` attr
(:mod:`autotune.storage.schema`) holds the first five, and :func:`check_identity` is the one check, used
by ``search`` when it resumes or joins a study and by ``estimate --storage`` when it calibrates on one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import optuna
from optuna.storages import RDBStorage

from autotune.errors import AutotuneError
from autotune.estimate import MemoryFit, SpeedModel
from autotune.result import dataset_samples
from autotune.runner import Workload
from autotune.spec.ceiling import ranks_sharing
from autotune.spec.models import ModelSpec
from autotune.storage import load_study, schema
from autotune.study._landscape import calibrated_speed
from autotune.study._liveness import worker_identity
from autotune.study._loop import measured_trials
from autotune.study._proposals import make_sampler
from autotune.study._request import SearchRequest, workload_identity
from autotune.study._screening import memory_fit_from_trials
from autotune.study._seeds import enqueue_seeds, requeue_failed_seeds, study_seeds
from autotune.units import format_bytes


def open_study(
    storage: RDBStorage, study_name: str, request: SearchRequest, sampler_seed: int | None = None
) -> optuna.Study:
    """Create the study, or load it and refuse to mix in trials of another setup.

    A new study gets its seed trials queued (the HF default and a best-practice guess, see
    :mod:`._seeds`); what had to change to fit them in the space is kept in the study's
    ``seed_notes`` user attr. ``sampler_seed`` makes the sampler reproducible (benchmarks).

    Raises:
        AutotuneError: The study holds trials of another setup or space.
    """
    sampler = make_sampler(request, sampler_seed)
    # Workers on several machines may start together: exactly one creates the study (the others get
    # DuplicatedStudyError) and sets it up, so the seeds are queued once, not once per worker.
    try:
        study = optuna.create_study(storage=storage, study_name=study_name, direction="maximize", sampler=sampler)
        # Tells joining workers that the study is being set up here (see _wait_for_identity).
        study._storage.set_study_system_attr(study._study_id, schema.STUDY_SETUP_BY, worker_identity())
        created = True
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=study_name, storage=storage, sampler=sampler)
        created = False
    if created or _wait_for_identity(study) is None:
        _set_up(study, request)
        return study
    check_identity(study, request.identity())
    # The ceiling before the space: the memory prior narrows the space under the ceiling, so a run that
    # changed only the ceiling often plans another space too, and the ceiling is what the user changed.
    check_same_ceiling(
        study, request.ceiling_bytes, ranks_sharing(request.workload.device.kind, request.workload.devices_per_trial)
    )
    if study.user_attrs.get(schema.STUDY_SPACE) != request.space.choices:
        raise AutotuneError(
            f"study {study_name!r} was searched over another space; Optuna cannot mix spaces in one study: pass a new --study-name"
        )
    record_search_options(study, request)
    requeue_failed_seeds(study)
    return study


def _set_up(study: optuna.Study, request: SearchRequest) -> None:
    """Write a new study's attrs and queue its seeds; the identity last, since joining workers wait for it."""
    workload = request.workload
    study.set_user_attr(schema.STUDY_METRIC, schema.METRIC_NAME)
    study.set_user_attr(schema.STUDY_SPACE, request.space.choices)
    study.set_user_attr(schema.STUDY_CEILING_BYTES, workload.ceiling_bytes)
    study.set_user_attr(schema.STUDY_DEVICE_KIND, workload.device.kind)
    study.set_user_attr(schema.STUDY_BASE_ARGS, workload.base_args)
    study.set_user_attr(schema.STUDY_DATASET_SAMPLES, dataset_samples(workload.dataset))
    record_search_options(study, request)
    study.set_metric_names([schema.METRIC_NAME])
    seeds = study_seeds(request.space, workload)
    enqueue_seeds(study, seeds)  # before the identity: a joining worker's first ask gets a seed
    study.set_user_attr(schema.STUDY_SEED_NOTES, [note for seed in seeds for note in seed.notes])
    study.set_user_attr(schema.STUDY_IDENTITY, request.identity())


def record_search_options(study: optuna.Study, request: SearchRequest) -> None:
    """Keep the options of the search that opens the study (the last one, on a resume), as typed: what
    ``autotune verify`` plans the same workload from (:mod:`._verify`). A request made outside the
    command line has none, and leaves the record as it was."""
    if request.options is not None:
        study.set_user_attr(schema.STUDY_SEARCH_OPTIONS, dataclasses.asdict(request.options))


# What a search or an estimate that meets another setup's study is told to do.
NEW_STUDY_REMEDY = "pass a new --study-name to start one, or the options that study was made with"


def check_identity(
    study: optuna.Study, expected: dict[str, Any], keys: Iterable[str] | None = None, remedy: str = NEW_STUDY_REMEDY
) -> None:
    """Refuse a study whose identity differs from ``expected`` (on ``keys``, or all of them); the line
    ends with ``remedy``.

    Raises:
        AutotuneError: Naming each difference, and what to do instead.
    """
    stored = study.user_attrs.get(schema.STUDY_IDENTITY) or {}
    # Both sides' keys: an identity names a setting only where it is not its default (the trainer,
    # the ranks), so a study made under SFTTrainer differs from one of the Trainer by a key one lacks.
    names = list(keys) if keys is not None else list(dict.fromkeys([*expected, *stored]))
    differs = [
        f"{name} {stored.get(name)!r} there, {expected.get(name)!r} here"
        for name in names
        if stored.get(name) != expected.get(name)
    ]
    if differs:
        raise AutotuneError(
            f"study {study.study_name!r} measured {stored.get('model')} at seq len {stored.get('seq_len')} on "
            f"{stored.get('device')}: another setup ({', '.join(differs)}); {remedy}"
        )


def check_same_ceiling(study: optuna.Study, ceiling_bytes: int, sharing: int = 1) -> None:
    """A study is resumed under the ceiling it was searched with, as under the same sequence length.

    Each trial's feasibility is stored with it against the ceiling of its run (the memory
    constraint that Optuna's samplers, ``best_trial`` and the dashboard read); under another
    ceiling, a config would be screened out as too big while ``best`` and ``export`` still named a
    bigger one, measured earlier, as the winner.

    Raises:
        AutotuneError: The study holds another ceiling.
    """
    stored = study.user_attrs.get(schema.STUDY_CEILING_BYTES)
    if stored is not None and stored != ceiling_bytes:
        raise AutotuneError(
            f"study {study.study_name!r} was searched under a memory ceiling of {format_bytes(stored * sharing)}, this run "
            f"asks {format_bytes(ceiling_bytes * sharing)}: its trials were judged against the first; pass that --memory-ceiling, "
            f"or a new --study-name for the new ceiling"
        )


def _wait_for_identity(study: optuna.Study, patience_s: float = 30.0) -> dict[str, Any] | None:
    """The identity of a study that another worker has just created and is setting up.

    ``None`` for a study made outside autotune (trials queued by hand but no setup mark), or one
    whose creator died before finishing: this worker sets it up then.
    """
    deadline = time.monotonic() + patience_s
    while (identity := study.user_attrs.get(schema.STUDY_IDENTITY)) is None and time.monotonic() < deadline:
        being_set_up = schema.STUDY_SETUP_BY in study._storage.get_study_system_attrs(study._study_id)
        if not being_set_up and study.get_trials(deepcopy=False):
            return None
        time.sleep(0.2)
    return identity


# What a study's trials must share with an estimate for their figures to calibrate it: what a step of a config
# trains and where (not the dataset, the fixed arguments or the loss's tokens, which the estimate's own options set).
CALIBRATION_KEYS = ("model", "task", "seq_len", "device", "peft", "trainer", "devices_per_trial")
CALIBRATION_REMEDY = (
    "give estimate the options that study was searched with (--peft, --trainer, --devices-per-trial), or leave out "
    "--storage to plan from the prior alone"
)


def calibration_study(storage: str, study_name: str | None, workload: Workload) -> optuna.Study:
    """The study whose measured trials calibrate ``autotune estimate --storage``, refusing one that trained
    another setup (:data:`CALIBRATION_KEYS`): its trials' peaks and speeds are not this plan's.

    Raises:
        AutotuneError: Naming each difference, and what to do instead.
    """
    study = load_study(storage, study_name)
    check_identity(study, workload_identity(workload), keys=CALIBRATION_KEYS, remedy=CALIBRATION_REMEDY)
    return study


def memory_fit_of_study(study: optuna.Study, model: ModelSpec, seq_len: int, prior: MemoryFit) -> MemoryFit:
    """The memory model fitted on a study's measured trials (``autotune estimate --storage``)."""
    return memory_fit_from_trials(model, seq_len, prior, measured_trials(study))


def speed_model_of_study(study: optuna.Study, model: ModelSpec, seq_len: int, speed: SpeedModel) -> SpeedModel:
    """The throughput prior calibrated on a study's measured trials (``autotune estimate --storage``)."""
    return calibrated_speed(model, seq_len, speed, ((trial.config, trial.result) for trial in measured_trials(study)))
