"""The options of the commands that plan, with their defaults and their checks: the one place they are written.

:class:`PlanOptions` holds what a plan is built from (``autotune.plan.plan``: the model, the devices,
the space, the workload every trial shares); ``autotune search`` adds its loop and budget
(:class:`SearchOptions`), ``autotune estimate`` what it prints and where it plans
(:class:`EstimateOptions`). The commands' Typer declarations take their defaults from these classes,
and each class checks its own options (:meth:`PlanOptions.check`), each check naming its option, so a
default or a rule cannot differ between the command line and what runs. A foundation: it imports
nothing heavy, so ``autotune --help`` stays quick.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError
from autotune.plan._checks import (
    dataset_options,
    one_of,
    run_options,
    trainer_options,
    within,
)
from autotune.spec.measure import MeasureSettings

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """What a plan is built from: the options ``autotune search`` and ``autotune estimate`` share
    (see ``autotune search --help``); ``estimate`` leaves the workload's measurement at its defaults."""

    model: str
    gpu: int | None = None
    device: str | None = None
    gpus: str | None = None
    workers: int = 1
    # Ranks (processes, one device each on CUDA) that one trial spans, launched by torch's launcher.
    devices_per_trial: int = 1
    seq_len: int = 128
    memory_ceiling: str = "0.9"
    # Host RAM a trial may use (ZeRO offload moves optimizer states there): a fraction of the RAM
    # available when the search starts, or a size; None: all of it.
    host_memory_ceiling: str | None = None
    space: str | None = None
    task: str | None = None
    # torch.compile trials: seconds to compile (until the first optimizer step ends), then trial_timeout.
    compile_timeout: float = 1800.0
    warmup_steps: int = MeasureSettings.warmup_steps
    max_measure_steps: int = 40
    work_dir: str = "autotune_runs"
    callbacks: tuple[str, ...] = ()
    dataset: str | None = None
    text_column: str | None = None
    packing: bool = False
    # --trainer: trainer or sft (TRL's SFTTrainer); None: sft for chat / prompt-completion rows (autotune.trainers.choose).
    trainer: str | None = None
    loss_on: str | None = None  # --trainer sft: all, completion or assistant; None: TRL's default for the rows
    base_args: str | None = None
    peft: str | None = None  # lora, qlora, or an adapter config file (autotune.spec.peft)
    global_batch: int | None = None
    max_global_batch: int | None = None
    # The user's whole run (autotune.result.run_length): its epochs, and the price of a device-hour.
    epochs: float | None = None
    price_per_hour: float | None = None

    def check(self) -> None:
        """The checks of single values that need nothing loaded, so a wrong option is answered at once
        (``autotune.plan.plan`` checks the rest against what it loads: the model, the devices, the space).

        Raises:
            AutotuneError: One line naming the option.
        """
        for option, value in (
            ("--gpu", self.gpu),
            ("--seq-len", self.seq_len),
            ("--max-measure-steps", self.max_measure_steps),
            ("--devices-per-trial", self.devices_per_trial),
            ("--workers", self.workers),
            ("--global-batch", self.global_batch),
            ("--max-global-batch", self.max_global_batch),
            ("--compile-timeout", self.compile_timeout),
        ):
            within(option, value)
        run_options(self.epochs, self.price_per_hour)
        one_of(("--global-batch", self.global_batch), ("--max-global-batch", self.max_global_batch))
        within("--warmup-steps", self.warmup_steps)
        dataset_options(self.dataset, self.text_column, self.packing)
        trainer_options(self.trainer, self.loss_on)

    def worker_devices(self) -> list[DeviceSpec]:
        """The device of each worker: ``--gpus 0,1`` gives one worker per GPU, ``--workers N`` N on the CPU.

        Raises:
            AutotuneError: Options that contradict each other, a malformed list, GPUs of different kinds.
        """
        from autotune.spec.devices import resolve_device

        if self.gpus is None:
            spec = resolve_device(self.device, self.gpu)
            if self.workers > 1 and spec.kind != "cpu":
                raise AutotuneError(
                    "--workers runs several trials on one device, which only the CPU allows; for GPUs use --gpus 0,1,... (one trial per GPU)"
                )
            return [spec] * self.workers
        if self.device is not None or self.gpu is not None or self.workers != 1:
            raise AutotuneError("--gpus gives one worker per GPU: leave out --gpu, --device and --workers")
        numbers = [part.strip() for part in self.gpus.split(",")]
        if not all(part.isdigit() for part in numbers) or len(set(numbers)) != len(numbers):
            raise AutotuneError(
                f"--gpus {self.gpus!r}: give distinct CUDA device numbers separated by commas, e.g. --gpus 0,1,2,3"
            )
        specs = [resolve_device(None, int(part)) for part in numbers]
        kinds = {(spec.name, spec.total_memory_bytes) for spec in specs}
        if len(kinds) > 1:
            found = ", ".join(f"{spec.label} is {spec.name}" for spec in specs)
            raise AutotuneError(
                f"--gpus {self.gpus}: {found}; one study measures one kind of GPU: run one search per kind (--gpus with the same model)"
            )
        return specs


@dataclasses.dataclass(frozen=True)
class SearchOptions(PlanOptions):
    """The ``search`` command's options, as the user typed them (see ``autotune search --help``): the
    plan's, then how trials are run and when the search stops."""

    trial_timeout: float = 900.0
    prune_ratio: float = 0.5
    screen: bool = True
    # When the search stops starting trials, and how the leaders are confirmed at the end.
    trials: int = 20
    timeout: float | None = None
    max_total_trials: int | None = None
    patience: int | None = None
    confirm_top: int = 3
    confirm_repeats: int = 3
    # No re-run after the confirmation's first round starts that would take its re-runs past this
    # share of the search's time before it (autotune.study._confirm).
    confirm_budget: float = 0.25

    def check(self) -> None:
        """The plan's checks, then the search's own (each names its option).

        Raises:
            AutotuneError: One line naming the option.
        """
        super().check()
        for option, value in (
            ("--trials", self.trials),
            ("--max-total-trials", self.max_total_trials),
            ("--patience", self.patience),
            ("--trial-timeout", self.trial_timeout),
            ("--timeout", self.timeout),
            ("--prune-ratio", self.prune_ratio),
            ("--confirm-top", self.confirm_top),
            # Checked with --confirm-top 0 too: never ignored.
            ("--confirm-repeats", self.confirm_repeats),
            ("--confirm-budget", self.confirm_budget),
        ):
            within(option, value)

    @classmethod
    def from_command(cls, values: Mapping[str, Any]) -> SearchOptions:
        """The options out of the command's parameters by name (``locals()`` of ``cli.search``).

        Parameters that are not search options (``--storage``, ``--study-name``) are left out;
        the repeatable ``--callback`` arrives as a list (or ``None``) and is kept as a tuple.
        """
        fields = {field.name: values[field.name] for field in dataclasses.fields(cls)}
        return cls(**{**fields, "callbacks": tuple(fields["callbacks"] or ())})


@dataclasses.dataclass(frozen=True)
class EstimateOptions(PlanOptions):
    """The ``estimate`` command's options: the plan's (those it declares), where it plans, what it prints.

    Attributes:
        gpu_type: Plan for a GPU of this kind (``autotune devices --known``) instead of one here.
        storage: Calibrate the prior on the measured trials of a study in this storage.
        study_name: That study (default: the only one in the storage).
        all_rows: Every memory-distinct config, by part (``--all``).
        as_json: Every row as JSON (``--json``).
    """

    gpu_type: str | None = None
    storage: str | None = None
    study_name: str | None = None
    all_rows: bool = False
    as_json: bool = False

    def check(self) -> None:
        """The plan's checks, then the estimate's own (each names its option).

        Raises:
            AutotuneError: One line naming the option.
        """
        super().check()
        if self.gpu_type is not None and (self.gpu is not None or self.device is not None or self.storage is not None):
            raise AutotuneError(
                "--gpu-type plans for a GPU you do not have: give it without --gpu, --device or --storage"
            )
        one_of(("--all", self.all_rows or None), ("--json", self.as_json or None))
        if self.study_name is not None and self.storage is None:
            raise AutotuneError(
                "--study-name names the study to calibrate on: give its --storage too (estimate reads none unless told)"
            )

    def worker_devices(self) -> list[DeviceSpec]:
        """The GPUs ``--gpu-type`` names, from the datasheet table (no GPU needed), as many as one trial spans
        (``--devices-per-trial``), else this machine's devices."""
        if self.gpu_type is None:
            return super().worker_devices()
        from autotune.spec.devices import known_gpu

        planned = known_gpu(self.gpu_type).device()
        return [dataclasses.replace(planned, index=index) for index in range(self.devices_per_trial)]


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    """The ``verify`` command's options: which study, where to measure again, how often, what is allowed.

    Attributes:
        storage: The storage the study lives in.
        study_name: The study (default: the only one in the storage).
        device: Measure on this device (``cpu``, ``cuda:N``) instead of the one the search used.
        gpu: Measure on this CUDA device instead of the one the search used.
        repeats: Re-runs of the winner and of the trainer's default each, interleaved.
        tolerance: The slowdown (and memory growth) allowed, as a fraction of the recorded figure,
            instead of the study's measured noise; ``None``: the noise decides.
        callbacks: ``--callback`` classes the re-runs add (never the search's: what it measured with
            them is compared with what today measures without).
        profile: After the re-runs, one profiled run of each (``autotune.runner._step_profile``), not judged.
    """

    storage: str
    study_name: str | None = None
    device: str | None = None
    gpu: int | None = None
    repeats: int = 3
    tolerance: float | None = None
    callbacks: tuple[str, ...] = ()
    profile: bool = False

    def check(self) -> None:
        """Each option's own check (the study, and the device by the plan, are read later).

        Raises:
            AutotuneError: One line naming the option.
        """
        within("--repeats", self.repeats)
        within("--tolerance", self.tolerance)
        within("--gpu", self.gpu)
