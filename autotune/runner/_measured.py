"""What a trial's timed steps measured, turned into its result (``runner._trial`` trains, this counts).

Its figures come from one place, :meth:`MeasuredSteps.result`: after the step on the fullest batch, and, where a
timeout may end that step, once before it, sent to the parent (``train_and_measure``'s ``on_measured``:
``runner._deadlines`` keeps it in the timeout's record). Also the versions every trial records.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import platform
from typing import Any

import torch
from transformers import Trainer

from autotune.result import (
    Status,
    TrialResult,
    loss_record,
    nonfinite_reason,
    over_the_run,
    trained_fraction,
)
from autotune.runner._job import TrialJob
from autotune.runner._loss_recorder import LossRecorder
from autotune.runner._precision import ran_dtype, utilisation_defect
from autotune.runner._sample_lengths import SampleLengths
from autotune.runner._step_timer import StepTimer
from autotune.spec.devices import DeviceSpec
from autotune.spec.flops import hardware_tflops as hardware_tflops_of
from autotune.spec.flops import model_tflops as model_tflops_of
from autotune.spec.flops import utilisation
from autotune.trainers import get as trainer_named


@dataclasses.dataclass
class MeasuredSteps:
    """What a trial's timed steps left, turned into its result by :meth:`result`: once after the fullest
    batch's step, and, where a timeout may end that step, once before it (``train_and_measure``'s
    ``on_measured``); or, where torch.compile kept compiling, by :meth:`still_compiling`."""

    timer: StepTimer
    recorder: LossRecorder
    lengths: SampleLengths
    varying: bool
    trainer: Trainer
    ceiling_source: str
    started: float
    model_build_s: float

    def result(
        self,
        job: TrialJob,
        peaks: dict[str, int],
        peak_batch: str,
        weights_finite: bool | None,
        runtime: dict[str, str],
    ) -> TrialResult:
        workload, timer, recorder, lengths = job.workload, self.timer, self.recorder, self.lengths
        stats = timer.stats()
        if stats.measured_steps == 0:
            raise RuntimeError("training ended before any step was measured (dataset shorter than the warm-up?)")
        record = loss_record(recorder.losses, recorder.skipped_steps, timer.measured_step_numbers, weights_finite)
        diverged = nonfinite_reason(record, stats.measured_steps)
        # A step the grad scaler skipped trained on nothing: only steps that updated the weights count.
        trained = trained_fraction(stats.measured_steps, record.skipped_measured)
        # Batches of different lengths (padding longest / padding_free, every SFTTrainer batching) differ
        # in cost by design: their throughput is the mean over the measured steps, not the median of a window.
        samples_per_s = job.config.global_batch * trained / (stats.mean_s if self.varying else stats.median_s)
        if trainer_named(workload.trainer).samples_counted_from_lengths:  # however packing puts them in rows
            samples_per_s = trained * lengths.totals(timer.measured_step_numbers)[0] / stats.measured_s
        real_tokens_per_s = trained * stats.measured_tokens / stats.measured_s if workload.dataset is not None else None
        # A pass the trainer ran over the rows before training (DPO's precomputed reference), once per run: every
        # rate below counts its share over the user's run (autotune.result.over_the_run).
        setup_s, setup_samples = trainer_named(workload.trainer).setup_pass(self.trainer)
        passes = workload.run_passes(job.config)
        if setup_samples:
            share = over_the_run(samples_per_s, setup_s / setup_samples, passes) / samples_per_s
            samples_per_s *= share
            real_tokens_per_s = real_tokens_per_s * share if real_tokens_per_s is not None else None
        # The attention term over each sample's own length (sum s_i^2), as the collator emitted them.
        context = lengths.context(timer.measured_step_numbers) if workload.dataset is not None else None
        model_tflops = model_tflops_of(workload.model, workload.seq_len, samples_per_s, real_tokens_per_s, context)
        hardware_tflops = hardware_tflops_of(
            workload.model, workload.seq_len, samples_per_s, job.config.recomputes_forward, real_tokens_per_s, context
        )
        # The peak of the precision that ran (read back from torch), not of the lever's name.
        peak_dtype = ran_dtype(workload.device.kind, runtime.get("autocast_dtype") or None, runtime["matmul_precision"])
        peak_tflops = workload.device.datasheet_peak_tflops(peak_dtype)
        measured_peak_tflops = workload.measured_peaks_tflops.get(peak_dtype)
        mfu, hfu = utilisation(model_tflops, peak_tflops), utilisation(hardware_tflops, peak_tflops)
        defects = [
            d for d in (utilisation_defect("MFU", mfu, peak_dtype), utilisation_defect("HFU", hfu, peak_dtype)) if d
        ]
        return TrialResult(
            status=Status.DIVERGED if diverged else Status.PRUNED if timer.stopped_early else Status.OK,
            error=diverged or "",
            samples_per_s=samples_per_s,
            tokens_per_s=samples_per_s * workload.seq_len,
            real_tokens_per_s=real_tokens_per_s if real_tokens_per_s is not None else samples_per_s * workload.seq_len,
            attention_context=context or float(workload.seq_len),
            model_tflops=model_tflops,
            hardware_tflops=hardware_tflops,
            mfu=None if mfu is not None and mfu > 1 else mfu,
            hfu=None if hfu is not None and hfu > 1 else hfu,
            mfu_measured=utilisation(model_tflops, measured_peak_tflops),
            hfu_measured=utilisation(hardware_tflops, measured_peak_tflops),
            peak_dtype=peak_dtype,
            peak_tflops=peak_tflops,
            measured_peak_tflops=measured_peak_tflops,
            step_time_median_s=stats.median_s,
            step_time_cv=stats.cv,
            steady=stats.converged,
            peak_batch=peak_batch,
            **self.steps_and_peaks(job, peaks),
            loss_curve=record.curve,
            loss_measured_from=record.measured_from,
            loss_nonfinite=record.nonfinite,
            skipped_steps=record.skipped_steps,
            skipped_measured_steps=record.skipped_measured,
            weights_finite=record.weights_finite,
            gradient_scale=recorder.gradient_scale,
            runtime=runtime,
            defects=defects,
            setup_pass_s=setup_s,
            setup_pass_samples=setup_samples,
            run_passes=passes,
        )

    def still_compiling(self, job: TrialJob, peaks: dict[str, int]) -> TrialResult:
        """A trial stopped because torch.compile compiled again in more steps after warm-up than
        ``recompile_limit`` allows (:attr:`StepTimer.still_compiling`): what it ran, and why it stopped."""
        limit, timer = job.workload.measure.recompile_limit, self.timer
        return TrialResult(
            status=Status.RECOMPILING,
            error=(
                f"torch.compile compiled again in {timer.recompiled_steps} steps after warm-up (more than {limit}): "
                f"batches of a new shape compile at every step, so there is no steady state to measure "
                f"({timer.stats().compile_s:.0f} s compiling); compile with fixed shapes (padding max_length, no packing) or not at all"
            ),
            **self.steps_and_peaks(job, peaks),
        )

    def steps_and_peaks(self, job: TrialJob, peaks: dict[str, int]) -> dict[str, Any]:
        """The fields of a result that every trial which ran steps records: its steps, times and peaks."""
        timer, source, started = self.timer, self.ceiling_source, self.started
        stats = timer.stats()
        return dict(
            measured_steps=stats.measured_steps,
            measured_s=stats.measured_s,
            step_times_s=list(timer.step_times),
            warmup_steps=stats.warmup_steps,
            warmup_s=stats.warmup_s,
            compile_s=stats.compile_s,
            recompiled_steps=timer.recompiled_steps,
            setup_s=(timer.first_step_started_at or started) - started,
            model_build_s=self.model_build_s,
            peak_memory_bytes=peaks[source],
            memory_source=source,
            memory_peaks=peaks,
            ceiling_bytes=job.workload.ceiling_bytes,
            versions=versions(job.workload.device),
        )


# The libraries a trial's speed and memory depend on, by distribution name: recorded with every trial, so
# `autotune verify` can say which of them changed since the study measured (an upgrade can slow a run
# down: a transformers nightly made a 750-step run take 43 h, unsloth#1144). Read from the installed
# metadata (importlib.metadata): the child imports none of them for it.
RECORDED_DISTRIBUTIONS = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "peft",
    "deepspeed",
    "bitsandbytes",
    "liger-kernel",
)
NOT_INSTALLED = "not installed"


def versions(device: DeviceSpec) -> dict[str, str]:
    """The software a trial ran on (each of :data:`RECORDED_DISTRIBUTIONS`, Python, CUDA and the driver
    on a GPU) and the device's name, kept with its result."""
    found = {name: installed_version(name) for name in RECORDED_DISTRIBUTIONS}
    found["python"] = platform.python_version()
    found["device"] = device.name
    if device.kind == "cuda":
        found["cuda"] = str(torch.version.cuda)
        try:
            import pynvml

            found["driver"] = str(pynvml.nvmlSystemGetDriverVersion())
        except Exception:  # noqa: BLE001 - the driver version is informative only
            pass
    return found


def installed_version(distribution: str) -> str:
    """``distribution``'s installed version, from its metadata (nothing imported), or ``not installed``."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED
