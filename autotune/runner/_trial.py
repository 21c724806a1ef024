"""The body of a trial: build the model, train through the real Trainer, measure.

Imported by the forkserver before any child starts, so torch and transformers are loaded once.
Nothing here touches CUDA at import time. The trial's levers act through their hooks (the model
build, the batches, the trainer and its arguments: ``autotune.levers``); nothing here names a lever.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import Trainer, TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from autotune.levers import (
    Batching,
    TrainerParts,
    compile_environment,
    memory_traits,
    model_build_kwargs,
    trainer_parts,
    training_arguments_kwargs,
    trial_batching,
    with_levers_off_explicit,
)
from autotune.result import (
    TrialResult,
    skipped_among,
    trained_fraction,
)
from autotune.runner._callbacks import load_callback
from autotune.runner._job import TrialJob
from autotune.runner._limits import allocator_read_back, allocator_settings, limit_address_space
from autotune.runner._loader import SyntheticTokens, load_training_dataset
from autotune.runner._loss_recorder import LossRecorder, weights_are_finite
from autotune.runner._measured import MeasuredSteps
from autotune.runner._memory_probe import MemoryProbe, memory_probe
from autotune.runner._precision import (
    AutocastRecorder,
    accelerator_autocast_dtype,
    align_legacy_tf32,
    cuda_matmul_precision,
)
from autotune.runner._sample_lengths import SampleLengths
from autotune.runner._side_effects import trial_overrides
from autotune.runner._step_profile import StepProfiler
from autotune.runner._step_timer import StepTimer, dynamo_compile_seconds
from autotune.spec.measure import clearly_slower
from autotune.spec.models import build_model
from autotune.spec.peft import apply_peft, lora_config
from autotune.trainers import TrialInputs, class_named
from autotune.trainers import get as trainer_named


def harness_arguments(job: TrialJob, batching: Batching) -> dict[str, Any]:
    """TrainingArguments that only the measurement needs, and those that keep the trial's effects
    inside its process and work dir (``_side_effects.trial_overrides``: no upload, no reporting, no
    checkpoint, no evaluation); never exported."""
    return dict(
        include_num_input_tokens_seen=tokens_counted(job, batching),
        output_dir=job.work_dir,
        max_steps=job.workload.measure.total_steps_cap,
        logging_strategy="no",
        disable_tqdm=True,
        seed=0,
        **trial_overrides(job.workload.base_args),
    )


def build_dataset(job: TrialJob, batching: Batching) -> torch.utils.data.Dataset:
    workload = job.workload
    if workload.dataset is not None:
        samples = load_training_dataset(workload.dataset, workload.model, workload.seq_len, batching.pads_samples)
        return batching.prepare(samples)
    length = job.config.global_batch * (workload.measure.total_steps_cap + 1)
    return SyntheticTokens(workload.model.vocab_size, workload.seq_len, workload.model.task, length)


class StepSignal(TrainerCallback):
    """Calls ``on_step(compile seconds so far)`` when each optimizer step ends: the parent's compile budget
    ends at the first (torch.compile has compiled the forward and backward by then), and the steps' pace
    tells a trial too slow for its timeout from a hung one (``runner._deadlines``)."""

    def __init__(self, on_step: Callable[[float], None]) -> None:
        self._on_step = on_step

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        self._on_step(dynamo_compile_seconds())
        return control


def train_and_measure(
    job: TrialJob,
    on_step: Callable[[float], None] | None = None,
    on_measured: Callable[[dict[str, Any]], None] | None = None,
) -> TrialResult:
    """Train ``job.config`` until the step time is steady and return what was measured.

    Args:
        job: The trial.
        on_step: Called when each optimizer step ends (:class:`StepSignal`).
        on_measured: Called with what the timed steps measured (a result's dict, their peaks, the weights
            not checked) before the step on the fullest batch (:func:`worst_case_peaks`): a timeout that
            ends that step keeps the measurement (``runner._pool``).
    """
    workload = job.workload
    started = time.perf_counter()
    probe = memory_probe(workload.device.kind)
    probe.start()
    if workload.address_space_bytes is not None:
        limit_address_space(workload.address_space_bytes)  # after the probe's thread: see its docstring
    try:
        torch.manual_seed(0)
        build_started = time.perf_counter()
        model = build_model(workload.model.hf_config, workload.model.task, **model_build_kwargs(job.config))
        if workload.model.peft is not None:  # --peft: the real get_peft_model, as the export says
            # (by the trainer, where it applies the adapters itself: TrialInputs.peft_config)
            wrap = not trainer_named(workload.trainer).applies_adapters
            model = apply_peft(model, workload.model.peft, workload.model.task, workload.device, wrap=wrap)
        model_build_s = time.perf_counter() - build_started
        batching = trial_batching(job.config)
        # The recorder comes before the timer: the timer (and the pruner it calls) then knows whether
        # this step was skipped; its scalar read waits for work the timer's synchronize waits for anyway.
        recorder = LossRecorder()
        lengths = SampleLengths()
        timer = StepTimer(workload.measure, probe.synchronize, _pruner(job, recorder, lengths))
        # After the timer: the profiled window ends once the step's clock is read.
        profiler = step_profiler(job, probe.synchronize)
        callbacks = [
            recorder,
            timer,
            *([profiler] if profiler is not None else []),
            *(load_callback(name)() for name in workload.callbacks),
            *([StepSignal(on_step)] if on_step is not None else []),
        ]
        varying = batches_vary(job, batching)
        # Before the Trainer builds accelerate's compile plugin, which reads it: a compiled trial whose
        # batches vary compiles once, its lengths dynamic from the first step (levers.compile_environment).
        os.environ.update(compile_environment(job.config.compiled_as, varying))
        trainer = build_trainer(job, model, batching, callbacks)
        recorder.attach(trainer)  # its probe of the model's loss runs one forward: before the autocast hooks
        lengths.attach(trainer)
        autocast = AutocastRecorder(torch, workload.device.kind)
        if job.config.compiled_as is None:
            # Not on a model torch.compile traces: dynamo would trace the hook (and guard on its state),
            # changing what is compiled. There the accelerator's setting, which enters autocast, is read.
            autocast.attach(model)
        align_legacy_tf32(torch)  # after TrainingArguments and the accelerator set TF32, before compile reads it
        trainer.train()  # exactly as a plain run does (docs/benchmarks.md, Isolation: why nothing is skipped)
        steps = MeasuredSteps(timer, recorder, lengths, varying, trainer, probe.ceiling_source, started, model_build_s)
        if timer.still_compiling:  # no steady state, and the fullest batch would compile once more
            return with_profile(steps.still_compiling(job, probe.peaks()), profiler)
        peaks, peak_batch = probe.peaks(), ""
        compiled = job.config.compiled_as is not None
        if varying:
            if on_measured is not None:  # the weights not checked: reading them is not part of what is measured
                runtime = runtime_readings(trainer, autocast, workload.device.kind, probe.notes(), compiled=compiled)
                on_measured(steps.result(job, peaks, peak_batch="", weights_finite=None, runtime=runtime).to_dict())
            peaks, peak_batch = worst_case_peaks(trainer, job, batching, probe, peaks)
        weights_finite = weights_are_finite(model)  # after the peaks: not part of what was measured
        runtime = runtime_readings(trainer, autocast, workload.device.kind, probe.notes(), compiled=compiled)
    finally:
        probe.stop()
    return with_profile(steps.result(job, peaks, peak_batch, weights_finite, runtime), profiler)


def step_profiler(job: TrialJob, synchronize: Callable[[], None]) -> StepProfiler | None:
    """The profiler of a job that asks for one (``TrialJob.profile_steps``), in a trial of one process."""
    if job.profile_steps <= 0 or job.workload.devices_per_trial > 1:
        return None
    warmup = job.workload.measure.warmup_steps
    return StepProfiler(job.profile_steps, warmup, job.workload.device.kind, job.work_dir, synchronize)


def with_profile(result: TrialResult, profiler: StepProfiler | None) -> TrialResult:
    """``result`` with what ``profiler`` recorded, if it recorded anything."""
    if profiler is None or profiler.summary is None:
        return result
    return dataclasses.replace(result, profile=profiler.summary.to_dict())


def worst_case_peaks(
    trainer: Trainer, job: TrialJob, batching: Batching, probe: MemoryProbe, measured: dict[str, int]
) -> tuple[dict[str, int], str]:
    """One more optimizer step, after the timed ones, on the fullest batch the data can produce
    (:func:`autotune.runner._loader.worst_case_batch`; under a trainer that prepares its rows, the
    longest prepared rows through its collator: :meth:`autotune.trainers.TrainerKind.fullest_batch`), through the Trainer's own ``training_step``
    (its autocast, its accelerator) and optimizer: the trial's peak is the larger of the two, so a
    config that fits stays inside memory for the whole run, not only for the batches it was timed on.

    Returns:
        The peaks after it (``measured_steps_peak_bytes``: the timed steps' ceiling figure), and
        which batch set the ceiling's figure.
    """
    fullest = trainer_named(job.workload.trainer).fullest_batch(trainer, trainer.args.per_device_train_batch_size)
    if fullest is None:
        from autotune.runner._loader import worst_case_batch

        fullest = worst_case_batch(
            trainer.train_dataset, trainer.args.per_device_train_batch_size, batching, trainer.data_collator
        )
    batch, words = fullest
    trainer.training_step(trainer.model_wrapped, batch)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    peaks = {**probe.peaks(), "measured_steps_peak_bytes": measured[probe.ceiling_source]}
    if peaks[probe.ceiling_source] > measured[probe.ceiling_source]:
        return peaks, words
    return peaks, f"the measured steps (at or above the {words})"


def runtime_readings(
    trainer: Trainer, autocast: AutocastRecorder, device_kind: str, probe_notes: dict[str, str], compiled: bool
) -> dict[str, str]:
    """How the trial ran, read back after training: precision, allocator settings, memory sources, and
    (``compiled``: the trial's model went through torch.compile) how dynamo traced the shapes."""
    autocast_dtype = (
        autocast.dtype
        if autocast.seen
        else accelerator_autocast_dtype(str(getattr(trainer.accelerator, "mixed_precision", "no")))
    )
    found = {
        "trainer": type(trainer).__name__,  # the class that trained: Trainer, or TRL's SFTTrainer
        "matmul_precision": cuda_matmul_precision(torch) if device_kind == "cuda" else "ieee",
        "autocast_dtype": autocast_dtype or "",
        "autocast_read_from": "forward hook" if autocast.seen else "accelerator",
        **allocator_settings(),
        **probe_notes,
    }
    if compiled:  # how dynamo traced the shapes: "True", dynamic from the first step;
        # "None", static first, dynamic from the second distinct shape (levers.compile_environment)
        found["compile_dynamic"] = str(trainer.accelerator.state.dynamo_plugin.dynamic)
    if device_kind == "cuda":  # what CUDA can allocate, against the NVML figure the ceiling used (devices.py)
        found["cuda_total_bytes"] = str(torch.cuda.mem_get_info()[1])
        found.update(allocator_read_back(torch))
    return found


def build_collator(job: TrialJob, batching: Batching) -> Any:
    """The Trainer's ``data_collator`` of the trial's batching (``None``: the Trainer's default)."""
    dataset = job.workload.dataset
    if dataset is None:
        return None
    return batching.collator(dataset.pad_token_id, job.workload.model.model_type)


def build_trainer(job: TrialJob, model: Any, batching: Batching, callbacks: list[Any]) -> Trainer:
    """The trial's trainer (:func:`trainer_of`), with exactly the levers' arguments and the harness's,
    built by the workload's trainer (:meth:`autotune.trainers.TrainerKind.build`): the transformers
    ``Trainer`` on autotune's batches, or TRL's ``SFTTrainer`` on the user's rows, which it prepares and
    batches itself."""
    workload = job.workload
    trainer_class, arguments_class, trainer_kwargs = trainer_of(job)
    kwargs = training_arguments_kwargs(job.config, workload.device.kind, workload.base_args)
    # Under a subclass whose defaults differ (SFTConfig), each lever field at its default is written.
    kwargs = {**with_levers_off_explicit(kwargs, arguments_class), **harness_arguments(job, batching)}
    prepared = workload.dataset
    inputs = TrialInputs(
        trainer_class=trainer_class,
        arguments_class=arguments_class,
        trainer_kwargs=trainer_kwargs,
        arguments=kwargs,
        model=model,
        callbacks=callbacks,
        seq_len=workload.seq_len,
        loss_on=workload.loss_on,
        rows_wanted=job.config.global_batch * (workload.measure.total_steps_cap + 1),
        dataset=lambda: build_dataset(job, batching),
        collator=lambda: build_collator(job, batching),
        prepared_dir=prepared.prepared_dir if prepared is not None else None,
        tokenizer_dir=prepared.tokenizer_dir if prepared is not None else None,
        peft_config=peft_config_of(job),
        reference_copy=workload.model.keeps_reference_copy(
            memory_traits(job.config, workload.device.kind).reference_precomputed
        ),
    )
    return trainer_named(workload.trainer).build(inputs)


def peft_config_of(job: TrialJob) -> Any:
    """``--peft``'s adapters for a trainer that applies them itself (:attr:`TrainerKind.applies_adapters`:
    ``DPOTrainer(peft_config=...)``, as ``trl dpo --use_peft``); ``None`` where the model comes wrapped."""
    peft = job.workload.model.peft
    if peft is None or not trainer_named(job.workload.trainer).applies_adapters:
        return None
    return lora_config(peft.adapter_config, job.workload.model.task)


def trainer_of(job: TrialJob) -> tuple[type, type, dict[str, Any]]:
    """The trainer class, its arguments class and the trainer's keyword arguments of the trial: the
    workload's trainer (``--trainer``: :attr:`autotune.trainers.TrainerKind.trainer_class`), or one a lever
    chooses over the Trainer's, with every lever's keyword arguments (:func:`autotune.levers.trainer_parts`)."""
    kind = trainer_named(job.workload.trainer)
    parts = trainer_parts(job.config, TrainerParts(trainer=kind.trainer_class, arguments=kind.arguments_path))
    return class_named(parts.trainer), class_named(parts.arguments), parts.kwargs


def batches_vary(job: TrialJob, batching: Batching) -> bool:
    """Whether micro-batches differ in tokens: the user's data padded to each batch's longest or
    flattened (``Batching.varies``), and every batching of a trainer that prepares its rows (SFTTrainer's
    collator pads to the longest, and packed rows are filled to different lengths). The trial then also
    measures the fullest batch once (:func:`worst_case_peaks`)."""
    return job.workload.dataset is not None and (batching.varies or trainer_named(job.workload.trainer).prepares_rows)


def tokens_counted(job: TrialJob, batching: Batching) -> str:
    """What the Trainer counts in ``state.num_input_tokens_seen`` (transformers/trainer.py:
    ``_track_num_input_tokens``): with the user's data what the batching says (the attention mask's
    ones; all of a flattened batch's tokens, which has no mask and no padding); nothing with
    synthetic tokens, which are all real.
    """
    if job.workload.dataset is None:
        return "no"
    return batching.counts_tokens


def _pruner(job: TrialJob, recorder: LossRecorder, lengths: SampleLengths):  # noqa: ANN202 - StepTimer's callback type
    threshold = job.prune_below_samples_per_s
    if threshold is None:
        return None

    def losing(timer: StepTimer) -> bool:
        # From the first measured step: every further step of a config that cannot win is time lost
        # (autotune.spec.measure.clearly_slower says when one step is enough).
        skipped = skipped_among(timer.measured_step_numbers, recorder.skipped_steps)
        trained = trained_fraction(len(timer.step_times), skipped)
        samples_per_step = job.config.global_batch * trained
        if trainer_named(job.workload.trainer).samples_counted_from_lengths:  # as the result counts them
            steps = timer.measured_step_numbers
            samples_per_step = trained * lengths.totals(steps)[0] / max(len(steps), 1)
        return clearly_slower(timer.step_times, samples_per_step, threshold, job.prune_step_noise, timer.settings)

    return losing
