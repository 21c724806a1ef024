"""The search's model of the landscape: how fast a config trains and whether it fits.

Two Bayesian linear models over the searched knobs, each knob value one indicator feature:

* **throughput**: ``log(model TFLOPs) = w x log(the throughput prior's prediction) + sum of one effect per
  knob value + noise``. The prior (``autotune.estimate``: FLOPs over the peak, bytes over the bandwidth,
  overhead; calibrated on the trials that ran, :func:`calibrated_speed`) is the mean, so the effects learn
  only its residual: each knob value multiplies the prior's figure by a factor, the shape every measured
  grid of docs/benchmarks.md has. Effects start at 0 with the prior's per-knob error as their sd
  (:data:`RESIDUAL_EFFECT_SD`); the prior's weight ``w`` starts at 1 (its differences between configs
  taken as they are) with sd :data:`PRIOR_WEIGHT_SD`, and the trials move it: where configs the prior
  tells apart measure alike (a flat CPU grid, where its ranking is no better than chance), ``w`` falls
  and the effects rank the configs instead of the prior's misplaced differences. Without a prior (no
  peak known for the device) the mean is 0 and the sd wide (:data:`THROUGHPUT_EFFECT_SD` in log space: a
  knob may change throughput several-fold). The noise is the measured noise (``noise_fraction``) or what
  the fit leaves unexplained, if larger.
* **peak memory**: ``log(peak) = log(autotune.estimate's prediction) + sum of effects + noise``.
  The effects learn where the estimator is off for this model and machine; before any trial the
  model is the estimator (prior sd :data:`MEMORY_EFFECT_SD`, the estimator's stated error).

Interactions between knobs (bf16 gains more at larger batches) are not modelled: on the measured
grids a model with pairwise terms needed more runs, because each extra term widens what a draw
may do where little is measured (docs/benchmarks.md, "Search efficiency"). Memory interactions
(checkpointing x micro-batch) are the estimator's, which holds them.

The conjugate posterior of a linear model with a Gaussian prior and noise is Gaussian (Bishop,
"Pattern Recognition and Machine Learning", 2006, eq. 3.50-3.51):
``cov = (X'X / noise^2 + diag(1 / prior_sd^2))^-1``, ``mean = cov X'y / noise^2``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from optuna.distributions import CategoricalDistribution
from optuna.trial import FrozenTrial, TrialState

from autotune.estimate import SpeedModel, fit_speed
from autotune.levers import TrialConfig
from autotune.result import PEAK_MEASURED_STATUSES, RAN_NORMALLY_STATUSES, Status, TrialResult, is_budget_trial
from autotune.spec.models import ModelSpec

# Prior sd of one knob value's effect on log throughput: e^1 = 2.7x either way.
THROUGHPUT_EFFECT_SD = 1.0
# ... and of its correction to the throughput prior, where there is one: about the prior's largest
# per-knob-value error on the measured CPU grids (0.2-0.3 in log, docs/benchmarks.md, "The throughput prior").
RESIDUAL_EFFECT_SD = 0.3
# Prior sd of the weight of the throughput prior's differences between configs (mean 1). On the gpt2-tiny
# grid (1.24x between its fastest and slowest config) the prior's pick was 4 % short of the best and its
# ranking weak (Spearman 0.47: docs/benchmarks.md, "The throughput prior"); trials there pull the weight
# down, and where configs measure as the prior says it stays 1 (tests/study/test_landscape.py). Replayed on
# the three CPU grids: gpt2-tiny's worst seeds 22 -> 18 and 33 -> 21 runs, bert-mini's median without the
# seed trials 7 -> 8, llama-tiny unchanged (docs/benchmarks.md, "The throughput prior").
PRIOR_WEIGHT_SD = 0.5
# The least noise assumed on log throughput: run-to-run noise on a quiet CPU (docs/benchmarks.md).
MIN_THROUGHPUT_NOISE = 0.02
# Prior sd of one knob value's correction to the estimator, in log space: its stated error is
# about 25 % (docs/estimator.md).
MEMORY_EFFECT_SD = 0.2
# Noise of a measured peak, in log space (repeat measurements agree within a few %).
MEMORY_NOISE = 0.03
# An OOM says only "more than was there": it counts as a peak this much over the ceiling.
OOM_EXCESS = 1.05

Params = dict[str, Any]


class KnobEncoding:
    """One indicator feature per value of each searched knob."""

    def __init__(self, search_space: dict[str, CategoricalDistribution]) -> None:
        self.names = list(search_space)
        self.column: dict[tuple[str, Any], int] = {}
        for name in self.names:
            for value in search_space[name].choices:
                self.column[(name, value)] = len(self.column)

    @property
    def width(self) -> int:
        return len(self.column)

    def matrix(self, configs: Sequence[Params]) -> np.ndarray:
        """Rows of 0/1 features, one row per config."""
        features = np.zeros((len(configs), self.width))
        for row, params in enumerate(configs):
            for name in self.names:
                features[row, self.column[(name, params[name])]] = 1.0
        return features


@dataclasses.dataclass(frozen=True)
class Posterior:
    """Gaussian posterior of a linear model's effects."""

    mean: np.ndarray
    cov: np.ndarray

    def draw(self, rng: np.random.RandomState) -> np.ndarray:
        """One set of effects drawn from the posterior (Thompson sampling's one landscape).

        Through the covariance's Cholesky factor, the one lower-triangular factor with a positive diagonal
        (every posterior here is positive definite: the prior's precision is added). NumPy's
        ``RandomState.multivariate_normal`` factors it by SVD instead, whose vectors are not unique where
        eigenvalues repeat (the prior's ``sd² I``, indicator features of equal counts): a seeded study
        drew other landscapes on another CPU (OpenBLAS's AVX512 kernels against its AVX2 ones). The
        same count of normal draws, so the generator's stream moves on as before.
        """
        return self.mean + np.linalg.cholesky(self.cov) @ rng.standard_normal(len(self.mean))


def fit(features: np.ndarray, targets: np.ndarray, prior_sd: float | np.ndarray, noise_sd: float) -> Posterior:
    """The posterior of the effects given the observations (see the module docstring); ``prior_sd``: one
    for every coefficient, or each its own."""
    width = features.shape[1]
    precision = features.T @ features / noise_sd**2 + np.diag(np.broadcast_to(1.0 / np.square(prior_sd), (width,)))
    cov = np.linalg.inv(precision)
    cov = (cov + cov.T) / 2  # symmetric to rounding, as a covariance is
    return Posterior(mean=cov @ features.T @ targets / noise_sd**2, cov=cov)


def prior(width: int, prior_sd: float | np.ndarray) -> Posterior:
    """The model before any observation: every effect 0, independent, with sd ``prior_sd``."""
    return Posterior(mean=np.zeros(width), cov=np.diag(np.broadcast_to(np.square(prior_sd), (width,))).copy())


@dataclasses.dataclass(frozen=True)
class Observations:
    """What the study's trials measured, as the two models read it."""

    throughput_configs: list[Params]
    log_model_tflops: list[float]
    memory_configs: list[Params]
    log_peak_bytes: list[float]


def observations(trials: Sequence[FrozenTrial], names: Sequence[str], ceiling_bytes: int) -> Observations:
    """Each measured config once (reused and screened trials are no measurement)."""
    speed_configs: list[Params] = []
    speeds: list[float] = []
    memory_configs: list[Params] = []
    peaks: list[float] = []
    for trial in trials:
        if trial.state not in (TrialState.COMPLETE, TrialState.PRUNED) or not is_budget_trial(trial):
            continue
        result = TrialResult.from_trial(trial)
        if result is None:
            continue
        params = {name: trial.params[name] for name in names}
        if result.status in RAN_NORMALLY_STATUSES and result.model_tflops > 0:
            speed_configs.append(params)
            speeds.append(math.log(result.model_tflops))
        if result.status in PEAK_MEASURED_STATUSES and result.peak_memory_bytes > 0:
            memory_configs.append(params)
            peaks.append(math.log(result.peak_memory_bytes))
        elif result.status == Status.OOM:
            memory_configs.append(params)
            peaks.append(math.log(max(result.peak_memory_bytes, ceiling_bytes) * OOM_EXCESS))
    return Observations(speed_configs, speeds, memory_configs, peaks)


def throughput_posterior(
    encoding: KnobEncoding,
    observed: Observations,
    measured_noise: float,
    log_prior: Callable[[Params], float] | None = None,
) -> Posterior:
    """Effects on log model TFLOPs, over the throughput prior's ``log_prior`` where given (its residual),
    and then one more coefficient, last: the prior's weight less 1 (:func:`drawn_log_speed` reads it).
    The noise is the measured one, or what a first fit leaves unexplained where that is larger (a
    landscape the additive model fits only roughly)."""
    effect_sd: float | np.ndarray = THROUGHPUT_EFFECT_SD
    if log_prior is not None:
        effect_sd = np.append(np.full(encoding.width, RESIDUAL_EFFECT_SD), PRIOR_WEIGHT_SD)
    if not observed.log_model_tflops:
        return prior(encoding.width + (log_prior is not None), effect_sd)
    features = encoding.matrix(observed.throughput_configs)
    targets = np.asarray(observed.log_model_tflops)
    if log_prior is not None:
        predicted = np.asarray([log_prior(params) for params in observed.throughput_configs])
        targets = targets - predicted
        features = np.column_stack([features, predicted - predicted.mean()])
    targets = targets - targets.mean()  # the level is common to every config: only differences rank them
    noise = max(measured_noise, MIN_THROUGHPUT_NOISE)
    posterior = fit(features, targets, effect_sd, noise)
    # Residual variance over the residual degrees of freedom (n - the fit's effective parameters).
    effective_parameters = float(np.trace(features @ posterior.cov @ features.T)) / noise**2
    residual = targets - features @ posterior.mean
    unexplained = float(residual @ residual) / max(len(targets) - effective_parameters, 1.0)
    if unexplained > noise**2:
        posterior = fit(features, targets, effect_sd, math.sqrt(unexplained))
    return posterior


def drawn_log_speed(
    encoding: KnobEncoding,
    coefficients: np.ndarray,
    configs: Sequence[Params],
    log_prior: Callable[[Params], float] | None = None,
) -> np.ndarray:
    """Each config's log throughput in one drawn landscape (:func:`throughput_posterior`'s coefficients),
    up to the level common to all: its knob values' effects, plus the prior's log prediction at the drawn
    weight."""
    speed = encoding.matrix(configs) @ coefficients[: encoding.width]
    if log_prior is not None:
        weight = 1.0 + float(coefficients[encoding.width])
        speed = speed + weight * np.asarray([log_prior(params) for params in configs])
    return speed


def memory_posterior(
    encoding: KnobEncoding, observed: Observations, log_estimate: Callable[[Params], float]
) -> Posterior:
    """Corrections to the estimator's log peak, per knob value."""
    if not observed.log_peak_bytes:
        return prior(encoding.width, MEMORY_EFFECT_SD)
    targets = np.asarray(observed.log_peak_bytes) - np.asarray([log_estimate(p) for p in observed.memory_configs])
    return fit(encoding.matrix(observed.memory_configs), targets, MEMORY_EFFECT_SD, MEMORY_NOISE)


def calibrated_speed(
    model: ModelSpec, seq_len: int, speed: SpeedModel, measured: Iterable[tuple[TrialConfig, TrialResult]]
) -> SpeedModel:
    """The throughput prior calibrated on the trials that ran (``autotune.estimate.fit_speed``: the device's
    achievable fraction and per-step overhead, from each trial's median optimizer step)."""
    points = [
        (speed.work(model, config, seq_len), result.step_time_median_s)
        for config, result in measured
        if result.status in RAN_NORMALLY_STATUSES and result.step_time_median_s > 0
    ]
    return dataclasses.replace(speed, fit=fit_speed(points, speed.fit))
