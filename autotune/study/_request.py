"""What to search, and how the command line's options become it: checked once, before any trial.

:func:`prepare_request` turns :class:`SearchOptions` (the ``search`` command's options as typed,
with their defaults: :mod:`autotune.plan._options`) into a :class:`SearchRequest` and its
:class:`SearchBudget`, through the one plan (:func:`autotune.plan.plan`: the model and devices
resolved, the space loaded and narrowed, the user's data prepared, the calibrated peaks read, the
CPU address-space budget of each child set), refusing a space where nothing is predicted to fit.
Every problem is an :class:`AutotuneError` here, so no trial is spent on a bad option.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.levers import TrialConfig
from autotune.plan import SearchOptions, plan
from autotune.result import TrialResult
from autotune.runner import Workload
from autotune.space import SearchSpace
from autotune.spec.devices import DeviceSpec
from autotune.study._screening import refuse_if_nothing_fits
from autotune.trainers import identity_entries


@dataclasses.dataclass(frozen=True)
class SearchRequest:
    """What to search: the workload every trial trains, the space, and how trials are run.

    Attributes:
        workload: The model, device, sequence length, ceiling and measurement every trial shares.
        space: The levers and their choices.
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
        options: The ``search`` options it was prepared from (:func:`prepare_request`), which the
            study records so ``autotune verify`` can measure the same workload again; ``None`` for a
            request made outside the command line (tests, benchmarks): nothing is recorded then.
    """

    workload: Workload
    space: SearchSpace
    worker_devices: tuple[DeviceSpec, ...] = ()
    worker_rank_devices: tuple[tuple[int, ...], ...] = ()
    trial_timeout_s: float = SearchOptions.trial_timeout
    work_root: str = SearchOptions.work_dir
    screen: bool = SearchOptions.screen
    prune_ratio: float = SearchOptions.prune_ratio
    options: SearchOptions | None = None

    @property
    def ceiling_bytes(self) -> int:
        return self.workload.ceiling_bytes

    def identity(self) -> dict[str, Any]:
        """What must match for trials to be comparable in one study."""
        return workload_identity(self.workload)

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
        confirm_repeats: Re-runs of each of them at most (:mod:`._confirm`).
        confirm_budget: No re-run after the confirmation's first round starts that would take its
            re-runs past this share of the search's time before it (:mod:`._confirm`).
    """

    trials: int | None = None
    timeout_s: float | None = None
    max_total_trials: int | None = None
    patience: int | None = None
    confirm_top: int = SearchOptions.confirm_top
    confirm_repeats: int = SearchOptions.confirm_repeats
    confirm_budget: float = SearchOptions.confirm_budget


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
    """Check every option and build the request from the one plan (:func:`autotune.plan.plan`); nothing
    runs a trial yet.

    Args:
        options: The command's options.
        available_memory_bytes: Host memory available now; each CPU child may grow its address
            space to its share of 90 % of it (:func:`autotune.runner.child_address_space_budget`).

    Raises:
        AutotuneError: An option is malformed or contradicts another, ``--work-dir`` is no directory
            autotune can write in, the model or the space cannot be read, the data is unusable, or (with
            screening) nothing in the space is predicted to fit.
    """
    from autotune.runner import trial_overrides_note
    from autotune.spec.files import writable_directory
    from autotune.spec.measured_peaks import peak_note

    writable_directory(options.work_dir, "--work-dir")  # before the data is prepared there, or a trial starts
    planned = plan(options, available_memory_bytes)
    workload = planned.workload
    notes = list(planned.notes)
    if (overridden := trial_overrides_note(workload.base_args)) is not None:
        notes.append(overridden)
    notes.append(peak_note(workload.device, workload.measured_peaks_tflops))
    if options.screen:
        refuse_if_nothing_fits(planned.space.choices, workload)  # no trial spent proving it
    request = SearchRequest(
        workload=workload,
        space=planned.space,
        worker_devices=planned.worker_devices,
        worker_rank_devices=planned.worker_rank_devices,
        trial_timeout_s=options.trial_timeout,
        work_root=options.work_dir,
        screen=options.screen,
        prune_ratio=options.prune_ratio,
        options=options,
    )
    budget = SearchBudget(
        options.trials,
        options.timeout,
        options.max_total_trials,
        options.patience,
        options.confirm_top,
        options.confirm_repeats,
        options.confirm_budget,
    )
    return PreparedSearch(request=request, notes=tuple(notes), budget=budget)


def default_study_name(model_name: str, device: DeviceSpec, seq_len: int) -> str:
    """``<model>-<device>-s<seq len>``: rerunning ``search`` with the same three resumes the same study."""
    model = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model_name).name if os.path.isdir(model_name) else model_name)
    return f"{model}-{device.label.replace(':', '')}-s{seq_len}"


def workload_identity(workload: Workload) -> dict[str, Any]:
    """What must match for trials to be comparable in one study (stored with it: ``SearchRequest.identity``)."""
    return {
        "model": workload.model.name,
        "task": workload.model.task,
        "seq_len": workload.seq_len,
        "device": workload.device.name,
        # Real data and fixed arguments change what a step costs (and what export writes).
        "dataset": workload.dataset.label if workload.dataset else "synthetic tokens",
        "base_args": workload.base_args,
        "peft": workload.model.peft.identity() if workload.model.peft else None,
        # Not under the default trainer, so studies of the Trainer written before the option resume unchanged.
        **identity_entries(workload.trainer, workload.loss_on),
        # Only where it is not 1, so studies written before the option resume unchanged.
        **({"devices_per_trial": workload.devices_per_trial} if workload.devices_per_trial > 1 else {}),
    }
