"""The user's whole run in one line (issue 40, point 4): the search's summary, ``best``, the report, the
export's header (measured) and ``estimate`` (predicted) print it; the arithmetic is
:mod:`autotune.result._run_time`'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from autotune import trainers
from autotune.estimate import EstimateRow, MemoryFit, estimate_peak, predicted_winner
from autotune.levers import TrialConfig
from autotune.result import Pace, TrialResult, dataset_samples, run_length, run_time_line
from autotune.spec.ceiling import fits
from autotune.storage import schema
from autotune.units import format_bytes
from autotune.views.ranking import study_ranking, study_trainer
from autotune.views.verify import study_answer


def study_run_time(study: optuna.Study, epochs: float | None = None, price_per_hour: float | None = None) -> str | None:
    """The run-time line of a searched study: the winner's and the default's measured figures (like with
    like, as ``best`` compares them: :func:`autotune.views.verify.study_answer`) over the whole run.

    ``epochs`` and ``price_per_hour`` default to the search's (``--epochs``, ``--price-per-hour``); the
    run spans as many devices as a trial did (``--devices-per-trial``). ``None`` where no trial ran and fit.

    Raises:
        AutotuneError: ``epochs`` contradicts ``max_steps`` or ``num_train_epochs`` in the search's ``--base-args``.
    """
    searched: Mapping[str, Any] = study.user_attrs.get(schema.STUDY_SEARCH_OPTIONS) or {}
    length = run_length(
        study.user_attrs.get(schema.STUDY_BASE_ARGS) or {}, epochs if epochs is not None else searched.get("epochs")
    )
    paces = study_paces(study)
    if paces is None:
        return None
    price = price_per_hour if price_per_hour is not None else searched.get("price_per_hour")
    devices = int(searched.get("devices_per_trial") or 1)
    samples = study.user_attrs.get(schema.STUDY_DATASET_SAMPLES)
    return run_time_line(length, samples, *paces, price, devices)


def study_paces(study: optuna.Study) -> tuple[tuple[str, Pace], tuple[str, Pace] | None] | None:
    """The winner's and the default's paces, each with its words, from their recorded figures (like with
    like: :func:`autotune.views.verify.study_answer`); ``None`` where no trial ran and fit."""
    if not study_ranking(study):
        return None
    answer = study_answer(study)
    trials = {trial.number: trial for trial in study.get_trials(deepcopy=False)}
    trainer = study_trainer(study)
    # A trial of several ranks records their rates summed, and its global batch knob as each rank's share.
    ranks = int((study.user_attrs.get(schema.STUDY_SEARCH_OPTIONS) or {}).get("devices_per_trial") or 1)

    def pace(number: int, samples_per_s: float) -> Pace:
        result = TrialResult.from_trial(trials[number])
        assert result is not None  # the answer's trials ran and fit
        batch = TrialConfig.from_params(trials[number].params).global_batch * ranks
        return Pace.measured(result, samples_per_s, batch, packed_samples=trainer.samples_counted_from_lengths)

    winner = (f"winner #{answer.winner_trial}", pace(answer.winner_trial, answer.winner_samples_per_s))
    if answer.default_trial is None or not answer.default_samples_per_s:
        return winner, None
    return winner, (
        f"{trainer.baseline_words} #{answer.default_trial}",
        pace(answer.default_trial, answer.default_samples_per_s),
    )


def predicted_run_time_of(
    planned: Any, rows: Sequence[EstimateRow], speed: Any, options: Any, default: TrialConfig, fit: MemoryFit
) -> str | None:
    """The whole run's predicted wall time (``estimate``): the predicted winner's and the trainer's
    default's predicted speeds (``speed``, the throughput prior) over the run's length from ``--base-args``
    and ``--epochs`` and the ``--dataset``'s samples, on ``--devices-per-trial`` devices at ``--price-per-hour``.
    ``planned``: the estimate's :class:`autotune.plan.Plan`; ``default``: the trainer's default config, compared
    only where the memory model (``fit``) says it fits under the ceiling, as the winner must."""
    workload = planned.workload
    winner = predicted_winner(rows)
    peak = estimate_peak(workload.model, default, workload.seq_len, fit).total_bytes
    over = None if fits(peak, workload.ceiling_bytes) else (peak, workload.ceiling_bytes)
    return predicted_run_time(
        workload.base_args,
        options.epochs,
        dataset_samples(workload.dataset),
        (winner.config, winner.speed) if winner is not None else None,
        (default, speed.estimate(workload.model, default, workload.seq_len)),
        options.price_per_hour,
        options.devices_per_trial,
        workload.trainer,
        default_over_ceiling=over,
    )


def predicted_run_time(
    base_args: Mapping[str, Any],
    epochs: float | None,
    samples: int | None,
    winner: tuple[TrialConfig, Any] | None,
    default: tuple[TrialConfig, Any] | None,
    price_per_hour: float | None,
    devices: int,
    trainer: str,
    default_over_ceiling: tuple[int, int] | None = None,
) -> str | None:
    """``estimate``'s run-time line: the predicted winner's and the trainer's default's predicted speeds
    (each a (config, :class:`autotune.estimate.SpeedEstimate`)), marked predicted; ``None`` without a
    predicted winner. ``default_over_ceiling``: the default's predicted peak and the ceiling where it does not fit,
    so it is not compared (a run that cannot start saves no time)."""
    if winner is None or winner[1] is None:
        return None
    length = run_length(base_args, epochs)

    def pace(config: TrialConfig, speed: Any) -> Pace:  # steady steps of global-batch samples, and any pass before
        # The speed is the trial's, over its ranks; a step trains each rank's share of the global batch.
        return Pace(
            speed.steady_samples_per_s, config.global_batch * devices, setup_s_per_sample=speed.setup_s_per_sample
        )

    words = trainers.get(trainer).baseline_words
    compared = default is not None and default[1] is not None and default_over_ceiling is None
    other = (words, pace(*default)) if compared and default is not None else None
    line = run_time_line(
        length, samples, ("predicted winner", pace(*winner)), other, price_per_hour, devices, predicted=True
    )
    if default_over_ceiling is not None:
        peak, ceiling = default_over_ceiling
        line += (
            f"; the {words} is not compared: its predicted peak {format_bytes(peak)} is over the "
            f"{format_bytes(ceiling)} ceiling"
        )
    return line
