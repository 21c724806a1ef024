"""The strategies replayed on a grid: the shipped search, plain Optuna TPE, random order.

``autotune``: :func:`autotune.study.search`, the call ``autotune search`` makes, with
:class:`GridRunner` (a lookup in the grid) as its trial runner. Early stop is replayed with the
child's own rule (:func:`autotune.spec.measure.clearly_slower`) after each measured step; its cost
is cut to what had run. The grids hold each config's median step and step-time CV, not each step's
time: the measured steps are modelled as the median, the first of them slower by the grid's
``first_step_cvs`` step-time CVs (0: at the median; 2: the case where a slow first step could
stop a config that should run on).
"""

from __future__ import annotations

import dataclasses
import random
import tempfile
import threading
import time
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from autotune.levers import TrialConfig
from autotune.result import TrialResult, came_back_counts
from autotune.runner import TrialJob, Workload
from autotune.space import SearchSpace
from autotune.spec.ceiling import fits
from autotune.spec.devices import DeviceSpec
from autotune.spec.measure import clearly_slower
from autotune.spec.models import ModelSpec
from autotune.study import SearchBudget, SearchHooks, SearchProgress, SearchRequest, open_study, search
from benchmarks.bench_search.grid import BENCH_MEASURE, Grid, fits_under

TARGET_FRACTION = 0.98
# Random orders behind the random row's median (cheap: no search runs).
RANDOM_ORDERS = 200


@dataclasses.dataclass
class RunStats:
    """One strategy, one seed: what it cost to reach the target."""

    reached: bool
    runs: int  # configs actually trained until the target (or until giving up)
    asks: int  # proposals, reused and screened ones included
    wall_s: float  # grid wall time of the runs + the strategy's own time
    screened: int = 0
    reused: int = 0
    pruned: int = 0
    came_back: int = 0  # proposals of a measured config: answered from the record, or turned to an untaken one


class GridRunner:
    """``run_isolated``'s signature, answered from the grid; replays the runner's early stop."""

    def __init__(self, grid: Grid, ceiling_bytes: int) -> None:
        self.grid = grid
        self.ceiling_bytes = ceiling_bytes
        self.runs = 0
        self.cost_s = 0.0
        self.pruned = 0
        self.pruned_cost_s = 0.0

    def __call__(self, job: TrialJob, timeout_s: float, on_tick: Callable[[], None] | None = None) -> TrialResult:
        measured = self.grid.results[job.config]
        result = TrialResult.from_dict(measured.to_dict())
        result.ceiling_bytes = self.ceiling_bytes
        if result.status in ("ok", "over_ceiling"):
            result.status = "ok" if fits(result.peak_memory_bytes, self.ceiling_bytes) else "over_ceiling"
        cost = measured.wall_s
        stopped_after = self._pruned_after(job, result, measured)
        if stopped_after is not None:
            cost -= (measured.measured_steps - stopped_after) * measured.step_time_median_s
            result.measured_steps = stopped_after
            result.status = "pruned"
            self.pruned += 1
            self.pruned_cost_s += cost
        self.runs += 1
        self.cost_s += cost
        return result

    def _pruned_after(self, job: TrialJob, result: TrialResult, measured: TrialResult) -> int | None:
        """After how many measured steps the child's pruner would have stopped this config; ``None``: never.

        The child's step timer asks the pruner after every measured step but the last (measurement
        ends there anyway), with the steps so far: modelled as the config's median step, the first
        slower by the grid's ``first_step_cvs`` of its step-time CVs.
        """
        threshold = job.prune_below_samples_per_s
        if threshold is None or result.status != "ok":
            return None
        median = measured.step_time_median_s
        steps = [median * (1 + self.grid.first_step_cvs * measured.step_time_cv)]
        steps += [median] * (measured.measured_steps - 1)
        samples_per_step = measured.samples_per_s * median
        for count in range(1, measured.measured_steps):
            if clearly_slower(steps[:count], samples_per_step, threshold, job.prune_step_noise, job.workload.measure):
                return count
        return None


def bench_request(
    grid: Grid, model: ModelSpec, device: DeviceSpec, space: SearchSpace, ceiling: int, prune_ratio: float
) -> SearchRequest:
    return SearchRequest(
        workload=Workload.for_model(
            model,
            device=device,
            seq_len=int(grid.meta["seq_len"]),
            ceiling_bytes=ceiling,
            measure=BENCH_MEASURE,
        ),
        space=space,
        work_root=tempfile.mkdtemp(prefix="bench-search-autotune-"),
        prune_ratio=prune_ratio,
    )


def run_autotune(
    grid: Grid,
    request: SearchRequest,
    seed: int,
    target: float,
    max_asks: int,
    with_seeds: bool = True,
    old_sampler: bool = False,
    patience: int | None = None,
    budget: int | None = None,
) -> tuple[RunStats, TrialConfig | None]:
    """The shipped search (``autotune.study.search``: its seed trials, sampler, screening, reuse, early
    stop, budget and patience) with the grid lookup as its trial runner; returns its cost to the
    target and its winner then.

    ``with_seeds=False`` is the ablation: the study's seed trials (HF default, best-practice guess)
    are taken off the queue unrun, so the sampler, screening, reuse and early stop work alone.
    ``old_sampler`` replays the search before autotune's own sampler: Optuna's TPE as autotune
    configured it (repeats of measured configs are answered from the record, as they were).
    Without ``budget`` the search runs until its best reaches the target (a progress hook stops it
    there). With ``patience`` and ``budget`` it runs like ``autotune search --trials budget
    --patience K``: until the budget, the patience or the end of the space. Either way it stops
    once the study holds ``max_asks`` trials.
    """
    runner = GridRunner(grid, request.ceiling_bytes)
    study = open_study(optuna.storages.InMemoryStorage(), f"autotune-{seed}", request, sampler_seed=seed)
    if old_sampler:
        study.sampler = optuna.samplers.TPESampler(multivariate=True, group=False, n_startup_trials=6, seed=seed)
    if not with_seeds:
        for _ in study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            popped = study.ask()
            popped.set_user_attr("bench_popped", True)
            study.tell(popped, state=TrialState.FAIL)  # pops a queued seed; FAIL informs no sampler
    best = 0.0
    winner: TrialConfig | None = None
    trials_run = 0
    stop = threading.Event()

    def done() -> bool:
        return len(study.get_trials(deepcopy=False)) >= max_asks or (budget is None and best >= target)

    def trial_end(number: int, config: TrialConfig, result: TrialResult) -> None:
        nonlocal best, winner, trials_run
        trials_run += 1
        if result.status == "ok" and result.samples_per_s > best:
            best, winner = result.samples_per_s, config
        if done():
            stop.set()  # the search starts no more trials

    hooks = SearchHooks(progress=SearchProgress(on_trial_end=trial_end))
    started = time.perf_counter()
    while not done():
        trials = None if budget is None else budget - trials_run
        outcome = search(
            study,
            request,
            SearchBudget(trials=trials, patience=patience, confirm_top=0),
            hooks,
            run_trial=runner,
            stop=stop,
        )
        if stop.is_set() or outcome.stop_reason is not None or (budget is not None and trials_run >= budget):
            break
        # Else the sampler proposed only measured configs, 50 times in a row (the old sampler's
        # repeats): the search ended without a reason of its own; ask on, up to max_asks.
    own_s = time.perf_counter() - started  # the lookups cost nothing: this is the search's own time
    trials = [t for t in study.get_trials(deepcopy=False) if "bench_popped" not in t.user_attrs]
    reused = sum("reused_from" in t.user_attrs for t in trials)
    screened = sum(t.user_attrs.get("status") == "screened" and "reused_from" not in t.user_attrs for t in trials)
    came_back = sum(came_back_counts(trials).values())
    stats = RunStats(
        best >= target, runner.runs, len(trials), runner.cost_s + own_s, screened, reused, runner.pruned, came_back
    )
    return stats, winner


def run_plain_tpe(grid: Grid, space: SearchSpace, ceiling: int, seed: int, target: float, max_asks: int) -> RunStats:
    """Optuna's TPE with its defaults; samples/s as the value, 0 when the config does not fit."""
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    distributions = space.distributions()
    own_s = cost_s = 0.0
    best = 0.0
    asks = 0
    while asks < max_asks and best < target:
        started = time.perf_counter()
        trial = study.ask(distributions)
        result = grid.results[TrialConfig.from_params(trial.params)]
        value = result.samples_per_s if fits_under(result, ceiling) else 0.0
        study.tell(trial, value)
        own_s += time.perf_counter() - started
        cost_s += result.wall_s
        asks += 1
        best = max(best, value)
    return RunStats(best >= target, asks, asks, cost_s + own_s)


def run_random(grid: Grid, ceiling: int, seed: int, target: float) -> RunStats:
    """Configs in a random order, each once."""
    order = list(grid.results)
    random.Random(seed).shuffle(order)
    cost_s = 0.0
    for runs, config in enumerate(order, start=1):
        result = grid.results[config]
        cost_s += result.wall_s
        if fits_under(result, ceiling) and result.samples_per_s >= target:
            return RunStats(True, runs, runs, cost_s)
    return RunStats(False, len(order), len(order), cost_s)
