"""What travels to a trial child: the workload every trial of a search shares, and one trial's job."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from autotune.estimate import MemoryFit, SpeedModel, memory_prior, speed_prior
from autotune.levers import TrialConfig
from autotune.result import RunLength, passes_over_data
from autotune.runner._baseline import cpu_process_baseline_bytes
from autotune.runner._limits import allocator_settings
from autotune.runner._precision import predicted_tf32
from autotune.spec.dataset import PreparedDataset
from autotune.spec.devices import DeviceSpec, cpu_device, matmul_dtype
from autotune.spec.measure import MeasureSettings
from autotune.spec.models import ModelSpec, resolve_model


def trial_memory_prior(device: DeviceSpec, allocator_env: Mapping[str, str], ranks: int) -> MemoryFit:
    """The memory model's prior for trials on ``device`` under ``allocator_env``, ``ranks`` ranks each:
    :func:`autotune.estimate.memory_prior` with, on the CPU, this installation's measured process
    baseline (:func:`autotune.runner._baseline.cpu_process_baseline_bytes`). Built once per workload,
    by the plan (``autotune.plan.plan``) or by :meth:`Workload.for_model`."""
    baseline = cpu_process_baseline_bytes() if device.kind == "cpu" else None
    return dataclasses.replace(memory_prior(device, allocator_env, baseline), ranks=ranks)


@dataclasses.dataclass(frozen=True)
class Workload:
    """What is trained and where, the same for every trial of one search.

    Built once from the command line (``autotune.plan.plan``), it travels unchanged inside every
    :class:`TrialJob` to the child.

    Attributes:
        model: The model to build (from its config, random weights).
        device: Where to train.
        seq_len: Tokens per sample.
        ceiling_bytes: The memory ceiling (recorded with the result; judged by :mod:`autotune.spec.ceiling`).
        memory_prior: The memory model's prior for this device and allocator setting
            (:func:`trial_memory_prior`), built once with the workload: the plan narrows the space
            with it, ``autotune estimate`` predicts with it, and the search's screening, seeds and
            sampler start from it, so all predict the same peak before any trial; one rank's peak
            where a trial spans several.
        measure: When the steady-state measurement stops.
        base_args: TrainingArguments the user fixed, applied to every trial.
        dataset: The user's prepared data (``None``: synthetic tokens).
        callbacks: ``module:attr`` names of extra ``TrainerCallback`` classes to add.
        address_space_bytes: CPU only: the child's RLIMIT_AS budget above its start-up size, so a
            runaway batch fails inside the child instead of swapping or OOM-killing the host.
        measured_peaks_tflops: Achievable peaks from ``autotune devices --calibrate``, by dtype.
        measured_bandwidth_gb_s: The memory bandwidth the same calibration measured (``None``: never).
        measured_inner_tflops: The same calibration's rates by dtype and inner size (a CPU's narrow matmuls).
        measured_op_rates: The same calibration's per-element rates of a CPU (dropout's draws, the loss per logit:
            ``autotune.spec.measured_peaks.OP_RATE_NAMES``); empty: never timed.
        allocator_env: The caching allocator's settings (``PYTORCH_ALLOC_CONF``,
            ``PYTORCH_CUDA_ALLOC_CONF``) of the process that made the workload; every child trains
            under exactly these, whatever the forkserver inherited when it started.
        compile_timeout_s: ``--compile-timeout``: a trial with ``torch.compile`` on gets this long
            to finish its first optimizer step (where dynamo and inductor compile the forward and
            backward), and the trial timeout from then on; ``None``: one trial timeout for all.
        devices_per_trial: ``--devices-per-trial``: the ranks one trial spans (one process each,
            launched together; 1: the trial is one process).
        rank_devices: CUDA with ``devices_per_trial > 1``: the device numbers of the trial's ranks
            (one GPU each; ``device`` is the first), made visible to the trial and to nothing else.
        host_ceiling_bytes: ``--host-memory-ceiling``: host RAM a trial may use, its ranks together (what
            offload moves off the device counts against it); ``None``: not checked.
        trainer: ``--trainer``: ``trainer`` (the transformers Trainer) or ``sft`` (TRL's SFTTrainer,
            which prepares and batches ``dataset`` itself: ``autotune.trainers.sft``).
        loss_on: ``--loss-on`` under ``sft``: the tokens the loss is taken on (``all``, ``completion``,
            ``assistant``); it changes the labels, not the work of a step.
        run_length: The user's run (``--epochs``, ``--base-args``), over which a trainer's pass before its
            first step is counted (``autotune.result.over_the_run``); ``None``: one pass.
    """

    model: ModelSpec
    device: DeviceSpec
    seq_len: int
    ceiling_bytes: int
    memory_prior: MemoryFit
    measure: MeasureSettings = MeasureSettings()
    base_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    dataset: PreparedDataset | None = None
    callbacks: tuple[str, ...] = ()
    address_space_bytes: int | None = None
    measured_peaks_tflops: dict[str, float] = dataclasses.field(default_factory=dict)
    measured_bandwidth_gb_s: float | None = None
    measured_inner_tflops: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)
    measured_op_rates: dict[str, float] = dataclasses.field(default_factory=dict)
    allocator_env: dict[str, str] = dataclasses.field(default_factory=allocator_settings)
    compile_timeout_s: float | None = None
    devices_per_trial: int = 1
    host_ceiling_bytes: int | None = None
    rank_devices: tuple[int, ...] = ()
    trainer: str = "trainer"
    loss_on: str = "all"
    run_length: RunLength | None = None

    @classmethod
    def for_model(
        cls,
        model: ModelSpec | str,
        *,
        seq_len: int,
        ceiling_bytes: int,
        device: DeviceSpec | None = None,
        **fields: Any,
    ) -> Workload:
        """A workload made outside a plan: the one factory of the tests and of scripts that measure
        single configs.

        ``model`` is a spec or a name resolved offline as ``--model`` is (its default head); the
        device is this machine's CPU unless given; ``fields`` sets any other attribute; the memory
        prior is the device's (:func:`trial_memory_prior`) unless given. A search or an estimate makes
        its workload from the command line instead (``autotune.plan.plan``).
        """
        spec = resolve_model(model) if isinstance(model, str) else model
        device = device or cpu_device()
        if "memory_prior" not in fields:
            allocator_env = fields["allocator_env"] if "allocator_env" in fields else allocator_settings()
            ranks = fields.get("devices_per_trial", 1)
            fields = {**fields, "memory_prior": trial_memory_prior(device, allocator_env, ranks)}
        return cls(model=spec, device=device, seq_len=seq_len, ceiling_bytes=ceiling_bytes, **fields)

    def speed_model(self) -> SpeedModel:
        """The throughput prior of this workload (:mod:`autotune.estimate._speed`): the device's rates before
        any trial (its measured peaks, bandwidth and a CPU's per-element rates where calibrated; on a CPU the cores one trial's ranks
        share), the matmul dtype of :meth:`peak_dtype`, and the user's rows' token lengths where the plan
        tokenized them (``dataset.token_lengths``: padding and packing then predicted on the real data)."""
        cores = max(1, (os.cpu_count() or 1) // self.devices_per_trial)
        fit = speed_prior(
            self.device,
            self.measured_peaks_tflops,
            self.measured_bandwidth_gb_s,
            cores,
            self.measured_inner_tflops,
            self.measured_op_rates,
            rank_share=min(1.0, cores / (os.cpu_count() or 1)),
        )
        lengths = self.dataset.token_lengths if self.dataset is not None else ()
        return SpeedModel(fit, self.peak_dtype, lengths or None, self.run_passes, self.devices_per_trial)

    def run_passes(self, config: TrialConfig) -> float:
        """How many times the user's run of ``config`` goes over its data (``result.passes_over_data``): under
        ``max_steps``, each step trains every rank's share of the global batch (``config.global_batch`` is one
        rank's). What a trial's rates count a pass before training over (runner._measured), and the prior's."""
        samples = self.dataset.num_samples if self.dataset is not None else None
        return passes_over_data(self.run_length, config.global_batch * self.devices_per_trial, samples)

    def peak_dtype(self, config: TrialConfig) -> str:
        """The dtype whose peak is predicted to bound ``config``'s matmuls, before the trial runs.

        ``tf32`` for fp32 with the user's ``tf32``, and for fp32 with ``torch.compile`` on CUDA, where
        transformers and accelerate switch TF32 on themselves (:func:`predicted_tf32`). The child
        reads back what actually ran (:mod:`autotune.runner._precision`) and records that.
        """
        tf32 = predicted_tf32(config.precision, config.compiled_as or "off", self.device.kind, self.base_args)
        return matmul_dtype(config.precision, tf32)


@dataclasses.dataclass(frozen=True)
class TrialJob:
    """Everything a child process needs to train and measure one configuration.

    Attributes:
        workload: What is trained and where (shared by every trial of the search).
        config: The lever values under test.
        work_dir: A directory of this trial's own (Trainer output_dir, the child's log).
        prune_below_samples_per_s: Stop early (status ``pruned``) once the measured throughput is
            clearly below this (:func:`autotune.spec.measure.clearly_slower`); ``None`` never prunes.
        prune_step_noise: The step-time CV of the trial that set the threshold: how far one step
            may stray before a judgement on fewer than ``prune_after_steps`` steps.
        profile_steps: Profile this many optimizer steps after warm-up (``runner._step_profile``): a run of
            its own, never a search's measurement; 0: not profiled.
    """

    workload: Workload
    config: TrialConfig
    work_dir: str
    prune_below_samples_per_s: float | None = None
    prune_step_noise: float = 0.0
    profile_steps: int = 0

    @property
    def log_path(self) -> str:
        return f"{self.work_dir}/child.log"

    @property
    def measured_peak_tflops(self) -> float | None:
        """The calibrated peak of the dtype this trial's matmuls run in, if measured."""
        return self.workload.measured_peaks_tflops.get(self.workload.peak_dtype(self.config))
