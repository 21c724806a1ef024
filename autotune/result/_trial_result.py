"""The outcome of one trial: a JSON-serialisable record stored in the trial's user attrs."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Sequence
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autotune.spec.ceiling import excess_gib
from autotune.storage import schema


class Status(enum.StrEnum):
    """How a trial ended: the one vocabulary of statuses, and the groups below are its only readings.

    The values are the strings stored in a trial's user attrs (``result.status``, ``status``), so
    studies written before this type read unchanged; a ``Status`` compares and hashes as its string.
    """

    OK = "ok"  # ran, trains, and fits under the ceiling
    OVER_CEILING = "over_ceiling"  # ran, but its peak memory exceeds the ceiling
    OOM = "oom"  # the allocator failed: a property of the config, not a crash
    SCREENED = "screened"  # predicted not to fit; not run
    PRUNED = "pruned"  # stopped early: clearly slower than the best
    # Ran, but does not train: a non-finite loss or weights, every measured step skipped by the grad
    # scaler, or a loss far above the HF default's over the same steps (autotune.result._loss).
    DIVERGED = "diverged"
    # Ran, but torch.compile kept compiling after warm-up (batches of a new shape at every step, more
    # than MeasureSettings.recompile_limit steps): stopped, no steady state to measure (issue 38, 10).
    RECOMPILING = "recompiling"
    TIMEOUT = "timeout"  # killed at the trial timeout
    COMPILE_TIMEOUT = "compile_timeout"  # killed while torch.compile still compiled, at --compile-timeout (not retried)
    CRASH = "crash"  # the child died without a result (a signal, an exit code)
    ERROR = "error"  # the child raised an exception that is not an OOM
    INTERRUPTED = "interrupted"  # the user stopped the search, or its worker died


# Ran and fits under the ceiling, and trains: the only statuses ranked, confirmed and exported.
FEASIBLE_STATUSES = frozenset({Status.OK})
# Ran its measured steps as training normally runs them (memory aside: an over-ceiling trial ran;
# a pruned one ran until stopped): its throughput is the config's speed, and its loss curve can be
# the reference others are judged against. A diverged trial's is neither: its steps did not train
# (the fp16 grad scaler skipped them, or the values were non-finite).
RAN_NORMALLY_STATUSES = frozenset({Status.OK, Status.PRUNED, Status.OVER_CEILING})
# Ran and measured a peak that is the config's memory: what screening's calibration and the
# landscape's peak model fit. A diverged trial counts: it ran every step to the end, and memory does
# not depend on the values trained (a NaN takes the bytes a number takes).
PEAK_MEASURED_STATUSES = RAN_NORMALLY_STATUSES | {Status.DIVERGED}
# Recorded as COMPLETE trials with value 0 and a violated constraint: the sampler learns to avoid
# them. A diverged or recompiling trial's constraint is not a memory figure (see measured_constraint_gib):
# the config is not one to train as it is, and the sampler must learn so, not retry it.
INFEASIBLE_STATUSES = frozenset({Status.OVER_CEILING, Status.OOM, Status.SCREENED, Status.DIVERGED, Status.RECOMPILING})
# Measured memory at or over the ceiling: a larger micro-batch of the same config cannot fit either.
MEMORY_EXCEEDED_STATUSES = frozenset({Status.OOM, Status.OVER_CEILING})
# Failures that say nothing about the config: recorded as FAIL trials, never counted, and a
# confirmation re-run that ends so is left out of the median.
FAILED_STATUSES = frozenset({Status.TIMEOUT, Status.COMPILE_TIMEOUT, Status.CRASH, Status.ERROR, Status.INTERRUPTED})
# Failures that may be transient (a noisy neighbour, a driver hiccup, a hang): the trial is tried once more
# (:func:`worth_retrying`: not a timeout that killed a trial still stepping).
RETRIED_STATUSES = frozenset({Status.CRASH, Status.TIMEOUT})
# Failed on every attempt it gets (a crash or a timeout twice, an error, a compile timeout): the
# config is taken, never proposed again. An interrupted trial runs again instead (queued once).
GIVEN_UP_STATUSES = FAILED_STATUSES - {Status.INTERRUPTED}


def in_order(statuses: Iterable[Status]) -> list[Status]:
    """``statuses`` in the vocabulary's order (for legends and tables that must not reshuffle)."""
    chosen = set(statuses)
    return [status for status in Status if status in chosen]


# How a trial with no result yet is named where statuses are listed, by its Optuna state's name.
UNFINISHED_LABELS = {"RUNNING": "running", "WAITING": "queued"}
# The constraint of an infeasible trial whose real excess is unknown (an OOM under the ceiling, a
# diverged trial that fitted): "over by at least this".
UNKNOWN_EXCESS_GIB = 1.0


@dataclasses.dataclass
class TrialResult:
    """What one trial measured, or why it measured nothing.

    Throughput figures are per device and over steady-state optimizer steps only. Every memory
    figure is in bytes and names its source; ``peak_memory_bytes`` is the one compared with the
    ceiling, and ``memory_source`` names it.
    """

    status: Status
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0  # samples/s x --seq-len: token slots at the full length, padding included
    real_tokens_per_s: float = (
        0.0  # non-padding tokens per second over the measured steps (--dataset); else tokens_per_s
    )
    # The token-weighted mean sample length (sum s_i^2 / sum s_i over the measured steps' samples, read
    # from the batches) the attention term of the FLOPs counts each token over; --seq-len for
    # synthetic tokens (autotune.spec.flops.model_tflops).
    attention_context: float = 0.0
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
    measured_s: float = 0.0  # wall time of the measured steps (the throughput's steps)
    step_times_s: list[float] = dataclasses.field(default_factory=list)  # each measured step's time
    warmup_steps: int = 0
    warmup_s: float = 0.0  # warm-up steps, compilation included; excluded from throughput
    compile_s: float = 0.0  # torch.compile's own compilation time (within warm-up; 0 without compile)
    # steps after the warm-up during which torch.compile compiled (counted in warmup_steps): 0 where the
    # compiled graph met no new shape; past MeasureSettings.recompile_limit the trial is RECOMPILING
    recompiled_steps: int = 0
    steady: bool = False  # the step-time CV target was met (False: the step/time budget ran out first)
    setup_s: float = 0.0  # child start to first step: model build, Trainer set-up
    model_build_s: float = 0.0  # the model build within setup_s
    peak_memory_bytes: int = 0
    memory_source: str = ""
    memory_peaks: dict[str, int] = dataclasses.field(default_factory=dict)
    peak_batch: str = (
        ""  # with --dataset and dynamic padding: which batch set peak_memory_bytes (worst case or measured)
    )
    ceiling_bytes: int = 0
    error: str = ""  # the exception or signal, one line
    stderr_tail: str = ""  # last lines the child wrote
    wall_s: float = 0.0  # the whole trial as the orchestrator saw it
    attempts: int = 1
    # Killed by its timeout while its steps still came at their pace (autotune.runner._deadlines): too slow for
    # the budget, not hung.
    still_stepping: bool = False
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    # Where the step time went, for a profiled run only (``TrialJob.profile_steps``): StepProfile.to_dict().
    profile: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Training numerics (autotune.result._loss): the loss of every optimizer step from global step 1
    # (warm-up included; None where not finite), the first measured step, the non-finite losses as
    # [step, "nan"|"inf"|"-inf"], the steps the fp16 grad scaler skipped (their samples are not
    # counted in samples/s), and whether the weights were finite after training (None: not checked).
    loss_curve: list[float | None] = dataclasses.field(default_factory=list)
    loss_measured_from: int = 0
    loss_nonfinite: list[list[Any]] = dataclasses.field(default_factory=list)
    skipped_steps: list[int] = dataclasses.field(default_factory=list)
    skipped_measured_steps: int = 0
    weights_finite: bool | None = None
    # How many times the per-sample loss the Trainer's loss and gradients were: the accumulation steps
    # where the model takes loss kwargs but ignores num_items_in_batch, so the Trainer neither divides
    # by the steps nor normalises over the step's items (runner._loss_recorder.accumulation_gradient_scale);
    # else 1. loss_curve is per sample whatever it is.
    gradient_scale: int = 1
    # What the child read back about how it ran: matmul_precision (tf32/ieee), autocast_dtype, the
    # allocator settings (PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF), outside_allocator_source.
    runtime: dict[str, str] = dataclasses.field(default_factory=dict)
    # Figures found impossible and dropped (an MFU above 100 %), one line each.
    defects: list[str] = dataclasses.field(default_factory=list)
    # A pass the trainer ran over its rows before the first step, once per run (DPO's precomputed reference
    # log-probabilities): its seconds and samples. The rates above count its share over the user's run
    # (autotune.result.over_the_run); 0: none ran.
    setup_pass_s: float = 0.0
    setup_pass_samples: int = 0
    run_passes: float = 1.0  # the passes over the data of the run the rates count that pass over

    def __post_init__(self) -> None:
        self.status = Status(self.status)  # a stored string, or a status misspelt: ValueError

    @property
    def feasible(self) -> bool:
        return self.status in FEASIBLE_STATUSES

    @property
    def ran_and_fit(self) -> bool:
        """Ran under the ceiling with a measured throughput: a figure to compare against. A pruned
        trial counts: it was stopped for being slow, and its median is measured."""
        return (
            self.status in RAN_NORMALLY_STATUSES and self.status not in INFEASIBLE_STATUSES and self.samples_per_s > 0
        )

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


def worth_retrying(result: TrialResult) -> bool:
    """Whether a failed trial gets its second try: a crash or a timeout (``RETRIED_STATUSES``), but not a
    timeout that killed a trial still stepping (``still_stepping``): the same budget would end it again, and
    the search would spend the whole timeout twice on one slow config."""
    return result.status in RETRIED_STATUSES and not result.still_stepping


def measured_constraint_gib(result: TrialResult) -> float:
    """``peak - ceiling`` in GiB, the memory constraint of a trial that was not screened: feasible when
    <= 0; always > 0 for an infeasible status.

    An OOM can strike with the peak seen so far under the ceiling (the CPU address-space limit,
    fragmentation); the config still did not fit, so its constraint must say so: samplers, Optuna's
    ``best_trial`` and the dashboard all read feasibility from this number alone. A ``diverged``
    or ``recompiling`` trial that fitted gets the same positive value: it is infeasible for numerics
    or for compiling at every step, not memory (this
    one constraint is the only feasibility Optuna and the dashboard read). A screened trial's is
    predicted, not measured (``autotune.study._record.memory_constraint_gib``).
    """
    excess = excess_gib(result.peak_memory_bytes, result.ceiling_bytes)
    if result.status in INFEASIBLE_STATUSES and (result.peak_memory_bytes == 0 or excess <= 0):
        return UNKNOWN_EXCESS_GIB
    return excess


def objective_value(result: TrialResult) -> float:
    """The value Optuna records for a COMPLETE trial: model TFLOPs, 0 for an infeasible status."""
    return 0.0 if result.status in INFEASIBLE_STATUSES else result.model_tflops


def precision_note(config_dtype: str, result: TrialResult) -> str | None:
    """``ran tf32 matmuls`` where what the child read back differs from the lever's name, else ``None``.

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
    (:mod:`autotune.views.ranking`), confirmation's candidates and early stopping's threshold all start
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


def hf_default_trial(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The study's HF-default seed trial (``seed`` ``hf-default``): the first that finished complete or
    pruned; where none did, the first that failed for good (``GIVEN_UP_STATUSES``: a timeout, a crash, an
    error, so the speedup line can say why there is no figure); ``None`` if none finished. The speedup line
    compares the winner with it, and confirmation re-runs it beside the leaders where it ran and fit
    (:func:`comparable_hf_default`, :mod:`autotune.study._confirm`)."""
    seeds = [
        trial
        for trial in sorted(trials, key=lambda t: t.number)
        if trial.user_attrs.get(schema.TRIAL_SEED) == schema.SEED_HF_DEFAULT
    ]
    finished = [trial for trial in seeds if trial.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    given_up = [
        trial
        for trial in seeds
        if trial.state == TrialState.FAIL
        and (result := TrialResult.from_trial(trial)) is not None
        and result.status in GIVEN_UP_STATUSES
    ]
    return next(iter(finished + given_up), None)


def comparable_hf_default(trials: Sequence[FrozenTrial]) -> FrozenTrial | None:
    """The HF-default seed trial where it ran and fit (:attr:`TrialResult.ran_and_fit`): a figure the
    winner's can be compared with, which confirmation re-runs; ``None`` where it ran out of memory, went
    over the ceiling or failed."""
    default = hf_default_trial(trials)
    result = TrialResult.from_trial(default) if default is not None else None
    return default if result is not None and result.ran_and_fit else None


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
