"""One plan for ``autotune search``, ``autotune estimate`` and the benchmarks: the options checked once
and turned into the workload every trial shares, its memory prior (built once) and the narrowed space.

``plan`` imports the layers it calls inside the function, so ``autotune.plan`` stays light enough for
the command line to declare its options from it.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError
from autotune.plan._checks import cpu_ranks_fit, seq_len_fits, worker_share
from autotune.plan._options import PlanOptions
from autotune.units import format_bytes

if TYPE_CHECKING:
    from autotune.estimate import MemoryFit
    from autotune.runner import Workload
    from autotune.space import SearchSpace
    from autotune.spec.devices import DeviceSpec
    from autotune.trainers import TrainerKind


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a search or an estimate works from, decided before anything runs.

    Attributes:
        workload: The model, device, sequence length, ceiling, data and measurement every trial
            shares; it holds the memory prior (:attr:`prior`).
        space: The levers and their choices, narrowed to what the device, model and data run and to
            what the prior says is worth searching.
        notes: What the user reads before anything runs: what the adapters and the space's filters
            changed, one line each.
        worker_devices: One entry per worker (``--gpus 0,1``: one per GPU; ``--workers N``: the CPU
            N times; with ``--devices-per-trial`` on CUDA, the first GPU of each worker's group);
            ``workload.device`` is the first.
        worker_rank_devices: CUDA with ``--devices-per-trial`` N > 1: each worker's N GPU numbers, in
            the order of ``worker_devices``; empty otherwise.
    """

    workload: Workload
    space: SearchSpace
    notes: tuple[str, ...] = ()
    worker_devices: tuple[DeviceSpec, ...] = ()
    worker_rank_devices: tuple[tuple[int, ...], ...] = ()

    @property
    def prior(self) -> MemoryFit:
        """The memory model's prior for the workload's device: the one the space was narrowed with,
        and the one an estimate predicts with and a search's screening, seeds and sampler start from."""
        return self.workload.memory_prior


def plan(options: PlanOptions, available_memory_bytes: int | None = None) -> Plan:
    """Check every option and build the plan; nothing runs a trial.

    Args:
        options: The command's options (:class:`PlanOptions`, or a command's own subclass).
        available_memory_bytes: Host memory available now (``None``: read now); each CPU child may
            grow its address space to its share of 90 % of it
            (:func:`autotune.runner.child_address_space_budget`), and it is the default host ceiling.

    Raises:
        AutotuneError: An option is malformed or contradicts another, the model or the space cannot
            be read, the data is unusable.
    """
    import psutil

    from autotune.estimate import smallest_peak_bytes
    from autotune.plan._base_args import load_base_args
    from autotune.result import run_length
    from autotune.runner import (
        Workload,
        allocator_settings,
        child_address_space_budget,
        load_callback,
        trial_memory_prior,
    )
    from autotune.space import DEFAULT_SPACES, default_space_path, load_space
    from autotune.spec.ceiling import host_ceiling_bytes, parse_ceiling, ranks_sharing
    from autotune.spec.measure import MeasureSettings
    from autotune.spec.measured_peaks import (
        load_measured_bandwidth,
        load_measured_inner_rates,
        load_measured_op_rates,
        load_measured_peaks,
    )
    from autotune.spec.models import resolve_model
    from autotune.spec.sft import resolve_loss_on
    from autotune.trainers import with_model

    options.check()
    available = psutil.virtual_memory().available if available_memory_bytes is None else available_memory_bytes
    groups = device_groups(options.worker_devices(), options.devices_per_trial)
    devices = [group[0] for group in groups]
    device = devices[0]
    # What each rank is judged against: a CPU trial's ranks share its RAM, so each gets its share.
    sharing = ranks_sharing(device.kind, options.devices_per_trial)
    ceiling = parse_ceiling(options.memory_ceiling, device.total_memory_bytes) // sharing
    model = resolve_model(options.model, options.task)
    seq_len_fits(options.seq_len, options.model, model)
    notes: list[str] = []
    trained_for = int(model.text_config.get("max_position_embeddings") or 0)
    if not model.max_positions and 0 < trained_for < options.seq_len:  # rotary: nothing stops it, so say it
        notes.append(
            f"--seq-len {options.seq_len:,} is beyond the {trained_for:,} positions {options.model}'s config declares: "
            f"its rotary positions run there, but the model was not trained so long (rope scaling is the model's "
            f"config, not a lever); memory and speed are predicted and measured as given"
        )
    if model.experts is not None:  # what its model TFLOPs and MFU count, said once
        experts = model.experts
        notes.append(
            f"{options.model} is a mixture of experts: a token passes through {experts.per_token} of {experts.experts} "
            f"experts, {model.active_params / 1e9:.3g}B of its {model.num_params / 1e9:.3g}B parameters; model TFLOPs and MFU count "
            f"those, memory all of them"
        )
    if options.devices_per_trial > 1:  # what a trial's figures are, said once (runner/_ranks.py sums its ranks')
        notes.append(
            f"--devices-per-trial {options.devices_per_trial}: a trial's samples/s, tokens/s and model TFLOPs are its "
            f"{options.devices_per_trial} ranks' together; MFU is per device, peak memory the largest rank's"
            + (
                f", judged against a rank's share of the memory ceiling: {format_bytes(ceiling)} ({sharing} ranks share "
                f"this machine's RAM, as the exported run's would)"
                if sharing > 1
                else ""
            )
        )
    if model.other_modality_params:  # a multimodal checkpoint: what is trained and counted, said once
        notes.append(
            f"{options.model} is multimodal: its vision or audio tower ({model.other_modality_params / 1e6:,.1f} M params) "
            f"is built, as the trainer builds it, and never run by text: its weights count in memory, not in "
            f"model TFLOPs, gradients or optimizer states"
        )
    kind, data, first_row = plan_trainer(options, model.task, notes)
    trainer = kind.name
    base_args = load_base_args(options.base_args, trainer) if options.base_args else {}
    model = with_model(model, kind, base_args)
    if options.peft is not None:  # frozen base, trainable adapters: what every trial trains
        from autotune.spec.peft import with_peft

        model = with_peft(model, options.peft, device, notes)
    run = run_length(base_args, options.epochs)  # --epochs against max_steps / num_train_epochs: one line
    loss_on = "all"
    if data is not None and kind.chooses_loss:  # --trainer sft
        loss_on = resolve_loss_on(options.loss_on, base_args, data, first_row)
    if options.space is None and model.task in DEFAULT_SPACES:
        notes.append(
            f"search space: {os.path.relpath(default_space_path(model.task))}, the default for a model trained as "
            f"{model.task} (--space to give another)"
        )
    for callback_name in options.callbacks:
        load_callback(callback_name)  # a wrong name fails here, once, not in every trial
    address_space = None
    if device.kind == "cpu":
        # Every rank is a process of its own under the budget (RLIMIT_AS applies per process).
        address_space = child_address_space_budget(ceiling, available // (len(devices) * options.devices_per_trial))
    allocator_env = allocator_settings()
    workload = Workload(
        model=model,
        device=device,
        seq_len=options.seq_len,
        ceiling_bytes=ceiling,
        memory_prior=trial_memory_prior(device, allocator_env, options.devices_per_trial),  # the one prior
        measure=MeasureSettings(warmup_steps=options.warmup_steps, max_steps=options.max_measure_steps),
        base_args=base_args,
        callbacks=options.callbacks,
        address_space_bytes=address_space,
        measured_peaks_tflops=load_measured_peaks(device.name),
        measured_bandwidth_gb_s=load_measured_bandwidth(device.name),
        measured_inner_tflops=load_measured_inner_rates(device.name),
        measured_op_rates=load_measured_op_rates(device.name),
        allocator_env=allocator_env,
        compile_timeout_s=options.compile_timeout,
        host_ceiling_bytes=host_ceiling_bytes(options.host_memory_ceiling, available, len(devices)),
        devices_per_trial=options.devices_per_trial,
        trainer=trainer,
        loss_on=loss_on,
        run_length=run,
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
        seq_len=options.seq_len,
        ceiling_bytes=ceiling,
        ranks=options.devices_per_trial,
        memory_fit=workload.memory_prior,
        trainer=trainer,
    )
    notes += space.notes
    if data is not None:  # --trainer sft or dpo: the rows as they are, for TRL to prepare in every trial
        from autotune.spec.dataset import prepare_sft_rows

        assert options.dataset is not None  # plan_trainer: a trainer that prepares rows has them
        dataset = prepare_sft_rows(
            options.dataset,
            model,
            data,
            loss_on,
            space.largest_global_batch,
            options.warmup_steps + options.max_measure_steps,
            os.path.join(options.work_dir, "datasets"),
            notes,
            options.seq_len,
            kind,
        )
        workload = dataclasses.replace(workload, dataset=dataset)
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
        workload = dataclasses.replace(workload, dataset=dataset)
    if address_space is not None and len(devices) > 1:
        smallest = smallest_peak_bytes(model, space.choices, options.seq_len, workload.memory_prior)
        worker_share(len(devices), address_space, smallest)
    return Plan(
        workload=workload,
        space=space,
        notes=tuple(notes),
        worker_devices=tuple(devices),
        worker_rank_devices=rank_device_numbers(groups),
    )


def plan_trainer(options: PlanOptions, task: str, notes: list[str]) -> tuple[TrainerKind, str | None, dict[str, Any]]:
    """The study's trainer (``--trainer``, else chosen from the ``--dataset`` rows' columns:
    ``autotune.trainers.choose``), the rows' SFT format (``None`` under a trainer that does not prepare
    the rows itself) and the first row (``autotune.spec.sft``), with a note saying which trainer trains.

    Raises:
        AutotuneError: ``--trainer sft`` where it cannot train (no rows it reads, not a causal LM,
            the Trainer's ``--packing`` or ``--text-column``, TRL not installed), or ``--loss-on``
            under the Trainer.
    """
    from autotune.spec.dataset_files import peek_rows
    from autotune.trainers import choose

    columns, first_row = peek_rows(options.dataset) if options.dataset is not None else (None, {})
    kind = choose(options.trainer, columns)
    if not kind.chooses_loss and options.loss_on is not None:
        raise AutotuneError(
            f"--loss-on chooses SFTTrainer's loss, and this study trains with {kind.words} (columns: "
            f"{', '.join(columns or ['synthetic tokens'])}): drop --loss-on, or add --trainer sft"
        )
    kind.check_workload(task, options.packing, options.text_column)
    data = kind.rows_format(columns or []) if kind.prepares_rows else None
    if (note := kind.plan_note(bool(options.trainer), data)) is not None:
        notes.append(note)
    return kind, data, first_row


def device_groups(devices: list[DeviceSpec], devices_per_trial: int) -> list[list[DeviceSpec]]:
    """The devices of each worker's trials: on CUDA, ``--gpus`` cut into groups of
    ``--devices-per-trial`` GPUs in the order given (``--gpus 0,1,2,3,4,5,6,7 --devices-per-trial 4``:
    two workers, each training 4-GPU trials); on the CPU every worker's ranks share the cores.

    Raises:
        AutotuneError: The GPUs do not split into whole groups; more CPU ranks than cores.
    """
    if devices[0].kind == "cpu":
        from autotune.spec.devices import usable_cores

        cpu_ranks_fit(devices_per_trial, usable_cores())
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
