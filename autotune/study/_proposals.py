"""How the search proposes its next config, and when it is done.

:class:`DistinctThompsonSampler` proposes by Thompson sampling (Thompson 1933; Russo et al. 2018, "A
Tutorial on Thompson Sampling") over the model of the landscape in :mod:`._landscape`: it draws one
landscape from the posterior of the throughput and memory models, and proposes the config that draws
fastest among the untaken configs that draw to fit under the ceiling. So:

* it never proposes a config already measured, screened or running (a repeat answered from the
  record would tell the model nothing new, and on a flat top Optuna's TPE kept coming back:
  docs/benchmarks.md, "Search efficiency");
* where the model is sure, it exploits; where configs are within the measured noise of each other,
  their draws trade places, so ties are spread over instead of the one lucky measurement being
  chased; on a landscape with no structure it is a random order, never a fixed wrong one;
* every untaken config of a space up to :data:`MAX_ENUMERATED` configs is scored at every proposal,
  so the last untaken configs are enumerated in the model's order and the search then says the
  space is done;
* configs the memory model expects over the ceiling are left for last, so few runs are spent on
  configs that do not fit.

Before ``n_startup_trials`` finished trials (the seed trials count among them) it proposes the untaken
config the throughput prior predicts fastest among those the memory estimate expects to fit (an untaken
config uniformly at random where there is no throughput prior: no peak known for the device).

:func:`stop_reason` says when the search is done: every config of the space measured or screened,
or (``--patience K``) K trials in a row that did not raise the best by more than the noise.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.samplers import BaseSampler
from optuna.samplers._lazy_random_state import LazyRandomState
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotune.estimate import SpeedFit, StepWork, estimate_peak, fit_speed, predict_speed
from autotune.levers import LEVERS, TrialConfig, config_conflict
from autotune.result import (
    GIVEN_UP_STATUSES,
    RAN_NORMALLY_STATUSES,
    ParamsKey,
    TrialResult,
    is_budget_trial,
    judged_trials,
    params_key,
)
from autotune.spec.ceiling import fits
from autotune.storage import schema
from autotune.study import _landscape
from autotune.study._request import SearchRequest

# A space with more configs than this is not enumerated: candidates are drawn from it instead.
MAX_ENUMERATED = 100_000
# Draws to find one random untaken config in a space too large to enumerate.
DRAWN_CANDIDATES = 2048
# Random untaken configs scored at each proposal, in such a space.
DRAWN_POOL = 1024
# Noise assumed before any trial measured its step times (the CPU's floor, docs/benchmarks.md).
DEFAULT_NOISE = 0.05

# Random proposals before the model takes over (the seed trials count among them).
STARTUP_TRIALS = 3


def settled(trial: FrozenTrial) -> bool:
    """Measured or screened (a COMPLETE or PRUNED trial holds its result), or failed on every attempt
    it got (:data:`autotune.result.GIVEN_UP_STATUSES`): its config is not tried again."""
    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    if trial.state != TrialState.FAIL:
        return False
    result = TrialResult.from_trial(trial)
    return result is not None and result.status in GIVEN_UP_STATUSES


def taken_configs(trials: Iterable[FrozenTrial], exclude_number: int | None = None) -> set[ParamsKey]:
    """Configs settled or running: never proposed again."""
    return {
        params_key(t.params)
        for t in trials
        if (t.state == TrialState.RUNNING or settled(t)) and t.number != exclude_number and t.params
    }


def finished_configs(trials: Iterable[FrozenTrial]) -> set[ParamsKey]:
    """Configs settled: measured, screened, or failed on every attempt."""
    return {params_key(t.params) for t in trials if settled(t)}


def noise_fraction(study: Study) -> float:
    """The measured noise of a throughput, as a fraction.

    The run-to-run CV of the last confirmation (:mod:`._confirm`) where there is one; before any,
    the median step-time CV of the trials that ran. Two figures closer than this are ties.
    """
    record = study.user_attrs.get(schema.STUDY_CONFIRMATION) or {}
    confirmation_cvs = [float(t["cv"]) for t in (record.get("trials") or {}).values() if t.get("repeats", 0) >= 2]
    results = [TrialResult.from_trial(t) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    return measured_noise(confirmation_cvs, [r for r in results if r is not None])


def measured_noise(rerun_cvs: list[float], results: Iterable[TrialResult]) -> float:
    """The noise of a throughput measured by runs of configs: the median run-to-run CV of the configs
    re-run at least twice (``rerun_cvs``) where there is one, else the median step-time CV of
    ``results`` that ran and fit, else :data:`DEFAULT_NOISE`."""
    if rerun_cvs:
        return statistics.median(rerun_cvs)
    step_cvs = [r.step_time_cv for r in results if r.status == "ok" and r.step_time_cv > 0]
    return statistics.median(step_cvs) if step_cvs else DEFAULT_NOISE


def _feasible_value(trial: FrozenTrial) -> float | None:
    """The model TFLOPs of a trial that ran and fit, else ``None``."""
    if trial.state != TrialState.COMPLETE or not is_budget_trial(trial):
        return None
    result = TrialResult.from_trial(trial)
    return result.model_tflops if result is not None and result.feasible else None


def trials_since_improvement(trials: Sequence[FrozenTrial], noise: float) -> int:
    """Budget trials, in order, since the last one that raised the best feasible model TFLOPs by
    more than ``noise`` (all of them when none fit yet)."""
    best = 0.0
    streak = 0
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.state not in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL) or not is_budget_trial(trial):
            continue
        result = TrialResult.from_trial(trial)
        if result is not None and result.status == "interrupted":
            continue  # queued again; its re-run is the trial
        value = _feasible_value(trial)
        if value is not None and value > best * (1 + noise):
            best, streak = value, 0
        else:
            streak += 1
    return streak


def stop_reason(study: Study, space_size: int, patience: int | None) -> str | None:
    """Why the search should start no more trials, in one line; ``None`` while it should go on.

    Args:
        study: The study.
        space_size: How many configs the search space holds.
        patience: Stop after this many trials in a row without a gain above the noise; ``None``: never.
    """
    trials = judged_trials(study.get_trials(deepcopy=False))
    done = len(finished_configs(trials))
    # Queued trials (a dead worker's re-run, seeds) are popped first, each answered from the record.
    queued = any(t.state == TrialState.WAITING for t in trials)
    if done >= space_size and not queued:
        given_up = len({params_key(t.params) for t in trials if t.state == TrialState.FAIL and settled(t)})
        failed = f", {given_up} of them failed on every attempt" if given_up else ""
        return f"every config of the space has been measured or screened ({done} of {space_size}{failed}): the search is complete"
    if patience:
        noise = noise_fraction(study)
        streak = trials_since_improvement(trials, noise)
        if streak >= patience:
            return (
                f"patience: {streak} trials in a row did not raise the best model TFLOPs by more than the measured "
                f"noise ({noise:.1%}); stopping (--patience {patience})"
            )
    return None


class DistinctThompsonSampler(BaseSampler):
    """Thompson sampling over the landscape model, proposing only untaken configs (module docstring).

    Args:
        distributions: The search space (``SearchSpace.distributions()``): every config is drawn
            from it, from the first trial on.
        log_peak_estimate: The estimator's log peak bytes of a config's params (the memory
            model's prior), or ``None`` to leave memory to screening.
        ceiling_bytes: The memory ceiling.
        n_startup_trials: Proposals before the landscape model takes over (the prior's fastest, or random).
        seed: Makes the proposals reproducible (benchmarks, tests).
        step_work: The throughput prior's count of one optimizer step of a config's params
            (``autotune.estimate.step_work``); ``None``: no throughput prior.
        speed_fit: The device's rates that turn it into time, before any trial (calibrated on the
            trials that ran at each proposal, ``autotune.estimate.fit_speed``).
    """

    def __init__(
        self,
        distributions: dict[str, BaseDistribution],
        log_peak_estimate: Callable[[dict[str, Any]], float] | None,
        ceiling_bytes: int,
        n_startup_trials: int = STARTUP_TRIALS,
        seed: int | None = None,
        step_work: Callable[[dict[str, Any]], StepWork] | None = None,
        speed_fit: SpeedFit | None = None,
    ) -> None:
        self._distributions = dict(distributions)
        self._searched = {name: d for name, d in sorted(self._distributions.items()) if not d.single()}
        self._fixed = {name: d.to_external_repr(0) for name, d in self._distributions.items() if d.single()}
        self._log_peak_estimate = log_peak_estimate
        self._ceiling_bytes = ceiling_bytes
        self._n_startup_trials = n_startup_trials
        self._step_work = step_work if speed_fit is not None else None
        self._speed_fit = speed_fit
        self._rng = LazyRandomState(seed)
        # Workers of one process (one per GPU) ask from threads: one proposal at a time.
        self._lock = threading.Lock()

    def reseed_rng(self) -> None:
        self._rng.rng.seed()

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._searched)

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        """A knob outside the relative space: fixed (one choice), or a queued trial's own."""
        assert isinstance(param_distribution, CategoricalDistribution)
        choices = param_distribution.choices
        return choices[int(self._rng.rng.randint(len(choices)))]

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return {}  # a queued trial (a seed, a re-run) brings its own config
        with self._lock:
            # Judged (autotune.result._loss): a trial told before the HF default's loss existed is seen
            # as every reader of feasibility sees it.
            trials = judged_trials(study.get_trials(deepcopy=False))
            taken = taken_configs(trials, exclude_number=trial.number)
            untaken = self._untaken(search_space, taken)
            if untaken is not None and len(untaken) == 0:
                return {}  # nothing left: the loop sees the repeat, records it and stops (autotune.study)
            finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and is_budget_trial(t)]
            if len(finished) < self._n_startup_trials and self._step_work is None:
                return self._random_untaken(search_space, taken, untaken)
            pool = untaken if untaken is not None else self._drawn_untaken(search_space, taken)
            if not pool:
                return {}
            if len(finished) < self._n_startup_trials:
                return self._predicted_fastest(finished, pool)
            return self._thompson_choice(study, trial, finished, search_space, pool)

    # --- the candidates ---------------------------------------------------------------------------

    def _untaken(self, search_space: dict[str, BaseDistribution], taken: set[ParamsKey]) -> list[dict[str, Any]] | None:
        """Every untaken config of a space small enough to enumerate, else ``None``."""
        sizes: list[int] = [len(d.choices) for d in search_space.values()]  # type: ignore[attr-defined]  # autotune's spaces are categorical
        if math.prod(sizes) > MAX_ENUMERATED:
            return None
        names = list(search_space)
        configs = []
        for values in itertools.product(*(search_space[n].choices for n in names)):  # type: ignore[attr-defined]  # autotune's spaces are categorical
            params = dict(zip(names, values))
            if self._runnable_untaken(params, taken):
                configs.append(params)
        return configs

    def _random_untaken(
        self, search_space: dict[str, BaseDistribution], taken: set[ParamsKey], untaken: list[dict[str, Any]] | None
    ) -> dict[str, Any]:
        rng = self._rng.rng
        if untaken is not None:
            return untaken[int(rng.randint(len(untaken)))]
        for _ in range(DRAWN_CANDIDATES):
            params = {n: d.choices[int(rng.randint(len(d.choices)))] for n, d in search_space.items()}  # type: ignore[attr-defined]  # categorical
            if self._runnable_untaken(params, taken):
                return params
        return {}

    def _runnable_untaken(self, params: dict[str, Any], taken: set[ParamsKey]) -> bool:
        """Not taken, and no two of its values break a pair rule (bf16 weights with fp32 autocast)."""
        config = {**self._fixed, **params}
        return params_key(config) not in taken and not config_conflict(config)

    def _drawn_untaken(self, search_space: dict[str, BaseDistribution], taken: set[ParamsKey]) -> list[dict[str, Any]]:
        drawn = (self._random_untaken(search_space, taken, None) for _ in range(DRAWN_POOL))
        unique = {params_key(params): params for params in drawn if params}
        return list(unique.values())

    # --- the throughput prior ----------------------------------------------------------------------

    def _calibrated_log_prior(self, finished: list[FrozenTrial]) -> Callable[[dict[str, Any]], float] | None:
        """The throughput prior's log model TFLOPs of searched params, its rates calibrated on the trials
        that ran (their achievable fraction and per-step overhead); ``None`` without a prior."""
        if self._step_work is None or self._speed_fit is None:
            return None
        work = self._step_work
        measured = []
        for t in finished:
            result = TrialResult.from_trial(t)
            if result is not None and result.status in RAN_NORMALLY_STATUSES and result.step_time_median_s > 0:
                measured.append((work({**self._fixed, **t.params}), result.step_time_median_s))
        fit = fit_speed(measured, self._speed_fit)

        def log_prior(params: dict[str, Any]) -> float:
            predicted = predict_speed(work({**self._fixed, **params}), fit)
            # A dtype without a known peak: the lowest figure, so the model tries it only once the rest is known.
            return math.log(max(predicted.model_tflops, 1e-12)) if predicted is not None else math.log(1e-12)

        return log_prior

    def _predicted_fastest(self, finished: list[FrozenTrial], pool: list[dict[str, Any]]) -> dict[str, Any]:
        """The untaken config the (calibrated) throughput prior predicts fastest among those the memory
        estimate expects to fit (all of the pool where none is expected to, or without an estimate)."""
        log_prior = self._calibrated_log_prior(finished)
        assert log_prior is not None
        expected = pool
        if self._log_peak_estimate is not None:
            peaks = np.exp(np.asarray([self._log_estimate(params) for params in pool]))
            fitting = np.asarray(fits(peaks, self._ceiling_bytes))
            expected = [params for params, fit in zip(pool, fitting) if fit] or pool
        return max(expected, key=log_prior)

    # --- the choice -------------------------------------------------------------------------------

    def _thompson_choice(
        self,
        study: Study,
        trial: FrozenTrial,
        finished: list[FrozenTrial],
        search_space: dict[str, BaseDistribution],
        pool: list[dict[str, Any]],
    ) -> dict[str, Any]:
        """The fastest config of one landscape drawn from the posterior, among those drawn to fit."""
        rng = self._rng.rng
        encoding = _landscape.KnobEncoding(search_space)  # type: ignore[arg-type]  # autotune's spaces are categorical
        observed = _landscape.observations(finished, encoding.names, self._ceiling_bytes)
        pool = self._unmeasured_micro_batches_first(encoding, observed, pool)
        log_prior = self._calibrated_log_prior(finished)
        posterior = _landscape.throughput_posterior(encoding, observed, noise_fraction(study), log_prior)
        speed_effects = posterior.draw(rng)
        speed = _landscape.drawn_log_speed(encoding, speed_effects, pool, log_prior)
        fits = self._drawn_to_fit(encoding, observed, pool, rng)
        if not fits.any():
            return pool[int(np.argmax(speed))]  # none expected to fit: screening decides on the fastest
        choice = int(np.argmax(np.where(fits, speed, -np.inf)))
        self._note_came_back(study, trial, finished, encoding, speed_effects, float(speed[choice]), log_prior)
        return pool[choice]

    def _unmeasured_micro_batches_first(
        self, encoding: _landscape.KnobEncoding, observed: _landscape.Observations, pool: list[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        """The configs of micro-batches (the levers whose memory grows with their value) no trial has run
        yet that the memory model expects to fit
        (its posterior mean under the ceiling), where there are any; else the whole pool.

        So every micro-batch the estimate says fits is measured within the budget, one config each
        (the fastest drawn), instead of waiting on draws: the micro-batch is the knob that moves
        both speed and memory most, and one the calibrated estimate puts a few percent under the
        ceiling is the one most worth measuring (docs/benchmarks.md, "First GPU run": micro-batch 2
        never ran in 8 trials).
        """
        growing = [lever.name for lever in LEVERS.values() if lever.grows_memory and lever.name in encoding.names]
        if not growing or self._log_peak_estimate is None:
            return pool

        def size(params: dict[str, Any]) -> tuple[Any, ...]:
            return tuple(params[name] for name in growing)

        ran = {size(params) for params in observed.memory_configs + observed.throughput_configs}
        candidates = [params for params in pool if size(params) not in ran]
        if not candidates:
            return pool
        corrections = _landscape.memory_posterior(encoding, observed, self._log_estimate).mean
        log_peak = np.asarray([self._log_estimate(params) for params in candidates])
        expected = np.asarray(fits(np.exp(log_peak + encoding.matrix(candidates) @ corrections), self._ceiling_bytes))
        return [params for params, fit in zip(candidates, expected) if fit] or pool

    def _drawn_to_fit(
        self,
        encoding: _landscape.KnobEncoding,
        observed: _landscape.Observations,
        pool: list[dict[str, Any]],
        rng: np.random.RandomState,
    ) -> np.ndarray:
        """For each config, whether its drawn peak is under the ceiling (all, without an estimator)."""
        if self._log_peak_estimate is None:
            return np.ones(len(pool), dtype=bool)
        corrections = _landscape.memory_posterior(encoding, observed, self._log_estimate).draw(rng)
        log_peak = (
            np.asarray([self._log_estimate(params) for params in pool])
            + encoding.matrix(pool) @ corrections
            + rng.normal(0.0, _landscape.MEMORY_NOISE, len(pool))
        )
        return np.asarray(fits(np.exp(log_peak), self._ceiling_bytes))  # the one fit rule, elementwise

    def _log_estimate(self, params: dict[str, Any]) -> float:
        """The estimator's log peak of searched params (the fixed knobs added)."""
        assert self._log_peak_estimate is not None
        return self._log_peak_estimate({**self._fixed, **params})

    @staticmethod
    def _note_came_back(
        study: Study,
        trial: FrozenTrial,
        finished: list[FrozenTrial],
        encoding: _landscape.KnobEncoding,
        speed_effects: np.ndarray,
        proposed_speed: float,
        log_prior: Callable[[dict[str, Any]], float] | None = None,
    ) -> None:
        """Record on the new trial the measured trial the drawn landscape ranks above every untaken
        config: the one a sampler free to repeat would have proposed (dashboard, ``best --all``)."""
        feasible = [t for t in finished if (r := TrialResult.from_trial(t)) is not None and r.feasible]
        if not feasible:
            return
        params = [{n: t.params[n] for n in encoding.names} for t in feasible]
        drawn = _landscape.drawn_log_speed(encoding, speed_effects, params, log_prior)
        best = int(np.argmax(drawn))
        if drawn[best] > proposed_speed:
            study._storage.set_trial_user_attr(trial._trial_id, schema.TRIAL_PROPOSED_AGAIN, feasible[best].number)


def make_sampler(request: SearchRequest, seed: int | None = None) -> DistinctThompsonSampler:
    """The search's sampler, its memory model seeded by the estimator of the request's workload and its
    throughput model by the workload's throughput prior (``Workload.speed_model``)."""
    workload = request.workload
    speed = workload.speed_model()

    @functools.cache
    def log_peak(key: ParamsKey) -> float:
        config = TrialConfig.from_params(dict(key))
        prior = workload.memory_prior
        return math.log(estimate_peak(workload.model, config, workload.seq_len, prior).total_bytes)

    @functools.cache
    def work(key: ParamsKey) -> StepWork:
        return speed.work(workload.model, TrialConfig.from_params(dict(key)), workload.seq_len)

    # A device without a known peak (a GPU missing from the datasheet table, never calibrated) gets no
    # throughput prior, never an invented one.
    known = bool(speed.fit.peaks_tflops)
    return DistinctThompsonSampler(
        request.space.distributions(),
        lambda params: log_peak(params_key(params)),
        request.ceiling_bytes,
        seed=seed,
        step_work=(lambda params: work(params_key(params))) if known else None,
        speed_fit=speed.fit if known else None,
    )


class SearchFinished(Exception):
    """The search should start no more trials; the message says why (:func:`stop_reason`)."""
