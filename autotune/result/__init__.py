"""The outcome of a trial, and whether it trained.

``_trial_result``: :class:`TrialResult`, the JSON record of one trial (status, throughput, FLOPs, memory by
source), stored in the trial's user attrs, and :class:`Status`, the one vocabulary of how a trial ended and its
groups. ``_verification``: what ``autotune verify`` compares (:class:`StudyAnswer`) and finds
(:class:`Verification`). ``_time_spent``: :class:`TimeSpent`, where a search's wall time went. ``_run_time``: the user's whole
run, its length, projected wall time and cost (:func:`run_time_line`). ``_profile``: :class:`StepProfile`, where a profiled trial's step time went. ``_loss``: the loss every trial records, the ``diverged`` rules, and the comparison with the HF default's
loss (:func:`judge_against_default`, :func:`judged_trials`).
"""

from __future__ import annotations

from autotune.result._loss import (
    ACCUMULATION_MEANING,
    accumulation_note,
    diverged_trials,
    judge_against_default,
    judged_trials,
    loss_record,
    loss_reference,
    nonfinite_reason,
    skipped_among,
    trained_fraction,
    winner_loss,
)
from autotune.result._profile import HOST_BOUND_BELOW, ProfiledOp, StepProfile
from autotune.result._run_time import (
    Pace,
    RunLength,
    dataset_samples,
    duration,
    passes_over_data,
    projected_seconds,
    run_length,
    run_time_line,
    setup_pass_note,
)
from autotune.result._time_spent import TimeSpent
from autotune.result._trial_result import (
    FAILED_STATUSES,
    GIVEN_UP_STATUSES,
    INFEASIBLE_STATUSES,
    MEMORY_EXCEEDED_STATUSES,
    PEAK_MEASURED_STATUSES,
    RAN_NORMALLY_STATUSES,
    RETRIED_STATUSES,
    UNFINISHED_LABELS,
    UNKNOWN_EXCESS_GIB,
    ParamsKey,
    Status,
    TrialResult,
    came_back_counts,
    comparable_hf_default,
    feasible_by_speed,
    hf_default_trial,
    in_order,
    is_budget_trial,
    measured_constraint_gib,
    memory_source_description,
    objective_value,
    params_key,
    precision_note,
    worth_retrying,
)
from autotune.result._verification import FigureCheck, Judgement, StudyAnswer, Verification, VersionChange
from autotune.spec.measure import over_the_run  # one rule for measured and predicted rates: its home is spec

__all__ = [
    "FAILED_STATUSES",
    "HOST_BOUND_BELOW",
    "ProfiledOp",
    "StepProfile",
    "GIVEN_UP_STATUSES",
    "INFEASIBLE_STATUSES",
    "MEMORY_EXCEEDED_STATUSES",
    "PEAK_MEASURED_STATUSES",
    "FigureCheck",
    "Judgement",
    "Pace",
    "RunLength",
    "ParamsKey",
    "RAN_NORMALLY_STATUSES",
    "RETRIED_STATUSES",
    "Status",
    "StudyAnswer",
    "TimeSpent",
    "TrialResult",
    "UNFINISHED_LABELS",
    "UNKNOWN_EXCESS_GIB",
    "ACCUMULATION_MEANING",
    "Verification",
    "VersionChange",
    "accumulation_note",
    "came_back_counts",
    "comparable_hf_default",
    "dataset_samples",
    "duration",
    "diverged_trials",
    "feasible_by_speed",
    "hf_default_trial",
    "in_order",
    "is_budget_trial",
    "judge_against_default",
    "judged_trials",
    "loss_record",
    "loss_reference",
    "measured_constraint_gib",
    "memory_source_description",
    "nonfinite_reason",
    "objective_value",
    "params_key",
    "precision_note",
    "projected_seconds",
    "run_length",
    "over_the_run",
    "passes_over_data",
    "setup_pass_note",
    "run_time_line",
    "skipped_among",
    "trained_fraction",
    "winner_loss",
    "worth_retrying",
]
