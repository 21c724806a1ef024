"""Rank a study's trials: feasible ones by throughput, ties within noise broken by memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from optuna.trial import FrozenTrial, TrialState

from autotune.config import TrialConfig
from autotune.result import TrialResult


@dataclasses.dataclass(frozen=True)
class RankedTrial:
    """A trial with its config and result, as the tables and the exporter see it.

    Attributes:
        number: The Optuna trial number.
        state: The Optuna trial state name (COMPLETE, FAIL, PRUNED, RUNNING, WAITING).
        config: The knobs it ran with.
        result: What it measured (``None`` for trials still running).
        confirmed_samples_per_s: Median of the end-of-search re-measurement, if it was confirmed.
        ties_with_leader: Within noise of the top trial after confirmation.
    """

    number: int
    state: str
    config: TrialConfig
    result: TrialResult | None
    confirmed_samples_per_s: float | None = None
    ties_with_leader: bool = False

    @property
    def samples_per_s(self) -> float:
        """The figure the ranking uses: the confirmed median where there is one."""
        if self.confirmed_samples_per_s is not None:
            return self.confirmed_samples_per_s
        return self.result.samples_per_s if self.result else 0.0


def to_ranked(trial: FrozenTrial) -> RankedTrial:
    confirmation = trial.user_attrs.get("confirmation") or {}
    return RankedTrial(
        number=trial.number,
        state=trial.state.name,
        config=TrialConfig.from_params(trial.params),
        result=TrialResult.from_trial(trial),
        confirmed_samples_per_s=confirmation.get("samples_per_s"),
        ties_with_leader=bool(confirmation.get("ties_with_leader", False)),
    )


def feasible_ranking(trials: Sequence[FrozenTrial]) -> list[RankedTrial]:
    """Trials that ran and fit under the ceiling, fastest first (each config once).

    For one model and sequence length, model TFLOPs is proportional to samples/s, so ranking by
    samples/s ranks by model TFLOPs; recomputation (hardware FLOPs) never raises a rank. Confirmed
    leaders that tie within noise are ordered by peak memory, smaller first.
    """
    ranked = [
        to_ranked(t)
        for t in trials
        if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs
    ]
    ranked = [r for r in ranked if r.result is not None and r.result.feasible]
    ranked.sort(key=lambda r: -r.samples_per_s)
    tied = [r for r in ranked if r.ties_with_leader]
    if tied:
        tied.sort(key=lambda r: r.result.peak_memory_bytes if r.result else 0)
        ranked = tied + [r for r in ranked if not r.ties_with_leader]
    return ranked


def all_trials(trials: Sequence[FrozenTrial]) -> list[RankedTrial]:
    """Every trial in number order, whatever its status."""
    return [to_ranked(t) for t in sorted(trials, key=lambda t: t.number)]
