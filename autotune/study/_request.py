"""What to search, and how the command line's options become it: checked once, before any trial.

:func:`prepare_request` turns :class:`SearchOptions` (the ``search`` command's options as typed,
with their defaults: :mod:`autotune.plan._options`) into a :class:`SearchRequest` and its
:class:`SearchBudget`: the model and device resolved, the space loaded and filtered, the user's
data prepared, the calibrated peaks read, the CPU address-space budget of each child set.
Every problem is an :class:`AutotuneError` here, so no trial is spent on a bad option.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.estimate import smallest_peak_bytes
from autotune.levers import TrialConfig
from autotune.plan import SearchOptions, seq_len_fits, worker_share
from autotune.result import TrialResult
from autotune.runner import Workload, child_address_space_budget, load_callback, trial_memory_prior
from autotune.space import SearchSpace, default_space_path, load_space
from autotune.spec.ceiling import host_ceiling_bytes, parse_ceiling
from autotune.spec.devices import DeviceSpec, resolve_device
from autotune.spec.measure import MeasureSettings
from autotune.spec.sft import (
    TRAINER_WORDS,
    check_sft_workload,
    choose_trainer,
    data_format,
    for_trainer,
    resolve_loss_on,
)
from autotune.study._screening import refuse_if_nothing_fits


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """What to search: the workload every trial trains, the space, and how trials are run.

    Attributes:
        workload: The model, device, sequence length, ceiling and measurement every trial shares.
        space: The knobs and their choices.
        worker_devices: One entry per worker (``--gpus 0,1``: one per GPU; ``--workers N``: the CPU
            N times; with ``--devices-per-trial`` on CUDA, the first GPU of each worker's group);
            ``workload.device`` is the first.
        worker_rank_devices: CUDA with ``--devices-per-trial`` N > 1: each worker's N GPU numbers
            (``Workload.rank_devices``), in the order of ``worker_devices``; empty otherwise.
        trial_timeout_s: Wall-clock limit of one trial attempt.
        work_root: Where trials keep their logs (one directory per trial).
        screen: Skip configs the estimator or a measured OOM says cannot fit (:mod:`._screening`).
        prune_ratio: Stop a trial once its throughput is below this fraction of the best feasible
            one; 0 never.
    """

    workload: Workload
    space: SearchSpace
    worker_devices: tuple[DeviceSpec, ...] = ()
    worker_rank_devices: tuple[tuple[int, ...], ...] = ()
    trial_timeout_s: float = SearchOptions.trial_timeout
    work_root: str = SearchOptions.work_dir
    screen: bool = SearchOptions.screen
    prune_ratio: float = SearchOptions.prune_ratio

    @property
    def ceiling_bytes(self) -> int:
        return self.workload.ceiling_bytes

    def identity(self) -> dict[str, Any]:
        """What must match for trials to be comparable in one study."""
        workload = self.workload
        return {
            "model": workload.model.name,
            "task": workload.model.task,
            "seq_len": workload.seq_len,
            "device": workload.device.name,
            # Real data and fixed arguments change what a step costs (and what export writes).
            "dataset": workload.dataset.label if workload.dataset else "synthetic tokens",
            "base_args": workload.base_args,
            "peft": workload.model.peft.identity() if workload.model.peft else None,
            # Only under SFTTrainer, so studies of the Trainer written before the option resume unchanged.
            **({"trainer": workload.trainer, "loss_on": workload.loss_on} if workload.trainer != "trainer" else {}),
            # Only where it is not 1, so studies written before the option resume unchanged.
            **({"devices_per_trial": workload.devices_per_trial} if workload.devices_per_trial > 1 else {}),
        }

    def for_device(self, device: DeviceSpec, rank_devices: tuple[int, ...] = ()) -> SearchRequest:
        """This request for one worker: the same search, trained on ``device`` (and, for a
        multi-rank trial on CUDA, on the GPUs ``rank_devices``)."""
        workload = dataclasses.replace(self.workload, device=device, rank_devices=rank_devices)
        return dataclasses.replace(self, workload=workload)

    def worker_requests(self) -> list[SearchRequest]:
        """One request per worker, each on its own device (or device group)."""
        if not self.worker_devices:
            return [self]
        groups = self.worker_rank_devices or ((),) * len(self.worker_devices)
        return [self.for_device(device, group) for device, group in zip(self.worker_devices, groups)]


@dataclasses.dataclass(frozen=True)
class SearchBudget:
    """When a search stops starting trials, and what it re-measures at the end.

    Attributes:
        trials: Trials this invocation starts at most, over all its workers (``None``: no limit).
        timeout_s: No trial starts after this many seconds.
        max_total_trials: The study-wide cap, over every worker of every process.
        patience: Stop once this many trials in a row did not raise the best feasible model TFLOPs
            by more than the measured noise (``None``: never).
        confirm_top: Leading configs :func:`autotune.study.search` re-measures at the end (0: none).
        confirm_repeats: Re-runs of each of them (:mod:`._confirm`).
    """

    trials: int | None = None
    timeout_s: float | None = None
    max_total_trials: int | None = None
    patience: int | None = None
    confirm_top: int = SearchOptions.confirm_top
    confirm_repeats: int = SearchOptions.confirm_repeats


@dataclasses.dataclass(frozen=True)
class PreparedSearch:
    """A checked request, with the notes the user should read before the first trial (what the
    space filtered out, what MFU is measured against), and the budget the options gave."""

    request: SearchRequest
    notes: tuple[str, ...]
    budget: SearchBudget = SearchBudget()


@dataclasses.dataclass
class SearchProgress:
    """Callbacks the CLI gives to watch a search. All optional; called from worker threads."""

    on_trial_start: Callable[[int, TrialConfig], None] | None = None
    on_trial_end: Callable[[int, TrialConfig, TrialResult], None] | None = None


def prepare_request(options: SearchOptions, available_memory_bytes: int) -> PreparedSearch:
    """Check every option and build the request; nothing runs a trial yet.

    Args:
        options: The command's options.
        available_memory_bytes: Host memory available now; each CPU child may grow its address
            space to its share of 90 % of it (:func:`autotune.runner.child_address_space_budget`).

    Raises:
        AutotuneError: An option is malformed or contradicts another, the model or the space cannot
            be read, the data is unusable.
    """
    from autotune.plan import load_base_args
    from autotune.runner import trial_overrides_note
    from autotune.spec.measured_peaks import load_measured_peaks, peak_note
    from autotune.spec.models import resolve_model

    if not 0 <= options.prune_ratio < 1:
        raise AutotuneError(
            f"--prune-ratio {options.prune_ratio}: give a fraction from 0 (never prune) up to, not including, 1"
        )
    devices = worker_devices(options.device, options.gpu, options.gpus, options.workers)
    groups = device_groups(devices, options.devices_per_trial)
    devices = [group[0] for group in groups]
    device = devices[0]
    ceiling = parse_ceiling(options.memory_ceiling, device.total_memory_bytes)
    model = resolve_model(options.model, options.task)
    seq_len_fits(options.seq_len, options.model, model.max_positions)
    peft_notes: list[str] = []
    trainer, data, first_row = study_trainer(options, model.task, peft_notes)
    model = for_trainer(model, trainer)
    if options.peft is not None:
        from autotune.spec.peft import with_peft

        model = with_peft(model, options.peft, device, peft_notes)
    base_args = load_base_args(options.base_args, trainer) if options.base_args else {}
    loss_on = resolve_loss_on(options.loss_on, base_args, data, first_row) if trainer == "sft" else "all"
    if trainer == "sft" and options.space is None:
        peft_notes.append(
            f"search space: {os.path.relpath(default_space_path(trainer))}, the default for a decoder LLM under "
            "TRL's SFTTrainer (--space to give another)"
        )
    space = load_space(
        options.space,
        device,
        model=model,
        base_args=base_args,
        global_batch=options.global_batch,
        max_global_batch=options.max_global_batch,
        real_data=options.dataset is not None,
        packing=options.packing,
        # The workload's memory prior (Workload.memory_prior reads the same allocator variables).
        seq_len=options.seq_len,
        ceiling_bytes=ceiling,
        ranks=options.devices_per_trial,
        memory_fit=trial_memory_prior(device, os.environ, options.devices_per_trial),
        trainer=trainer,
    )
    for callback_name in options.callbacks:
        load_callback(callback_name)  # a wrong name fails here, once, not in every trial
    notes = [*peft_notes, *space.notes]
    if (overridden := trial_overrides_note(base_args)) is not None:
        notes.append(overridden)
    dataset = None
    if trainer == "sft":
        from autotune.spec.dataset import prepare_sft_rows

        assert options.dataset is not None and data is not None  # study_trainer: sft needs rows
        dataset = prepare_sft_rows(
            options.dataset,
            model,
            data,
            loss_on,
            space.largest_global_batch,
            options.warmup_steps + options.max_measure_steps,
            os.path.join(options.work_dir, "datasets"),
            notes,
        )
    elif options.dataset is not None:
        from autotune.spec.dataset import prepare_dataset

        dataset = prepare_dataset(
            options.dataset,
            model,
            options.seq_len,
            space.largest_global_batch,
            options.warmup_steps + options.max_measure_steps,
            os.path.join(options.work_dir, "datasets"),
            options.text_column,
            options.packing,
        )
    measured_peaks = load_measured_peaks(device.name)
    notes.append(peak_note(device, measured_peaks))
    address_space = None
    if device.kind == "cpu":
        # Every rank is a process of its own under the budget (RLIMIT_AS applies per process).
        address_space = child_address_space_budget(
            ceiling, available_memory_bytes // (len(devices) * options.devices_per_trial)
        )
    workload = Workload(
        model=model,
        device=device,
        seq_len=options.seq_len,
        ceiling_bytes=ceiling,
        measure=MeasureSettings(warmup_steps=options.warmup_steps, max_steps=options.max_measure_steps),
        base_args=base_args,
        dataset=dataset,
        callbacks=options.callbacks,
        address_space_bytes=address_space,
        measured_peaks_tflops=measured_peaks,
        compile_timeout_s=options.compile_timeout,
        host_ceiling_bytes=host_ceiling_bytes(options.host_memory_ceiling, available_memory_bytes),
        devices_per_trial=options.devices_per_trial,
        trainer=trainer,
        loss_on=loss_on,
    )
    if address_space is not None:
        smallest = smallest_peak_bytes(model, space.choices, options.seq_len, workload.memory_prior)
        worker_share(len(devices), address_space, smallest)
    if options.screen:
        refuse_if_nothing_fits(space.choices, workload)  # no trial spent proving it
    request = SearchRequest(
        workload=workload,
        space=space,
        worker_devices=tuple(devices),
        worker_rank_devices=rank_device_numbers(groups),
        trial_timeout_s=options.trial_timeout,
        work_root=options.work_dir,
        screen=options.screen,
        prune_ratio=options.prune_ratio,
    )
    budget = SearchBudget(
        options.trials,
        options.timeout,
        options.max_total_trials,
        options.patience,
        options.confirm_top,
        options.confirm_repeats,
    )
    return PreparedSearch(request=request, notes=tuple(notes), budget=budget)


def study_trainer(options: SearchOptions, task: str, notes: list[str]) -> tuple[str, str | None, dict[str, Any]]:
    """The study's trainer (``--trainer``, else chosen from the ``--dataset`` rows' columns), the rows'
    SFT format and the first row (``autotune.spec.sft``), with a note saying which trainer trains.

    Raises:
        AutotuneError: ``--trainer sft`` where it cannot train (no rows it reads, not a causal LM,
            the Trainer's ``--packing`` or ``--text-column``, TRL not installed), or ``--loss-on``
            under the Trainer.
    """
    import importlib.util

    from autotune.spec.dataset import peek_rows

    columns, first_row = peek_rows(options.dataset) if options.dataset is not None else (None, {})
    trainer = choose_trainer(options.trainer, columns)
    if trainer != "sft":
        if options.loss_on is not None:
            raise AutotuneError(
                f"--loss-on chooses SFTTrainer's loss, and this study trains with the Trainer (columns: "
                f"{', '.join(columns or ['synthetic tokens'])}): add --trainer sft"
            )
        return trainer, None, first_row
    if importlib.util.find_spec("trl") is None:
        raise AutotuneError("--trainer sft trains through TRL's SFTTrainer: pip install 'autotune[sft]'")
    check_sft_workload(task, options.packing, options.text_column)
    data = data_format(columns or [])
    how = "--trainer sft" if options.trainer else f"the --dataset holds {data} rows; --trainer trainer for the Trainer"
    notes.append(f"trainer: {TRAINER_WORDS[trainer]} on your rows, TRL preparing them in every trial ({how})")
    return trainer, data, first_row


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
        raise AutotuneError(
            f"--gpus {gpus!r}: give distinct CUDA device numbers separated by commas, e.g. --gpus 0,1,2,3"
        )
    specs = [resolve_device(None, int(part)) for part in numbers]
    kinds = {(spec.name, spec.total_memory_bytes) for spec in specs}
    if len(kinds) > 1:
        found = ", ".join(f"{spec.label} is {spec.name}" for spec in specs)
        raise AutotuneError(
            f"--gpus {gpus}: {found}; one study measures one kind of GPU: run one search per kind (--gpus with the same model)"
        )
    return specs


def device_groups(devices: list[DeviceSpec], devices_per_trial: int) -> list[list[DeviceSpec]]:
    """The devices of each worker's trials: on CUDA, ``--gpus`` cut into groups of
    ``--devices-per-trial`` GPUs in the order given (``--gpus 0,1,2,3,4,5,6,7 --devices-per-trial 4``:
    two workers, each training 4-GPU trials); on the CPU every worker's ranks share the cores.

    Raises:
        AutotuneError: The GPUs do not split into whole groups.
    """
    if devices_per_trial == 1 or devices[0].kind == "cpu":
        return [[device] for device in devices]
    if len(devices) % devices_per_trial:
        raise AutotuneError(
            f"--devices-per-trial {devices_per_trial}: {len(devices)} GPU(s) do not split into trials of {devices_per_trial}; "
            f"give --gpus a multiple of {devices_per_trial} devices"
        )
    return [devices[i : i + devices_per_trial] for i in range(0, len(devices), devices_per_trial)]


def rank_device_numbers(groups: list[list[DeviceSpec]]) -> tuple[tuple[int, ...], ...]:
    """Each worker's GPU numbers where its trials span several GPUs; empty otherwise."""
    if groups[0][0].kind != "cuda" or len(groups[0]) == 1:
        return ()
    return tuple(tuple(device.index or 0 for device in group) for group in groups)


def default_study_name(model_name: str, device: DeviceSpec, seq_len: int) -> str:
    """``<model>-<device>-s<seq len>``: rerunning ``search`` with the same three resumes the same study."""
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_name).name if os.path.isdir(model_name) else model_name)
    return f"{model}-{device.label.replace(':', '')}-s{seq_len}"
