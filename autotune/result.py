"""The outcome of one trial: a JSON-serialisable record stored in the trial's user attrs."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune import schema

# ok: ran and fits under the ceiling. over_ceiling: ran, but its peak memory exceeds the ceiling.
# oom: the allocator failed (a property of the config, not a crash). screened: predicted not to fit,
# not run. pruned: stopped early, clearly slower than the best. timeout / crash / error: failures
# that say nothing about the config's memory. interrupted: the user stopped the search. diverged: ran,
# but does not train: a non-finite loss or weights, every measured step skipped by the grad scaler,
# or a loss far above the HF default's over the same steps (autotune.numerics).
STATUSES = ("ok", "over_ceiling", "oom", "screened", "pruned", "diverged", "timeout", "crash", "error", "interrupted")
FEASIBLE_STATUSES = ("ok",)
# Statuses recorded as COMPLETE trials with value 0 and a violated constraint: the sampler learns
# to avoid them. A diverged trial's constraint is not a memory figure (see study._record.memory_constraint_gib).
INFEASIBLE_STATUSES = ("over_ceiling", "oom", "screened", "diverged")
FAILED_STATUSES = ("timeout", "crash", "error", "interrupted")



@dataclasses.dataclass
class TrialResult:
    """What one trial measured, or why it measured nothing.

    Throughput figures are per device and over steady-state optimizer steps only. Every memory
    figure is in bytes and names its source; ``peak_memory_bytes`` is the one compared with the
    ceiling, and ``memory_source`` names it.
    """

    status: str
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0  # samples/s x --seq-len: token slots at the full length, padding included
    real_tokens_per_s: float = 0.0  # non-padding tokens per second over the measured steps (--dataset); else tokens_per_s
    model_tflops: float = 0.0  # useful work per second (no recomputation), the ranking metric
    hardware_tflops: float = 0.0  # work the device did per second (recomputation included)
    mfu: float | None = None  # model TFLOPs / datasheet peak for the dtype used
    hfu: float | None = None  # hardware TFLOPs / datasheet peak
    mfu_measured: float | None = None  # model TFLOPs / peak measured by `autotune devices --calibrate`
    hfu_measured: float | None = None  # hardware TFLOPs / that measured peak
    peak_dtype: str = ""  # the dtype whose peak bounds the matmuls (tf32 for fp32 with TF32 on)
    peak_tflops: float | None = None  # the datasheet peak used for MFU/HFU, if known
    measured_peak_tflops: float | None = None
    step_time_median_s: float = 0.0  # one optimizer step (all accumulation micro-batches)
    step_time_cv: float = 0.0  # coefficient of variation of the measured step times
    measured_steps: int = 0
    warmup_steps: int = 0
    warmup_s: float = 0.0  # warm-up steps, compilation included; excluded from throughput
    compile_s: float = 0.0  # torch.compile's own compilation time (within warm-up; 0 without compile)
    steady: bool = False  # the step-time CV target was met (False: the step/time budget ran out first)
    setup_s: float = 0.0  # child start to first step: model build, Trainer set-up
    model_build_s: float = 0.0  # the model build within setup_s
    peak_memory_bytes: int = 0
    memory_source: str = ""
    memory_peaks: dict[str, int] = dataclasses.field(default_factory=dict)
    peak_batch: str = ""  # with --dataset and dynamic padding: which batch set peak_memory_bytes (worst case or measured)
    ceiling_bytes: int = 0
    error: str = ""  # the exception or signal, one line
    stderr_tail: str = ""  # last lines the child wrote
    wall_s: float = 0.0  # the whole trial as the orchestrator saw it
    attempts: int = 1
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    # Training numerics (autotune.numerics): the loss of every optimizer step from global step 1
    # (warm-up included; None where not finite), the first measured step, the non-finite losses as
    # [step, "nan"|"inf"|"-inf"], the steps the fp16 grad scaler skipped (their samples are not
    # counted in samples/s), and whether the weights were finite after training (None: not checked).
    loss_curve: list[float | None] = dataclasses.field(default_factory=list)
    loss_measured_from: int = 0
    loss_nonfinite: list[list[Any]] = dataclasses.field(default_factory=list)
    skipped_steps: list[int] = dataclasses.field(default_factory=list)
    skipped_measured_steps: int = 0
    weights_finite: bool | None = None
    # What the child read back about how it ran: matmul_precision (tf32/ieee), autocast_dtype, the
    # allocator settings (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF), outside_allocator_source.
    runtime: dict[str, str] = dataclasses.field(default_factory=dict)
    # Figures found impossible and dropped (an MFU above 100 %), one line each.
    defects: list[str] = dataclasses.field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return self.status in FEASIBLE_STATUSES

    @property
    def measured_losses(self) -> list[float | None]:
        """The loss of each measured step (warm-up left out), ``None`` where it was not finite."""
        return self.loss_curve[max(self.loss_measured_from - 1, 0) :] if self.loss_measured_from else []

    @property
    def loss_first(self) -> float | None:
        """The first measured step's loss (``None``: not recorded or not finite)."""
        return self.measured_losses[0] if self.measured_losses else None

    @property
    def loss_last(self) -> float | None:
        """The last measured step's loss (``None``: not recorded or not finite)."""
        return self.measured_losses[-1] if self.measured_losses else None

    @property
    def memory_excess_bytes(self) -> int:
        """Peak minus ceiling: positive means the config does not fit."""
        return self.peak_memory_bytes - self.ceiling_bytes

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_trial(cls, trial: Any) -> TrialResult | None:
        """The result stored in an Optuna trial's user attrs, if any."""
        values = trial.user_attrs.get(schema.TRIAL_RESULT)
        return cls.from_dict(values) if values else None

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrialResult:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def precision_note(config_dtype: str, result: TrialResult) -> str | None:
    """``ran tf32 matmuls`` where what the child read back differs from the knob's name, else ``None``.

    An fp32 trial with ``torch.compile`` on CUDA runs TF32 matmuls (transformers and accelerate switch
    them on, see :mod:`autotune.runner._precision`): tables say so rather than print a bare fp32.
    """
    if not result.peak_dtype or result.peak_dtype == config_dtype:
        return None
    return f"ran {result.peak_dtype} matmuls"


def memory_source_description(source: str) -> str:
    """What a probe's ceiling figure measures, in words for tables and notes."""
    return {
        "peak_rss_tree_bytes": "peak resident memory (RSS) of the trial's whole process tree",
        "peak_device_bytes": "peak CUDA memory: max_memory_reserved + memory outside the allocator (context)",
    }.get(source, source)


def feasible_by_speed(trials: Sequence[FrozenTrial]) -> list[tuple[FrozenTrial, TrialResult]]:
    """Trials that ran to completion and fit under the ceiling, most useful work first (model TFLOPs,
    then samples/s) by their search-time figures.

    Each config once: a repeat answered from an earlier trial's record (``reused_from``) is left
    out. With synthetic tokens model TFLOPs is proportional to samples/s; with ``--dataset`` only real
    (non-padding) tokens count, so a config that pads less ranks higher for the same samples/s. The ranking
    (:mod:`autotune.ranking`), confirmation's candidates and early stopping's threshold all start
    from this list.
    """
    found = []
    for trial in trials:
        if trial.state != TrialState.COMPLETE or schema.TRIAL_REUSED_FROM in trial.user_attrs:
            continue
        result = TrialResult.from_trial(trial)
        if result is not None and result.feasible:
            found.append((trial, result))
    return sorted(found, key=lambda pair: (-pair[1].model_tflops, -pair[1].samples_per_s))


ParamsKey = tuple[tuple[str, Any], ...]


def params_key(params: dict[str, Any]) -> ParamsKey:
    """A hashable key of a config's params."""
    return tuple(sorted(params.items()))


def is_budget_trial(trial: FrozenTrial) -> bool:
    """A trial of the user's budget: it ran, or was screened; not a repeat answered from the record."""
    return schema.TRIAL_REUSED_FROM not in trial.user_attrs


def came_back_counts(trials: Iterable[FrozenTrial]) -> dict[int, int]:
    """Measured trial number -> how often the sampler proposed its config again (answered from the
    record, or turned to an untaken config)."""
    counts: dict[int, int] = {}
    for trial in trials:
        for attr in (schema.TRIAL_REUSED_FROM, schema.TRIAL_PROPOSED_AGAIN):
            if attr in trial.user_attrs:
                number = int(trial.user_attrs[attr])
                counts[number] = counts.get(number, 0) + 1
    return counts
