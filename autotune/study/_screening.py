"""Decide, before running a trial, that its configuration cannot fit: screened trials are never run.

Two rules, both conservative (a config that might fit is always run):

* **OOM inference**: a config that differs from a measured ``oom`` or ``over_ceiling`` trial only by
  a larger micro-batch does not fit either (peak memory grows with the micro-batch: the levers
  whose ``grows_memory`` says so).
* **Estimate**: the fitted estimate of :mod:`autotune.estimate` puts the config's peak clearly
  over the ceiling: above ``ceiling * margin``. The margin is wide (25 %) until the memory model is
  fitted on measured trials, then the fit's own worst error plus a safety, never below 10 %.

A screened trial is recorded as infeasible (status ``screened``) with what the decision rests on;
it is never ranked nor exported (only ``ok`` trials are).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError
from autotune.estimate import (
    UNCALIBRATED_MARGIN,
    MeasuredMemory,
    MemoryEstimate,
    MemoryFit,
    estimate_peak,
    fit_memory,
    what_would_fit,
)
from autotune.levers import LEVERS, TrialConfig
from autotune.result import MEMORY_EXCEEDED_STATUSES, PEAK_MEASURED_STATUSES, Status, TrialResult
from autotune.runner import Workload
from autotune.spec.ceiling import excess_gib, fits
from autotune.spec.models import ModelSpec
from autotune.storage import schema
from autotune.units import format_bytes

if TYPE_CHECKING:
    import optuna

MIN_CALIBRATED_MARGIN = 1.10
# After calibration: margin = 1 + max(MIN, SAFETY * worst relative error of the fit), capped at
# the uncalibrated margin. The factor 2 leaves room for configs unlike the measured ones.
CALIBRATED_ERROR_SAFETY = 2.0
# Keys of TrialResult.memory_peaks for a screened trial: what it was not measured to use.
PREDICTED_PEAK_KEY = schema.TRIAL_PREDICTED_PEAK_BYTES
INFERRED_MIN_PEAK_KEY = "inferred_min_peak_bytes"


@dataclasses.dataclass(frozen=True)
class MeasuredTrial:
    """A trial of the study that ran, as screening sees it."""

    number: int
    config: TrialConfig
    result: TrialResult


@dataclasses.dataclass(frozen=True)
class ScreenDecision:
    """Why a config will not be run.

    Attributes:
        reason: One line for the trial table and the stored result.
        predicted_peak_bytes: The calibrated estimate (``None`` for an inferred decision).
        inferred_min_peak_bytes: For a decision inferred from an over-ceiling trial, that trial's
            measured peak: a lower bound of this config's (``None`` after an OOM, which says only "over").
        inferred_from: The measured trial an inferred decision rests on.
    """

    reason: str
    predicted_peak_bytes: int | None = None
    inferred_min_peak_bytes: int | None = None
    inferred_from: int | None = None

    def to_result(self, ceiling_bytes: int) -> TrialResult:
        """The stored result: status ``screened``, nothing measured (``peak_memory_bytes`` stays 0);
        the prediction or the inferred bound is kept in ``memory_peaks`` under its own name."""
        peaks = {}
        if self.predicted_peak_bytes is not None:
            peaks[PREDICTED_PEAK_KEY] = self.predicted_peak_bytes
        if self.inferred_min_peak_bytes is not None:
            peaks[INFERRED_MIN_PEAK_KEY] = self.inferred_min_peak_bytes
        return TrialResult(status=Status.SCREENED, error=self.reason, memory_peaks=peaks, ceiling_bytes=ceiling_bytes)


def screened_excess_gib(result: TrialResult) -> float | None:
    """``peak - ceiling`` in GiB of a screened config, from its prediction or inferred lower bound.

    ``None`` when nothing says by how much (inferred from an OOM): the caller uses its default.
    """
    bound = result.memory_peaks.get(PREDICTED_PEAK_KEY) or result.memory_peaks.get(INFERRED_MIN_PEAK_KEY)
    if not bound or fits(bound, result.ceiling_bytes):
        return None
    return excess_gib(bound, result.ceiling_bytes)


def margin_for(fit: MemoryFit) -> float:
    """How far over the ceiling a prediction must be to screen, given how well the model fits."""
    if fit.points == 0 or fit.max_relative_error is None:
        return UNCALIBRATED_MARGIN
    margin = 1.0 + max(MIN_CALIBRATED_MARGIN - 1.0, CALIBRATED_ERROR_SAFETY * fit.max_relative_error)
    return min(margin, UNCALIBRATED_MARGIN)


def memory_fit_from_trials(
    model: ModelSpec, seq_len: int, prior: MemoryFit, measured: Sequence[MeasuredTrial]
) -> MemoryFit:
    """Fit the memory model, from its prior, on the study's trials that measured a peak (``PEAK_MEASURED_STATUSES``)."""
    points = [
        MeasuredMemory(trial.config, trial.result.peak_memory_bytes)
        for trial in measured
        if trial.result.status in PEAK_MEASURED_STATUSES and trial.result.peak_memory_bytes > 0
    ]
    return fit_memory(model, seq_len, points, prior)


def infer_from_memory_failures(config: TrialConfig, measured: Sequence[MeasuredTrial]) -> ScreenDecision | None:
    """A config that differs from an OOM or over-ceiling trial only by a larger value of a lever whose
    memory grows with its value (``Lever.grows_memory``: the micro-batch)."""
    growing = [lever.name for lever in LEVERS.values() if lever.grows_memory]
    for trial in measured:
        if trial.result.status not in MEMORY_EXCEEDED_STATUSES:
            continue
        larger = next((name for name in growing if _only_larger(config, trial.config, name)), None)
        if larger is None:
            continue
        what = "ran out of memory" if trial.result.status == Status.OOM else "went over the ceiling"
        ours, theirs = getattr(config, larger), getattr(trial.config, larger)
        return ScreenDecision(
            reason=f"screened: inferred, {larger} {ours} > {theirs} of trial #{trial.number}, which {what} (not run)",
            inferred_min_peak_bytes=trial.result.peak_memory_bytes
            if trial.result.status == Status.OVER_CEILING
            else None,
            inferred_from=trial.number,
        )
    return None


def _only_larger(config: TrialConfig, smaller: TrialConfig, name: str) -> bool:
    """Whether ``config`` is ``smaller`` with a larger value of the lever ``name`` and nothing else changed."""
    value = getattr(config, name)
    return getattr(smaller, name) < value and dataclasses.replace(smaller, **{name: value}) == config


def predict_over_ceiling(estimate: MemoryEstimate, ceiling_bytes: int, fit: MemoryFit) -> ScreenDecision | None:
    """Screen when the fitted estimate is over ``ceiling * margin``."""
    margin = margin_for(fit)
    predicted = estimate.total_bytes
    if fits(predicted, ceiling_bytes * margin):
        return None
    return ScreenDecision(
        reason=f"screened: predicted peak {format_bytes(predicted)} > ceiling {format_bytes(ceiling_bytes)} "
        f"x {margin:.2f} (estimate, not run)",
        predicted_peak_bytes=predicted,
    )


def screen(config: TrialConfig, workload: Workload, measured: Sequence[MeasuredTrial]) -> ScreenDecision | None:
    """Whether ``config`` is known not to fit, by inference from measured failures, then by estimate
    (the workload's memory prior, fitted on the measured trials)."""
    inferred = infer_from_memory_failures(config, measured)
    if inferred is not None:
        return inferred
    fit = memory_fit_from_trials(workload.model, workload.seq_len, workload.memory_prior, measured)
    estimate = estimate_peak(workload.model, config, workload.seq_len, fit)
    return predict_over_ceiling(estimate, workload.ceiling_bytes, fit) or host_over_ceiling(
        estimate, workload.host_ceiling_bytes, workload.devices_per_trial
    )


def host_over_ceiling(
    estimate: MemoryEstimate, host_ceiling_bytes: int | None, ranks: int = 1
) -> ScreenDecision | None:
    """Screen an offload config whose host memory is over ``--host-memory-ceiling``
    (:meth:`MemoryEstimate.host_fits`): it would swap, or fail to pin. What each rank keeps there
    (``MemoryEstimate.host_bytes``: ZeRO offload's optimizer states, and at stage 3 parameters; TRL's offloaded
    activations) counts once per rank: a trial's ranks share one host."""
    if host_ceiling_bytes is None or estimate.host_fits(host_ceiling_bytes, ranks):
        return None
    per_rank = f" ({format_bytes(estimate.host_bytes)} per rank x {ranks} ranks)" if ranks > 1 else ""
    return ScreenDecision(
        reason=f"screened: offloaded host memory {format_bytes(estimate.trial_host_bytes(ranks))}{per_rank} > host "
        f"memory ceiling {format_bytes(host_ceiling_bytes)} (estimate, not run: it would swap)",
        predicted_peak_bytes=estimate.total_bytes,
    )


def record_predictions(
    trial: optuna.Trial, config: TrialConfig, workload: Workload, measured: Sequence[MeasuredTrial]
) -> None:
    """Write the config's predictions into the trial when it is proposed, before it runs or is screened:
    its peak, the calibrated estimate (on the trials measured so far, as :func:`screen` computes it) and
    the memory model's prior, and the throughput prior's real tokens/s. Every trial then compares a
    prediction with what it measured, not only the screened ones, which never run."""
    model, seq_len, prior = workload.model, workload.seq_len, workload.memory_prior
    fit = memory_fit_from_trials(model, seq_len, prior, measured)
    prior_estimate = estimate_peak(model, config, seq_len, prior)
    trial.set_user_attr(schema.TRIAL_PRIOR_PEAK_BYTES, prior_estimate.total_bytes)
    if prior_estimate.host_bytes:
        trial.set_user_attr(schema.TRIAL_PREDICTED_HOST_BYTES, prior_estimate.host_bytes)
    trial.set_user_attr(schema.TRIAL_PREDICTED_PEAK_BYTES, estimate_peak(model, config, seq_len, fit).total_bytes)
    speed = workload.speed_model().estimate(model, config, seq_len)
    if speed is not None:  # None where the prior has no peak for the device's dtype
        trial.set_user_attr(schema.TRIAL_PRIOR_TOKENS_PER_S, speed.tokens_per_s)


def with_predicted_peaks(result: TrialResult, user_attrs: Mapping[str, object]) -> TrialResult:
    """``result`` with the trial's predictions (:func:`record_predictions`) in its ``memory_peaks``,
    beside what it measured, so every view of the result shows predicted against measured."""
    for key in (schema.TRIAL_PREDICTED_PEAK_BYTES, schema.TRIAL_PRIOR_PEAK_BYTES, schema.TRIAL_PREDICTED_HOST_BYTES):
        value = user_attrs.get(key)
        if isinstance(value, int) and key not in result.memory_peaks:
            result.memory_peaks[key] = value
    return result


def refuse_if_nothing_fits(choices: dict[str, list[Any]], workload: Workload) -> None:
    """Before the first trial: stop when the memory prior puts every config of the space over the
    ceiling by more than its margin (screening would screen them all), saying what would fit.

    Raises:
        AutotuneError: One line: the smallest predicted peak and the lever values predicted to fit
            (:func:`autotune.estimate.what_would_fit`, which ``autotune estimate`` prints as a table).
    """
    prior = workload.memory_prior
    advice = what_would_fit(workload.model, choices, workload.seq_len, prior, workload.ceiling_bytes, workload.device)
    if advice is None or fits(advice.smallest.estimate.total_bytes, workload.ceiling_bytes * margin_for(prior)):
        return
    raise AutotuneError(
        f"{advice.sentence()}. No trial run: add that to the space (autotune estimate shows the table), or pass "
        "--no-screen to measure anyway"
    )
