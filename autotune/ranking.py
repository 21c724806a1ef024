"""Rank a study's trials: feasible ones by throughput, confirmed leaders first, ties broken by memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import TrialConfig
from autotune.result import TrialResult

# Study user attr holding the last confirmation (see autotune.confirm): {"trials": {"<number>": {...}}}.
# A study attr because Optuna refuses writes to finished trials.
CONFIRMATION_ATTR = "confirmation"


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
        confirmation: The whole confirmation record (re-runs, their CV, peak memory), if any.
    """

    number: int
    state: str
    config: TrialConfig
    result: TrialResult | None
    confirmed_samples_per_s: float | None = None
    ties_with_leader: bool = False
    confirmation: dict[str, Any] | None = None

    @property
    def samples_per_s(self) -> float:
        """The figure the ranking uses: the confirmed median where there is one."""
        if self.confirmed_samples_per_s is not None:
            return self.confirmed_samples_per_s
        return self.result.samples_per_s if self.result else 0.0

    @property
    def useful_tflops(self) -> float:
        """Model TFLOPs, the useful work per second (real tokens only with ``--dataset``, see
        autotune/flops.py: model_tflops); the confirmed figure where there is one."""
        confirmed = ((self.confirmation or {}).get("figures") or {}).get("model_tflops")
        if confirmed is not None:
            return float(confirmed)
        if self.result is None or self.result.samples_per_s <= 0:
            return 0.0
        # A confirmation that kept only samples/s: the search's useful work per sample, at that rate.
        return self.result.model_tflops * self.samples_per_s / self.result.samples_per_s

    @property
    def confirmed(self) -> bool:
        return self.confirmation is not None

    @property
    def peak_memory_bytes(self) -> int:
        """Peak memory for tie-breaking: the largest seen, at search or confirmation."""
        search_peak = self.result.peak_memory_bytes if self.result else 0
        return max(search_peak, int((self.confirmation or {}).get("peak_memory_bytes") or 0))


def confirmations_of(study: optuna.Study) -> dict[int, dict[str, Any]]:
    """The last confirmation's records by trial number, while they still confirm the leaders.

    A confirmation re-measured the top-k trials by search-time figure. Once later trials change
    that top-k (a resumed search found a new contender), it no longer says who wins: it is ignored,
    and the ranking falls back to search-time figures until the next confirmation.

    Returns:
        Trial number -> confirmation record; empty if never confirmed, or stale.
    """
    record = study.user_attrs.get(CONFIRMATION_ATTR) or {}
    confirmed = {int(number): values for number, values in (record.get("trials") or {}).items()}
    if not confirmed:
        return {}
    top_k = int(record.get("top_k") or len(confirmed))
    leaders = {r.number for r in feasible_ranking(study.get_trials(deepcopy=False), confirmations={})[:top_k]}
    return confirmed if leaders == set(confirmed) else {}


def to_ranked(trial: FrozenTrial, confirmation: dict[str, Any] | None = None) -> RankedTrial:
    """A trial as the tables see it, with its confirmation record if it has one."""
    return RankedTrial(
        number=trial.number,
        state=trial.state.name,
        config=TrialConfig.from_params(trial.params),
        # A queued re-run carries its failed original's attrs (Optuna's retry copies them): it has no result of its own yet.
        result=TrialResult.from_trial(trial) if trial.state.is_finished() else None,
        confirmed_samples_per_s=(confirmation or {}).get("samples_per_s"),
        ties_with_leader=bool((confirmation or {}).get("ties_with_leader", False)),
        confirmation=confirmation,
    )


def feasible_ranking(
    trials: Sequence[FrozenTrial], confirmations: Mapping[int, dict[str, Any]] | None = None
) -> list[RankedTrial]:
    """Trials that ran and fit under the ceiling, fastest first (each config once).

    Ranked by model TFLOPs, the useful work (then samples/s): recomputation (hardware FLOPs) never
    raises a rank, and with ``--dataset`` padding is not useful work (only real tokens count), so a
    config that pads less ranks higher for the same samples/s. With synthetic tokens model TFLOPs
    is proportional to samples/s for one model and sequence length.

    Order: confirmed trials first, by their confirmed median, with the leader and every trial
    tied with it (within noise) ordered by peak memory, smaller first; then unconfirmed trials by
    their search-time figure (a single measurement does not outrank a confirmed one). A trial
    whose confirmation found it infeasible (a re-run ran out of memory or went over the ceiling)
    is left out.

    Args:
        trials: The study's trials.
        confirmations: Confirmation records by trial number (:func:`confirmations_of`); ``{}``
            ranks by search-time figures only.
    """
    confirmations = confirmations or {}
    ranked = [
        to_ranked(t, confirmations.get(t.number))
        for t in trials
        if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs
    ]
    ranked = [r for r in ranked if r.result is not None and r.result.feasible]
    ranked = [r for r in ranked if r.confirmation is None or r.confirmation.get("feasible", True)]
    confirmed = sorted((r for r in ranked if r.confirmed), key=_useful_work_first)
    unconfirmed = sorted((r for r in ranked if not r.confirmed), key=_useful_work_first)
    tied = [r for r in confirmed if r.ties_with_leader]
    if tied:
        tied.sort(key=lambda r: (r.peak_memory_bytes, -r.samples_per_s))
        confirmed = tied + [r for r in confirmed if not r.ties_with_leader]
    return confirmed + unconfirmed


def _useful_work_first(row: RankedTrial) -> tuple[float, float]:
    return (-row.useful_tflops, -row.samples_per_s)


def study_ranking(study: optuna.Study) -> list[RankedTrial]:
    """:func:`feasible_ranking` of a study, with its last confirmation applied."""
    return feasible_ranking(study.get_trials(deepcopy=False), confirmations_of(study))


def all_trials(trials: Sequence[FrozenTrial], confirmations: Mapping[int, dict[str, Any]] | None = None) -> list[RankedTrial]:
    """Every trial in number order, whatever its status."""
    confirmations = confirmations or {}
    return [to_ranked(t, confirmations.get(t.number)) for t in sorted(trials, key=lambda t: t.number)]
