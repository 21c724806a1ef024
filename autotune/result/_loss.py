"""Does a trial train? Its training loss over the measured steps, skipped optimizer steps, divergence.

Speed levers change numerics: fp16 without a working loss scale overflows and its grad scaler skips
optimizer steps (a skipped step is cheaper, so the trial would look faster than it is); 8-bit and
factored optimizers and compilation can change what training does. A fast config that does not
train is not a winner. Each trial child records:

* the training loss of every optimizer step, read from the Trainer's own running loss (see
  ``autotune.runner._loss_recorder.LossRecorder`` for why that and not logging or a hook);
* the optimizer steps the grad scaler skipped (accelerate's ``AcceleratedOptimizer.step_was_skipped``);
* whether the weights are still finite when training ends.

A trial is ``diverged`` (infeasible: never ranked, never exported) when its loss or its weights
went non-finite, when the scaler skipped every measured step, or when its loss ends far above the
HF default trial's over the same steps (:func:`loss_grew_beyond`; the tolerance and the spread it
was chosen against are in docs/benchmarks.md, "Numerics: loss against the HF default").
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autotune.result._trial_result import (
    RAN_NORMALLY_STATUSES,
    Status,
    TrialResult,
    hf_default_trial,
    measured_constraint_gib,
    objective_value,
)
from autotune.storage import schema

if TYPE_CHECKING:
    from optuna.trial import FrozenTrial

# The loss at the end of the steps a trial shares with the HF default, relative to its step-1 loss,
# may exceed the default's by this fraction at most. Healthy configs of bert-tiny and gpt2-tiny on
# synthetic tokens (fp32, bf16, AdamW, fused AdamW, Adafactor, SGD, 8-bit AdamW, compile, other
# batch shapes, checkpointing) ended within 1.3 % of the default; runaway learning rates 40 % to
# 2700x above it (docs/benchmarks.md, "Numerics: loss against the HF default").
LOSS_GROWTH_TOLERANCE = 0.25
# Losses averaged at the end of the shared steps: one noisy step must not decide.
LOSS_END_WINDOW = 5
# Fewer shared steps than this say nothing about a curve (the comparison is skipped, and says so).
MIN_SHARED_STEPS = 3
# Significant digits kept per recorded loss: the curve is stored with the trial (about 45 floats).
LOSS_DIGITS = 6


@dataclasses.dataclass(frozen=True)
class LossRecord:
    """What a trial recorded of its training numerics (kept in :class:`~autotune.result.TrialResult`).

    Attributes:
        curve: The loss of every optimizer step from global step 1, warm-up included (``None``
            where it was not finite, or could not be read once the running loss was non-finite).
        measured_from: The first measured global step (steps before it were warm-up).
        nonfinite: ``[step, "nan" | "inf" | "-inf"]`` for each step whose loss was not finite.
        skipped_steps: Global steps the grad scaler skipped (warm-up included).
        skipped_measured: How many of the measured steps were skipped.
        weights_finite: The weights were finite after training (``None``: not checked).
    """

    curve: list[float | None]
    measured_from: int
    nonfinite: list[list[Any]]
    skipped_steps: list[int]
    skipped_measured: int
    weights_finite: bool | None


def loss_record(
    losses: Sequence[float], skipped_steps: Sequence[int], measured_steps: Sequence[int], weights_finite: bool | None
) -> LossRecord:
    """Summarise what a trial read over its steps.

    Args:
        losses: The loss of every optimizer step, from global step 1.
        skipped_steps: Global steps the grad scaler skipped.
        measured_steps: Global steps the step timer measured (not warm-up).
        weights_finite: Whether the weights were finite after training (``None``: not checked).
    """
    curve: list[float | None] = []
    nonfinite: list[list[Any]] = []
    for step, value in enumerate(losses, start=1):
        if math.isfinite(value):
            curve.append(float(f"{value:.{LOSS_DIGITS}g}"))
        else:
            curve.append(None)
            nonfinite.append([step, _nonfinite_name(value)])
    return LossRecord(
        curve=curve,
        measured_from=min(measured_steps) if measured_steps else len(curve) + 1,
        nonfinite=nonfinite,
        skipped_steps=list(skipped_steps),
        skipped_measured=skipped_among(measured_steps, skipped_steps),
        weights_finite=weights_finite,
    )


def skipped_among(measured_steps: Sequence[int], skipped_steps: Sequence[int]) -> int:
    """How many of the measured global steps the grad scaler skipped."""
    return len(set(measured_steps) & set(skipped_steps))


def _nonfinite_name(value: float) -> str:
    if math.isnan(value):
        return "nan"
    return "inf" if value > 0 else "-inf"


def trained_fraction(measured_steps: int, skipped_measured: int) -> float:
    """Fraction of the measured optimizer steps that updated the weights (1.0 with none measured)."""
    if measured_steps <= 0:
        return 1.0
    return max(measured_steps - skipped_measured, 0) / measured_steps


def nonfinite_reason(record: LossRecord, measured_steps: int) -> str | None:
    """Why a trial did not train, judged on its own numbers; ``None`` if nothing is wrong.

    Non-finite loss at any step, non-finite weights after training, or every measured step
    skipped by the grad scaler (no sample was trained on while measuring).
    """
    if record.nonfinite:
        step, value = record.nonfinite[0]
        more = f" (and {len(record.nonfinite) - 1} more steps)" if len(record.nonfinite) > 1 else ""
        return f"diverged: training loss {value} at step {step}{more}"
    if record.weights_finite is False:
        return (
            "diverged: the weights hold inf/NaN after training (a non-finite loss, which the Trainer's "
            "logging_nan_inf_filter hides from its running loss)"
        )
    if measured_steps > 0 and record.skipped_measured >= measured_steps:
        return f"diverged: the fp16 grad scaler skipped all {measured_steps} measured optimizer steps (nothing trained)"
    return None


@dataclasses.dataclass(frozen=True)
class LossComparison:
    """A trial's loss against the HF default's over the steps both ran, each relative to its step 1.

    Every trial starts from the same weights (seed 0), so its step-1 loss (taken before any update)
    is the same up to the batch drawn and the dtype, except for a constant factor the Trainer can
    introduce: for a model that accepts ``**kwargs`` but does not normalise its loss by
    ``num_items_in_batch`` (sequence classification, for one), transformers 5 does not divide the
    micro-batch losses by the accumulation steps (``trainer.py``, ``training_step``), so a config
    with accumulation 2 reports twice the loss, from step 1 on. Dividing each curve by its own
    step-1 loss removes that factor; what remains is how the loss moved.

    Attributes:
        steps: The shared global steps (both ran them, both losses finite), in order.
        trial_losses: The trial's loss at those steps (as the Trainer reports it).
        default_losses: The default's.
        trial_start: The trial's loss at step 1 (the scale it is judged relative to).
        default_start: The default's.
        trial_end: Mean of the trial's last :data:`LOSS_END_WINDOW` shared losses.
        default_end: The same for the default.
    """

    steps: list[int]
    trial_losses: list[float]
    default_losses: list[float]
    trial_start: float
    default_start: float
    trial_end: float
    default_end: float

    @property
    def end_steps(self) -> list[int]:
        """The shared steps the end losses average."""
        return self.steps[-LOSS_END_WINDOW:]

    @property
    def relative_excess(self) -> float:
        """How far the trial's end/start loss ratio is above the default's, as a fraction of it."""
        default_ratio = self.default_end / self.default_start
        if default_ratio <= 0:
            return 0.0 if self.trial_end <= 0 else math.inf
        return (self.trial_end / self.trial_start) / default_ratio - 1.0

    @property
    def agree(self) -> bool:
        """Within :data:`LOSS_GROWTH_TOLERANCE` of the default (a faster fall always agrees)."""
        return self.relative_excess <= LOSS_GROWTH_TOLERANCE

    def describe(self, trial_label: str, default_label: str) -> str:
        """One sentence: both losses at step 1 and at the end, how far apart, whether they agree."""
        end = self.end_steps
        verdict = "agree" if self.agree else "disagree"
        limit = "within" if self.agree else "beyond"
        return (
            f"the losses {verdict}: {trial_label} {_loss_text(self.trial_start)} at step 1 -> {_loss_text(self.trial_end)}, "
            f"{default_label} {_loss_text(self.default_start)} -> {_loss_text(self.default_end)} (mean training loss over "
            f"steps {end[0]}-{end[-1]}); relative to each one's step-1 loss, {trial_label} ends "
            f"{self.relative_excess:+.1%} from {default_label}, {limit} the +{LOSS_GROWTH_TOLERANCE:.0%} tolerance"
        )


def finite_losses(curve: Sequence[float | None]) -> dict[int, float]:
    """Finite losses by global step (warm-up included: a warm-up step trains like any other)."""
    return {step: value for step, value in enumerate(curve, start=1) if value is not None and math.isfinite(value)}


def compare_losses(trial_curve: Sequence[float | None], default_curve: Sequence[float | None]) -> LossComparison | None:
    """The trial against the default over the steps they share.

    ``None`` when they share fewer than :data:`MIN_SHARED_STEPS` finite steps, or a step-1 loss
    is missing or not positive (nothing to scale by).
    """
    trial = finite_losses(trial_curve)
    default = finite_losses(default_curve)
    steps = sorted(set(trial) & set(default))
    if len(steps) < MIN_SHARED_STEPS or steps[0] != 1 or trial[1] <= 0 or default[1] <= 0:
        return None
    end = steps[-LOSS_END_WINDOW:]
    return LossComparison(
        steps=steps,
        trial_losses=[trial[s] for s in steps],
        default_losses=[default[s] for s in steps],
        trial_start=trial[1],
        default_start=default[1],
        trial_end=statistics.fmean(trial[s] for s in end),
        default_end=statistics.fmean(default[s] for s in end),
    )


def loss_grew_beyond(comparison: LossComparison | None) -> str | None:
    """The ``diverged`` reason when the trial's loss ends far above the default's; else ``None``."""
    if comparison is None or comparison.agree:
        return None
    end = comparison.end_steps
    return (
        f"diverged: training loss {_loss_text(comparison.trial_start)} at step 1 -> {_loss_text(comparison.trial_end)} at "
        f"steps {end[0]}-{end[-1]}, the HF default's {_loss_text(comparison.default_start)} -> {_loss_text(comparison.default_end)} "
        f"({comparison.relative_excess:+.0%} relative to step 1; tolerance +{LOSS_GROWTH_TOLERANCE:.0%})"
    )


def hf_default_result(trials: Sequence[FrozenTrial]) -> tuple[int, TrialResult] | None:
    """The first HF default seed trial that ran, with its result (``None`` if none has finished).

    Its loss is the reference every other trial is judged against: same steps, seed and data.
    """
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.user_attrs.get(schema.TRIAL_SEED) != schema.SEED_HF_DEFAULT or not trial.state.is_finished():
            continue
        if schema.TRIAL_REUSED_FROM in trial.user_attrs:
            continue
        result = TrialResult.from_trial(trial)
        if result is not None and result.loss_curve:
            return trial.number, result
    return None


def loss_reference(trials: Sequence[FrozenTrial]) -> TrialResult | None:
    """The HF default's result if its loss can serve as the reference (it ran and did not diverge)."""
    found = hf_default_result(trials)
    if found is None or found[1].status not in RAN_NORMALLY_STATUSES:
        return None
    return found[1]


def compare_with(result: TrialResult, reference: TrialResult) -> LossComparison | None:
    """``result``'s loss against ``reference``'s over the measured steps both have."""
    return compare_losses(result.loss_curve, reference.loss_curve)


def diverged_from_reference(result: TrialResult, reference: TrialResult | None) -> str | None:
    """The ``diverged`` reason when ``result``'s loss ended far above the reference's; else ``None``."""
    if reference is None or result is reference or not result.loss_curve:
        return None
    return loss_grew_beyond(compare_with(result, reference))


def judge_against_default(result: TrialResult, reference: TrialResult | None) -> TrialResult:
    """``result`` as ``diverged`` (the reason in its error) when an ``ok`` trial's loss ended far above
    the HF default's; otherwise ``result`` unchanged. The one judgement of a loss against the
    default's: the record step applies it as a trial is told, :func:`judged_trials` for every reader."""
    if result.status != Status.OK:
        return result
    reason = diverged_from_reference(result, reference)
    if reason is None:
        return result
    return dataclasses.replace(result, status=Status.DIVERGED, error=reason)


def judged_trials(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The trials as recorded once the HF default's loss is known: the one view every reader of
    feasibility takes (the ranking, hence ``autotune best``, the export and the report; the dashboard's
    trial list and best trial; confirmation's candidates; the prune threshold).

    With several workers a trial can be told before the HF default's loss exists, so the record step
    had nothing to judge it against and stored it ``ok``, feasible. Its stored record cannot be
    corrected afterwards: Optuna refuses to update a finished trial (``RDBStorage`` calls
    ``check_trial_is_updatable`` before setting any attr, optuna/storages/_rdb/storage.py), and each
    process's ``_CachedStorage`` keeps a finished trial as first read (optuna/storages/_cached_storage.py). So such a trial is judged here,
    by :func:`judge_against_default` against the same reference, each time trials are read; one it
    finds diverged comes back as a copy recorded as :func:`autotune.study.tell` would have recorded
    it: status ``diverged``, value 0, a violated constraint. A trial judged when told is unchanged
    (the judgement is idempotent), so every reader sees the same statuses whatever the order the
    trials finished in.
    """
    reference = loss_reference(trials)
    if reference is None:
        return list(trials)
    judged = []
    for trial in trials:
        result = TrialResult.from_trial(trial) if trial.state.is_finished() else None
        verdict = judge_against_default(result, reference) if result is not None else None
        if verdict is None or verdict is result:
            judged.append(trial)
            continue
        recorded = copy.copy(trial)
        recorded.user_attrs = {
            **trial.user_attrs,
            schema.TRIAL_RESULT: verdict.to_dict(),
            schema.TRIAL_STATUS: verdict.status,
        }
        recorded.system_attrs = {**trial.system_attrs, schema.TRIAL_CONSTRAINTS: [measured_constraint_gib(verdict)]}
        recorded.value = objective_value(verdict)
        judged.append(recorded)
    return judged


# Steps shown in the terminal's one-line loss curve (first and last shared steps included).
CURVE_POINTS_SHOWN = 8


@dataclasses.dataclass(frozen=True)
class WinnerLoss:
    """The winner's training loss beside the HF default's, for the closing summary and the report.

    Attributes:
        winner_trial: The winner's trial number.
        winner: Its result (loss curve included).
        default_trial: The HF default trial's number (``None``: it has not run).
        default: Its result.
        comparison: The two over their shared measured steps (``None``: no usable reference or too
            few shared steps; :meth:`describe` says which).
        baseline: The default trial's name in words (``HF default``; ``TRL default`` under SFTTrainer).
    """

    winner_trial: int
    winner: TrialResult
    default_trial: int | None
    default: TrialResult | None
    comparison: LossComparison | None
    baseline: str = "HF default"

    def describe(self) -> str:
        """One sentence on whether the winner trains as the default (:attr:`baseline`) does (losses per sample)."""
        note = accumulation_note(self.winner)
        return self._describe() + (f"; winner #{self.winner_trial}: {note}" if note else "")

    def _describe(self) -> str:
        own = f"first {_loss_text(self.winner.loss_first)}, last {_loss_text(self.winner.loss_last)} over its measured steps"
        if self.default_trial is None or self.default is None:
            return f"training loss of winner #{self.winner_trial}: {own}; the {self.baseline} trial has not run, so only non-finite values were checked"
        if self.default_trial == self.winner_trial:
            return f"training loss: the winner is the {self.baseline} trial #{self.winner_trial} itself ({own})"
        if self.default.status not in RAN_NORMALLY_STATUSES:
            return (
                f"training loss of winner #{self.winner_trial}: {own}; the {self.baseline} #{self.default_trial} is "
                f"{self.default.status}, so it gives no reference loss (only non-finite values were checked)"
            )
        if self.comparison is None:
            return (
                f"training loss of winner #{self.winner_trial}: {own}; it shares fewer than {MIN_SHARED_STEPS} measured "
                f"steps with the {self.baseline} #{self.default_trial}, so they were not compared"
            )
        return (
            f"training loss, winner #{self.winner_trial} vs {self.baseline} #{self.default_trial}: "
            + self.comparison.describe("winner", "default")
        )

    def curve_text(self, points: int = CURVE_POINTS_SHOWN) -> str | None:
        """The two curves at a few shared steps, ``step: winner / default``; ``None`` if not compared."""
        if self.comparison is None:
            return None
        steps = self.comparison.steps
        picked = sorted({round(i * (len(steps) - 1) / max(points - 1, 1)) for i in range(points)})
        pairs = [
            f"{steps[i]}: {self.comparison.trial_losses[i]:.4g} / {self.comparison.default_losses[i]:.4g}"
            for i in picked
        ]
        return f"loss by step (winner / {self.baseline}): " + ", ".join(pairs)


# What ``gradients xk`` means, for k accumulated micro-batches (the trial tables say it once, under the table).
ACCUMULATION_MEANING = "the Trainer adds up {steps} micro-batch mean losses (loss shown per sample)"


def accumulation_note(result: TrialResult) -> str | None:
    """The one sentence on a trial whose Trainer adds up its micro-batches' mean losses
    (:attr:`TrialResult.gradient_scale` above 1); ``None`` for any other."""
    if result.gradient_scale <= 1:
        return None
    steps = result.gradient_scale
    return f"gradients x{steps}: {ACCUMULATION_MEANING.format(steps=steps)}"


def _loss_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def winner_loss(
    trials: Sequence[FrozenTrial], winner_trial: int, winner: TrialResult, baseline: str = "HF default"
) -> WinnerLoss:
    """The winner's loss against the default trial's, ``baseline`` in words (see :class:`WinnerLoss`)."""
    found = hf_default_result(trials)
    if found is None:
        failed = hf_default_trial(trials)  # one that failed for good (a timeout, a crash) is said as such
        result = TrialResult.from_trial(failed) if failed is not None else None
        if failed is None or result is None:
            return WinnerLoss(winner_trial, winner, None, None, None, baseline)
        return WinnerLoss(winner_trial, winner, failed.number, result, None, baseline)
    default_trial, default = found
    usable = default.status in RAN_NORMALLY_STATUSES and default_trial != winner_trial
    comparison = compare_with(winner, default) if usable else None
    return WinnerLoss(winner_trial, winner, default_trial, default, comparison, baseline)


def diverged_trials(trials: Sequence[FrozenTrial]) -> list[tuple[int, TrialResult]]:
    """Trials that ran but do not train (``diverged`` when told, or judged so since), fastest first."""
    found = []
    for trial in judged_trials(trials):
        result = TrialResult.from_trial(trial) if trial.state.is_finished() else None
        if result is None or schema.TRIAL_REUSED_FROM in trial.user_attrs:
            continue
        if result.status == Status.DIVERGED:
            found.append((trial.number, result))
    return sorted(found, key=lambda item: -item[1].samples_per_s)
