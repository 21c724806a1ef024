"""Rank a study's trials: feasible ones by throughput, confirmed leaders first, ties broken by memory."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.levers import TrialConfig
from autotune.result import (
    Status,
    TrialResult,
    came_back_counts,
    feasible_by_speed,
    hf_default_trial,
    is_budget_trial,
    judged_trials,
    params_key,
)
from autotune.storage import schema
from autotune.trainers import DEFAULT, TrainerKind, of_identity
from autotune.units import format_bytes


@dataclasses.dataclass(frozen=True)
class RankedTrial:
    """A trial with its config and result, as the tables and the exporter see it.

    Attributes:
        number: The Optuna trial number.
        state: The Optuna trial state name (COMPLETE, FAIL, PRUNED, RUNNING, WAITING).
        config: The lever values it ran with.
        result: What it measured (``None`` for trials still running).
        confirmed_samples_per_s: Median of the end-of-search re-measurement, if it was confirmed.
        ties_with_leader: Within noise of the top trial after confirmation.
        unsettled: Still in question beside the top trial when the confirmation's budget ran out.
        confirmation: The whole confirmation record (re-runs, their CV, peak memory), if any.
    """

    number: int
    state: str
    config: TrialConfig
    result: TrialResult | None
    confirmed_samples_per_s: float | None = None
    ties_with_leader: bool = False
    unsettled: bool = False
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
        autotune/spec/flops.py: model_tflops); the confirmed figure where there is one."""
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
    record = study.user_attrs.get(schema.STUDY_CONFIRMATION) or {}
    confirmed = {int(number): values for number, values in (record.get("trials") or {}).items()}
    if not confirmed:
        return {}
    # The candidates it considered (those within the noise of the leader were re-run); a record
    # written before confirmation in proportion re-ran every candidate.
    candidates = {int(number) for number in record.get("candidates", confirmed)}
    top_k = int(record.get("top_k") or len(candidates))
    leaders = {r.number for r in feasible_ranking(study.get_trials(deepcopy=False), confirmations={})[:top_k]}
    return confirmed if leaders == candidates else {}


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
        unsettled=bool((confirmation or {}).get("unsettled", False)),
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

    Order: the confirmed leader (the fastest confirmed median) first, with every trial tied with it
    (within noise) ordered by peak memory, smaller first: a single measurement never outranks the
    confirmed winner (the best of many single figures is partly the luckiest). Then every other
    trial by its figure, the confirmed median where there is one (the HF default, re-run for the
    speedup, is not put above faster configs for having been re-run). A trial whose confirmation
    found it infeasible (a re-run ran out of memory or went over the ceiling) is left out.

    Args:
        trials: The study's trials.
        confirmations: Confirmation records by trial number (:func:`confirmations_of`); ``{}``
            ranks by search-time figures only.
    """
    confirmations = confirmations or {}
    # Judged as every reader judges them (a trial told before the HF default's loss existed included).
    ranked = [
        to_ranked(trial, confirmations.get(trial.number)) for trial, _ in feasible_by_speed(judged_trials(trials))
    ]
    ranked = [r for r in ranked if r.confirmation is None or r.confirmation.get("feasible", True)]
    confirmed = sorted((r for r in ranked if r.confirmed), key=_useful_work_first)
    if not confirmed:
        return sorted(ranked, key=_useful_work_first)
    head = [r for r in confirmed if r.ties_with_leader] or confirmed[:1]
    head.sort(key=lambda r: (r.peak_memory_bytes, -r.samples_per_s))
    return head + sorted((r for r in ranked if r not in head), key=_useful_work_first)


def _useful_work_first(row: RankedTrial) -> tuple[float, float]:
    return (-row.useful_tflops, -row.samples_per_s)


def study_ranking(study: optuna.Study) -> list[RankedTrial]:
    """:func:`feasible_ranking` of a study, with its last confirmation applied."""
    return feasible_ranking(study.get_trials(deepcopy=False), confirmations_of(study))


def all_trials(
    trials: Sequence[FrozenTrial], confirmations: Mapping[int, dict[str, Any]] | None = None
) -> list[RankedTrial]:
    """Every trial in number order, whatever its status (as judged: :func:`autotune.result._loss.judged_trials`)."""
    confirmations = confirmations or {}
    return [to_ranked(t, confirmations.get(t.number)) for t in sorted(judged_trials(trials), key=lambda t: t.number)]


@dataclasses.dataclass(frozen=True)
class SpeedupOverDefault:
    """The best feasible trial against the HF-default seed trial, both measured in this study.

    Attributes:
        default_trial: Number of the ``hf-default`` trial.
        default_status: Its status (``ok``, ``oom``, ``screened``, ``timeout``, ...).
        default_error: Its reason where it failed (one line; empty where it ran).
        default_ran_and_fit: It ran under the ceiling with a measured throughput (a pruned one too).
        default_samples_per_s: Its throughput, measured as ``best_samples_per_s`` is.
        best_trial: Number of the best feasible trial.
        best_samples_per_s: Its throughput.
        best_config: Its lever values.
        rerun_medians: Both figures are medians of the confirmation's interleaved re-runs; else both
            are search-time figures, one measurement each.
        within_noise: The confirmation found the two tied within noise (they are different trials).
        not_told_apart: The confirmation's budget ran out before the two were told apart.
        default_moved: Where the space could not hold the default: each lever the seed trial ran at
            the nearest choice, ``micro_batch 4 instead of 8`` (its ``seed_instead_of``); empty where
            it ran the default itself.
    """

    default_trial: int
    default_status: Status
    default_ran_and_fit: bool
    default_error: str
    default_samples_per_s: float
    best_trial: int
    best_samples_per_s: float
    best_config: TrialConfig
    rerun_medians: bool = False
    within_noise: bool = False
    not_told_apart: bool = False
    default_moved: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        """Best samples/s over default samples/s; ``None`` if the default did not run and fit."""
        if not self.default_ran_and_fit or self.default_samples_per_s <= 0:
            return None
        return self.best_samples_per_s / self.default_samples_per_s

    @property
    def compared(self) -> str:
        """Which figures the ratio compares, in words."""
        return "re-run medians, interleaved" if self.rerun_medians else "search-time figures, one measurement each"


def speedup_over_default(
    trials: Sequence[FrozenTrial], confirmations: Mapping[int, dict[str, Any]] | None = None
) -> SpeedupOverDefault | None:
    """Compare the winner with the ``hf-default`` seed; ``None`` if either is missing.

    Like with like: the two confirmed medians where both were re-run (confirmation re-runs the
    default beside the leaders, :mod:`autotune.study._confirm`), else the two search-time figures,
    never a re-run against a single measurement taken at another moment of the machine's life (a
    record written before the default was re-run, a default whose re-runs did not fit, a winner the
    confirmation did not cover).

    Args:
        trials: The study's trials.
        confirmations: The study's confirmation records (``ranking.confirmations_of``), so the
            winner is the one the ranking and the export name.
    """
    default = hf_default_trial(trials)
    ranking = feasible_ranking(trials, confirmations)
    if default is None or not ranking:
        return None
    best = ranking[0]
    result = TrialResult.from_trial(default) or TrialResult(status=Status.ERROR)
    default_rerun = (confirmations or {}).get(default.number) or {}
    confirmed_best, confirmed_default = best.confirmed_samples_per_s, default_rerun.get("samples_per_s")
    if confirmed_best is not None and confirmed_default is not None:
        best_figure, default_figure, rerun_medians = confirmed_best, float(confirmed_default), True
    else:
        # Like with like: a re-run median is never set against a single measurement. A default that
        # did not fit has no figure to compare: the winner's is then the ranking's.
        best_figure = best.result.samples_per_s if result.ran_and_fit and best.result else best.samples_per_s
        default_figure, rerun_medians = result.samples_per_s, False
    return SpeedupOverDefault(
        default_trial=default.number,
        default_status=result.status,
        default_ran_and_fit=result.ran_and_fit,
        default_error=result.error,
        default_samples_per_s=default_figure,
        best_trial=best.number,
        best_samples_per_s=best_figure,
        best_config=best.config,
        rerun_medians=rerun_medians,
        within_noise=rerun_medians
        and best.number != default.number
        and best.ties_with_leader
        and bool(default_rerun.get("ties_with_leader")),
        not_told_apart=rerun_medians
        and best.number != default.number
        and best.unsettled
        and bool(default_rerun.get("unsettled")),
        default_moved=tuple(
            f"{name} {default.params.get(name)} instead of {value}"
            for name, value in (default.user_attrs.get(schema.TRIAL_SEED_INSTEAD_OF) or {}).items()
        ),
    )


def describe_standing(study: optuna.Study) -> str:
    """Where a study stands, in one line: trials by outcome, queued re-runs, the best feasible so far."""
    trials = judged_trials(study.get_trials(deepcopy=False))
    by_status: dict[str, int] = {}
    best: tuple[float, int] | None = None
    for trial in trials:
        if trial.state in (TrialState.WAITING, TrialState.RUNNING):
            by_status[trial.state.name.lower()] = by_status.get(trial.state.name.lower(), 0) + 1
            continue
        result = TrialResult.from_trial(trial)
        status = result.status if result else trial.state.name.lower()
        by_status[status] = by_status.get(status, 0) + 1
        if (
            result
            and trial.state == TrialState.COMPLETE
            and result.feasible
            and schema.TRIAL_REUSED_FROM not in trial.user_attrs
        ):
            best = max(best or (0.0, -1), (result.samples_per_s, trial.number))
    counts = ", ".join(f"{n} {status}" for status, n in sorted(by_status.items())) or "none"
    best_text = f"best so far #{best[1]} at {best[0]:.1f} samples/s" if best else "no feasible trial yet"
    return f"study {study.study_name!r}: {len(trials)} trials ({counts}); {best_text}"


def why_none_finished(study: optuna.Study) -> str:
    """Why a study has no feasible trial, in what its trials say: none ran to the end yet (stopped, or queued to run
    again: resume), or every one that did failed, ran out of memory or went over the ceiling."""
    trials = study.get_trials(deepcopy=False)
    waiting = sum(t.state in (optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING) for t in trials)
    results = [TrialResult.from_trial(t) for t in trials if t.state.is_finished()]
    if all(result is None or result.status == Status.INTERRUPTED for result in results):
        queued = f" ({waiting} queued to run)" if waiting else ""
        return f"none of its {len(trials)} trial(s) ran to the end{queued}: rerun the same search command to resume it"
    return (
        "every trial failed, ran out of memory or went over the ceiling (autotune best --all says which): run more "
        "trials, or raise --memory-ceiling"
    )


def ranked_result(row: RankedTrial) -> TrialResult | None:
    """A ranked trial's figures as ranked: at the confirmed median where the search confirmed it
    (model/hardware TFLOPs, MFU scale with samples/s), with the larger peak of search and re-runs."""
    if row.result is None:
        return None
    figures = dict((row.confirmation or {}).get("figures") or {})
    if row.confirmed_samples_per_s is not None:
        figures["samples_per_s"] = row.confirmed_samples_per_s
    known = {field.name for field in dataclasses.fields(TrialResult)}
    return dataclasses.replace(
        row.result, **{k: v for k, v in figures.items() if k in known}, peak_memory_bytes=row.peak_memory_bytes
    )


def confirmation_label(row: RankedTrial) -> str:
    """How a ranked trial's samples/s was measured, for tables: empty for a single measurement."""
    if not row.confirmed:
        return ""
    return " (confirmed, ties with the leader)" if row.ties_with_leader else " (confirmed)"


def winner_summary(best: RankedTrial) -> str:
    """``#3 (mb=16 ...), 8.3 samples/s (...), ... model TFLOPs, peak memory ... under the ... ceiling``."""
    result = ranked_result(best)
    measured = ""
    if result is not None:
        how = " (median of confirming re-runs)" if best.confirmed else " (one measurement)"
        measured = (
            f", {result.samples_per_s:.1f} samples/s{how}, {result.model_tflops:.4g} model TFLOPs, "
            f"peak memory {format_bytes(result.peak_memory_bytes)} ({result.memory_source}) under the "
            f"{format_bytes(result.ceiling_bytes)} ceiling"
        )
    return f"#{best.number} ({best.config.short()}){measured}"


def study_trainer(study: optuna.Study | None) -> TrainerKind:
    """The trainer of ``study``'s trials (``--trainer``, kept in its identity where it is not the
    default: ``autotune.trainers.of_identity``); the default without a study."""
    if study is None:
        return DEFAULT
    return of_identity(study.user_attrs.get(schema.STUDY_IDENTITY) or {})


def describe_work_counted(study: optuna.Study) -> str | None:
    """What the ranking's model TFLOPs count, where the study's trainer says it (SFTTrainer's loss;
    ``None`` for other studies)."""
    identity = study.user_attrs.get(schema.STUDY_IDENTITY) or {}
    return study_trainer(study).work_counted(str(identity.get("loss_on", "all")))


def describe_ranking_basis(study: optuna.Study) -> str:
    """What the study's ranking rests on now: an earlier run's confirmation, or single measurements.

    Said when a confirmation is interrupted: nothing of it is recorded, and the ranking then uses
    the last recorded confirmation while it still covers the leaders (:func:`confirmations_of`).
    """
    confirmed = confirmations_of(study)
    if not confirmed:
        return "the ranking below rests on single search measurements"
    record = study.user_attrs.get(schema.STUDY_CONFIRMATION) or {}
    numbers = ", ".join(f"#{n}" for n in sorted(confirmed))
    return (
        f"the ranking below rests on the confirmation recorded at {record.get('measured_at', 'an unknown time')} "
        f"by an earlier run ({numbers} re-run up to {record.get('repeats', '?')} times), which still covers the leading configs"
    )


def describe_distinct(trials: Sequence[FrozenTrial]) -> str:
    """One line: how many distinct configs the study's trials measured, and how often the sampler
    came back to a measured one (not counted as trials)."""
    budget = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and is_budget_trial(t)]
    distinct = len({params_key(t.params) for t in budget})
    counts = came_back_counts(trials)
    text = f"{len(budget)} trials measured or screened {distinct} distinct configs"
    if not counts:
        return text + "; the sampler never came back to a measured config"
    detail = ", ".join(f"#{number} x{times}" for number, times in sorted(counts.items()))
    return (
        f"{text}; the sampler came back to a measured config {_times(sum(counts.values()))} ({detail}): "
        "answered from the record or turned to an untaken config, not counted as trials"
    )


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"
