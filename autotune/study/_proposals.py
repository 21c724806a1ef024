"""How the search proposes its next config, and when it is done.

Optuna's TPE (Bergstra et al. 2011, "Algorithms for Hyper-Parameter Optimization") samples 24
candidates from its density of good trials l(x) and proposes the one with the best ratio
l(x)/g(x). On a finite space with a flat, noisy top, those candidates are mostly configs already
measured: a repeat answered from the record tells TPE the same value again, so it comes back again
and the search stalls (docs/benchmarks.md, "Search efficiency"). :class:`DistinctTPESampler` keeps
TPE's model and changes only what it may propose:

* never a config already measured, screened or running: among TPE's own candidates, the best
  ratio that is not taken; when all of them are taken, the best ratio over every untaken config
  of the space (the landscape's model decides, not chance);
* once few untaken configs remain (:data:`ENUMERATE_BELOW`), every one of them is scored, so the
  search enumerates the rest in the model's order and then says the space is done;
* configs within the measured noise of the best (:func:`noise_fraction`) are ties: all of them
  are "good" trials for l(x), so TPE spreads over the top instead of chasing the one that was
  lucky in a single measurement.

Before ``n_startup_trials`` finished trials it proposes an untaken config uniformly at random
(TPE's own random start-up, the taken configs left out).

:func:`stop_reason` says when the search is done: every config of the space measured or screened,
or (``--patience K``) K trials in a row that did not raise the best by more than the noise.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import TPESampler
# TPE's own split into good and bad trials (optuna/samplers/_tpe/sampler.py, Optuna 5.0): private;
# tests/study/test_proposals.py fails if a later Optuna moves it.
from optuna.samplers._tpe.sampler import _split_trials, default_gamma
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

from autotune import schema
from autotune.result import ParamsKey, TrialResult, is_budget_trial, params_key

# With this many untaken configs or fewer, all of them are candidates (the end of a finite space).
ENUMERATE_BELOW = 24
# A space with more configs than this is not enumerated: candidates are drawn from it instead.
MAX_ENUMERATED = 100_000
# Draws to find one random untaken config in a space too large to enumerate.
DRAWN_CANDIDATES = 2048
# Random untaken configs scored when all of TPE's candidates are taken, in such a space.
DRAWN_POOL = 64
# Noise assumed before any trial measured its step times (the CPU's floor, docs/benchmarks.md).
DEFAULT_NOISE = 0.05

# Random proposals before TPE's model takes over (the seed trials count among them).
STARTUP_TRIALS = 3

def taken_configs(trials: Iterable[FrozenTrial], exclude_number: int | None = None) -> set[ParamsKey]:
    """Configs measured, screened or running: never proposed again."""
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
    return {
        params_key(t.params) for t in trials if t.state in states and t.number != exclude_number and t.params
    }


def finished_configs(trials: Iterable[FrozenTrial]) -> set[ParamsKey]:
    """Configs measured or screened (a COMPLETE or PRUNED trial holds their result)."""
    return {params_key(t.params) for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)}


def noise_fraction(study: Study) -> float:
    """The measured noise of a throughput, as a fraction.

    The run-to-run CV of the last confirmation (:mod:`._confirm`) where there is one; before any,
    the median step-time CV of the trials that ran. Two figures closer than this are ties.
    """
    record = study.user_attrs.get(schema.STUDY_CONFIRMATION) or {}
    confirmation_cvs = [float(t["cv"]) for t in (record.get("trials") or {}).values() if t.get("repeats", 0) >= 2]
    if confirmation_cvs:
        return statistics.median(confirmation_cvs)
    step_cvs = [
        r.step_time_cv
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if (r := TrialResult.from_trial(t)) is not None and r.status == "ok" and r.step_time_cv > 0
    ]
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
    trials = study.get_trials(deepcopy=False)
    done = len(finished_configs(trials))
    # Queued trials (a dead worker's re-run, seeds) are popped first, each answered from the record.
    queued = any(t.state == TrialState.WAITING for t in trials)
    if done >= space_size and not queued:
        return f"every config of the space has been measured or screened ({done} of {space_size}): the search is complete"
    if patience:
        noise = noise_fraction(study)
        streak = trials_since_improvement(trials, noise)
        if streak >= patience:
            return (
                f"patience: {streak} trials in a row did not raise the best model TFLOPs by more than the measured "
                f"noise ({noise:.1%}); stopping (--patience {patience})"
            )
    return None


class DistinctTPESampler(TPESampler):
    """Optuna's TPE that proposes only configs not taken yet (see the module docstring).

    Args:
        distributions: The search space (``SearchSpace.distributions()``): every config is drawn
            from it, from the first trial on (TPE infers the space from finished trials only).
        **tpe_kwargs: Passed to :class:`optuna.samplers.TPESampler`.
    """

    def __init__(self, distributions: dict[str, BaseDistribution], **tpe_kwargs: Any) -> None:
        super().__init__(**tpe_kwargs)
        self._distributions = dict(distributions)
        self._searched = {name: d for name, d in sorted(self._distributions.items()) if not d.single()}

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return dict(self._searched)

    def sample_relative(self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return {}  # a queued trial (a seed, a re-run) brings its own config
        trials = study.get_trials(deepcopy=False)
        fixed = {name: d.to_external_repr(0) for name, d in self._distributions.items() if d.single()}
        taken = taken_configs(trials, exclude_number=trial.number)
        # Each config once: a repeat answered from the record would weigh its config twice.
        finished = [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and is_budget_trial(t)]
        untaken = self._untaken_candidates(search_space, fixed, taken)
        if untaken is not None and len(untaken) == 0:
            return {}  # nothing left: the loop sees the repeat, records it and stops (autotune.study)
        if len(finished) < self._n_startup_trials:
            return self._random_untaken(search_space, fixed, taken, untaken)
        return self._model_choice(study, trial, finished, search_space, fixed, taken, untaken)

    # --- the candidates ---------------------------------------------------------------------------

    def _untaken_candidates(
        self, search_space: dict[str, BaseDistribution], fixed: dict[str, Any], taken: set[ParamsKey]
    ) -> list[dict[str, Any]] | None:
        """Every untaken config of a space small enough to enumerate, else ``None``."""
        size = 1
        for distribution in search_space.values():
            size *= len(distribution.choices)  # type: ignore[attr-defined] - categorical: autotune's spaces are
        if size > MAX_ENUMERATED:
            return None
        names = list(search_space)
        configs = []
        for values in itertools.product(*(search_space[n].choices for n in names)):  # type: ignore[attr-defined]
            params = dict(zip(names, values))
            if params_key({**fixed, **params}) not in taken:
                configs.append(params)
        return configs

    def _random_untaken(
        self,
        search_space: dict[str, BaseDistribution],
        fixed: dict[str, Any],
        taken: set[ParamsKey],
        untaken: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        rng = self._rng.rng
        if untaken is not None:
            return untaken[int(rng.randint(len(untaken)))]
        for _ in range(DRAWN_CANDIDATES):
            params = {n: d.choices[int(rng.randint(len(d.choices)))] for n, d in search_space.items()}  # type: ignore[attr-defined]
            if params_key({**fixed, **params}) not in taken:
                return params
        return {}

    def _model_choice(
        self,
        study: Study,
        trial: FrozenTrial,
        finished: list[FrozenTrial],
        search_space: dict[str, BaseDistribution],
        fixed: dict[str, Any],
        taken: set[ParamsKey],
        untaken: list[dict[str, Any]] | None,
    ) -> dict[str, Any]:
        """TPE's l(x)/g(x) over its own candidates, then over the untaken configs if all are taken."""
        below, above = _split_trials(study, finished, self._n_below(study, finished))
        mpe_below = self._build_parzen_estimator(study, search_space, below, handle_below=True)
        mpe_above = self._build_parzen_estimator(study, search_space, above, handle_below=False)
        rng = self._rng.rng
        tpe_candidates = _external(mpe_below.sample(rng, self._n_ei_candidates), search_space)
        tpe_scores = self._compute_acquisition_func(_internal(tpe_candidates, search_space), mpe_below, mpe_above)
        order = np.argsort(-tpe_scores, kind="stable")
        preferred = tpe_candidates[int(order[0])]
        if params_key({**fixed, **preferred}) in taken:
            self._note_came_back(study, trial, finished, {**fixed, **preferred})
        enumerate_rest = untaken is not None and len(untaken) <= ENUMERATE_BELOW
        if not enumerate_rest:
            for index in order:
                if params_key({**fixed, **tpe_candidates[int(index)]}) not in taken:
                    return tpe_candidates[int(index)]
        pool = untaken if untaken is not None else self._drawn_untaken(search_space, fixed, taken)
        if not pool:
            return {}
        scores = self._compute_acquisition_func(_internal(pool, search_space), mpe_below, mpe_above)
        return pool[int(np.argmax(scores))]

    def _n_below(self, study: Study, finished: list[FrozenTrial]) -> int:
        """TPE's count of good trials, raised to every feasible trial within the noise of the best."""
        n_below = (self._gamma or default_gamma)(len(finished))
        values = [v for t in finished if (v := _feasible_value(t)) is not None]
        if values:
            floor = max(values) * (1 - noise_fraction(study))
            n_below = max(n_below, sum(v >= floor for v in values))
        return n_below

    def _drawn_untaken(
        self, search_space: dict[str, BaseDistribution], fixed: dict[str, Any], taken: set[ParamsKey]
    ) -> list[dict[str, Any]]:
        drawn = [self._random_untaken(search_space, fixed, taken, None) for _ in range(DRAWN_POOL)]
        return [params for params in drawn if params]

    @staticmethod
    def _note_came_back(study: Study, trial: FrozenTrial, finished: list[FrozenTrial], params: dict[str, Any]) -> None:
        """Record on the new trial which measured trial TPE wanted to repeat (dashboard, ``best --all``)."""
        key = params_key(params)
        original = next((t.number for t in finished if is_budget_trial(t) and params_key(t.params) == key), None)
        if original is not None:
            study._storage.set_trial_user_attr(trial._trial_id, schema.TRIAL_PROPOSED_AGAIN, original)


def make_sampler(distributions: dict[str, BaseDistribution], seed: int | None = None) -> DistinctTPESampler:
    """The search's sampler: multivariate TPE (the knobs interact: batch with memory, dtype with
    optimizer), proposing distinct configs."""
    return DistinctTPESampler(distributions, multivariate=True, group=False, n_startup_trials=STARTUP_TRIALS, seed=seed)


def _external(samples: dict[str, np.ndarray], search_space: dict[str, BaseDistribution]) -> list[dict[str, Any]]:
    """TPE's internal samples (choice indices) as a list of params dicts."""
    count = len(next(iter(samples.values())))
    return [
        {name: distribution.to_external_repr(samples[name][i]) for name, distribution in search_space.items()}
        for i in range(count)
    ]


def _internal(configs: list[dict[str, Any]], search_space: dict[str, BaseDistribution]) -> dict[str, np.ndarray]:
    """Params dicts as TPE's internal arrays, to score them with its Parzen estimators."""
    return {
        name: np.asarray([distribution.to_internal_repr(params[name]) for params in configs], dtype=float)
        for name, distribution in search_space.items()
    }


class SearchFinished(Exception):
    """The search should start no more trials; the message says why (:func:`stop_reason`)."""
