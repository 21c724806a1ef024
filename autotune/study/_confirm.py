"""Confirm the winner: re-measure the leading configurations interleaved, then rank by the re-runs.

A search measures each configuration once, at one moment of the machine's life; the best of
many single measurements is biased upwards (the winner is partly the luckiest). Before naming a
winner, the leader and those of the top-k feasible trials that could still be ahead of it are run
again, interleaved (round r runs them in an order rotated by r), so slow drifts of the machine hit
all of them alike. Each candidate's confirmed figure is the median of its re-runs.

The study's HF-default seed trial (:func:`autotune.result.comparable_hf_default`) is re-run with them,
interleaved alike, where it ran and fit and is not a candidate re-run already: the speedup over the
default then compares re-runs measured in the same period, not the winner's re-run with the default's
single search-time figure, taken at another moment of the machine's life. From its first re-run on
it follows the candidates' rules (it stays while it could still be ahead, it ties, it may lead:
on a flat landscape that is the truth), and the record names it (``reference``).

Confirmation in proportion (what it costs is recorded and printed):

* Only candidates whose search-time interval overlaps the leader's are re-run, the leader with
  them: each figure ``x (1 +- 2 x noise)``, the noise being the search's measured one
  (``._proposals.noise_fraction``, at least :data:`autotune.spec.measure.PRUNE_NOISE_FLOOR`). A
  leader ahead of every other candidate by more than that is re-run alone.
* From the second round on (two re-runs each: the least that shows noise), a candidate whose
  re-runs no longer reach the leader's slowest stops being re-run, and once none is left beside the
  leader the order is settled: no more rounds. A clear leader costs two re-runs at most (and the
  HF default's two, where it is re-run), not ``top_k x repeats``.
* A budget in proportion to the search it confirms (``--confirm-budget``, a share of the search's
  wall seconds before the confirmation, the clock of the time-share line,
  :class:`autotune.result.TimeSpent`; a resumed search's are this invocation's): no re-run after the
  first round starts that would take the re-runs' seconds past it, judged by the mean re-run so far.
  Wall seconds, not the trials' summed seconds: the re-runs run one at a time, so with several
  workers the summed seconds would let the confirmation outgrow the search it confirms.

The minimum, whatever the budget: the first round, one re-run of the leader, of each candidate
within reach of it (at most ``top_k``: lower ``--confirm-top`` to bound it) and of the HF default
where it is re-run (above). The search's best figure
is partly the luckiest (above), so a winner is never named on it alone; and the candidates are
compared on figures measured in the same period, interleaved. A second re-run of the leader is not part of the minimum: alone it cannot settle the
order (the others' second re-runs are needed for that), it only shows the leader's noise, so it is
spent like any other re-run, where the budget allows (a clear leader gets it whenever the budget
holds one re-run more than the first round). Before the first re-run nothing needs estimating: the
first round runs in full, and each later re-run is judged by the mean of those before it.

A budget that stops the re-runs may leave the order unsettled: the candidates still in question (not
shown behind the leader by two re-runs each, nor by a re-run median outside the noise interval of the
leader's: :func:`still_within_reach`) are flagged ``unsettled``, the record says that the
budget stopped it (``stopped``: ``settled``, ``budget`` or ``all rounds``,
:mod:`autotune.storage.schema`), and the winner's line names them. Their order stays that of their
re-run medians, the best evidence measured in one period: peak memory is no evidence of speed, so it
breaks ties only (below). (Ordering unsettled candidates by memory named, on a noisy 2-core CPU, a
winner at 129.6 samples/s over two at 151.7 and 153.9 for 12 MiB less memory: issue 29.)

Two candidates tie when their re-runs overlap: the leader's slowest re-run is no faster than the
other's fastest. Tied candidates are then ordered by peak memory, smaller first (same speed, more
headroom). A candidate with a re-run that ran out of memory or went over the ceiling is not
reliably feasible and leaves the feasible ranking.

Optuna lets no one write to a finished trial, so the outcome is a study user attr
(``confirmation``, :mod:`autotune.storage.schema`): the candidates considered, the HF default re-run
beside them, one entry per re-run trial number, the runs and seconds the re-runs took, the budget
(its share, the search's seconds it is a share of, its seconds) and why the re-runs stopped; each
run replaces the last one, so a confirmation never outlives the search that made it.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
from collections.abc import Callable, Collection
from typing import Any

import optuna

from autotune.errors import AutotuneError
from autotune.levers import TrialConfig
from autotune.plan import SearchOptions
from autotune.result import (
    FAILED_STATUSES,
    Status,
    TrialResult,
    comparable_hf_default,
    feasible_by_speed,
    judged_trials,
)
from autotune.runner import run_isolated
from autotune.spec.measure import PRUNE_NOISE_FLOOR, coefficient_of_variation
from autotune.storage import schema
from autotune.study._loop import make_job
from autotune.study._proposals import noise_fraction
from autotune.study._request import SearchRequest

# Half-width of a single measurement's interval, in measured-noise units.
INTERVAL_NOISES = 2.0

# TrialResult fields proportional to samples/s for a given config.
THROUGHPUT_FIGURES = (
    "tokens_per_s",
    "real_tokens_per_s",
    "model_tflops",
    "hardware_tflops",
    "mfu",
    "hfu",
    "mfu_measured",
    "hfu_measured",
)


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """The re-measurement of one trial.

    Attributes:
        trial_number: The Optuna trial re-measured.
        samples_per_s: Median over the re-runs that finished (``None`` if none did).
        cv: Coefficient of variation of those re-runs' samples/s (run-to-run noise).
        repeats: Re-runs that finished (transient failures not counted).
        runs_samples_per_s: samples/s of each finished re-run, in run order.
        peak_memory_bytes: Largest peak memory of the re-runs (the ceiling's figure).
        statuses: Status of every re-run, in run order.
        feasible: No re-run ran out of memory or went over the ceiling, and at least one finished.
        ties_with_leader: Within noise of the fastest confirmed candidate (the leader too, when
            any other ties with it).
        unsettled: Still in question beside the leader when the budget stopped the re-runs (the
            leader too, when any other is).
        figures: Throughput-derived figures at the confirmed median (model and hardware TFLOPs,
            MFU, HFU): each is proportional to samples/s for one config, so they are scaled from a
            re-run by the median over that re-run's samples/s.
    """

    trial_number: int
    samples_per_s: float | None
    cv: float
    repeats: int
    runs_samples_per_s: tuple[float, ...]
    peak_memory_bytes: int
    statuses: tuple[Status, ...]
    feasible: bool
    ties_with_leader: bool = False
    unsettled: bool = False
    figures: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def to_attr(self) -> dict[str, Any]:
        """The JSON stored for this trial in the study's confirmation attr."""
        values = dataclasses.asdict(self)
        values["runs_samples_per_s"] = list(self.runs_samples_per_s)
        values["statuses"] = list(self.statuses)
        return values


def in_round_order(numbers: list[int], round_index: int) -> list[int]:
    """The order round ``round_index`` re-runs ``numbers`` in: rotated by the round (A B, then B A), so a
    slow drift of the machine hits them alike (interleaved)."""
    shift = round_index % len(numbers)
    return numbers[shift:] + numbers[:shift]


def rerun(
    request: SearchRequest,
    config: TrialConfig,
    label: str,
    run_trial: Callable[..., TrialResult] = run_isolated,
    profile_steps: int = 0,
) -> TrialResult:
    """One re-run of ``config`` in a trial child, as the search runs a trial, measured in full (no early
    stop: a re-run's figure is the point), in a work directory named after ``label``; ``profile_steps``
    steps after warm-up under torch's profiler (``TrialJob.profile_steps``), if any."""
    job = dataclasses.replace(
        make_job(request, config, label, prune_below_samples_per_s=None), profile_steps=profile_steps
    )
    return run_trial(job, request.trial_timeout_s)


def confirmation_candidates(study: optuna.Study, top_k: int) -> list[tuple[int, TrialConfig]]:
    """The ``top_k`` feasible trials by their search-time throughput (earlier confirmations ignored):
    (trial number, config), fastest first."""
    return [(number, config) for number, config, _ in _leaders(study, top_k)]


def _leaders(study: optuna.Study, top_k: int) -> list[tuple[int, TrialConfig, float]]:
    """The ``top_k`` feasible trials, fastest first: (number, config, search-time samples/s)."""
    leaders = feasible_by_speed(judged_trials(study.get_trials(deepcopy=False)))[:top_k]
    return [(trial.number, TrialConfig.from_params(trial.params), result.samples_per_s) for trial, result in leaders]


def interval_width(noise: float) -> float:
    """The half-width of a single measurement's interval, as a fraction: ``2 x noise``, the noise at least
    :data:`PRUNE_NOISE_FLOOR`."""
    return INTERVAL_NOISES * max(noise, PRUNE_NOISE_FLOOR)


def within_reach_of_the_leader(figures: dict[int, float], noise: float) -> list[int]:
    """The candidates (trial number -> search-time samples/s, the leader first) whose interval
    ``figure x (1 +- 2 x noise)`` overlaps the leader's, the leader with them; only the leader where
    none does. ``noise`` counts as at least :data:`PRUNE_NOISE_FLOOR`."""
    width = interval_width(noise)
    leader = max(figures, key=lambda number: figures[number])
    lowest_of_leader = figures[leader] * (1 - width)
    return [n for n in figures if n == leader or figures[n] * (1 + width) >= lowest_of_leader]


def still_in_question(confirmations: list[Confirmation]) -> list[int]:
    """After a round: the confirmed leader and the candidates whose re-runs still reach its slowest
    (the tie rule of :func:`mark_ties`); empty when no candidate is feasible. A candidate with a
    re-run out of memory or over the ceiling is out (it leaves the feasible ranking)."""
    feasible = [c for c in confirmations if c.feasible and c.samples_per_s is not None]
    if not feasible:
        return []
    leader = max(feasible, key=lambda c: c.samples_per_s or 0.0)
    slowest = min(leader.runs_samples_per_s)
    return [c.trial_number for c in feasible if c is leader or max(c.runs_samples_per_s) >= slowest]


def still_within_reach(runs: dict[int, list[TrialResult]], active: list[int], noise: float) -> list[int]:
    """When the budget stopped the re-runs: the candidates of ``active`` that the re-runs so far leave in
    question. The rule that chose the candidates from their search-time figures
    (:func:`within_reach_of_the_leader`, the search's measured noise) applied to their re-run medians:
    a candidate whose median is behind the leader's by more than that is not in question, even with one
    re-run each (the demo's HF default re-ran at 89 samples/s against the leader's 180 and was still
    "not told apart" from it: issue 29). A candidate with no feasible re-run is out (it leaves the
    feasible ranking)."""
    medians = {
        number: c.samples_per_s
        for number in active
        if (c := summarise(number, runs[number])).feasible and c.samples_per_s is not None
    }
    return within_reach_of_the_leader(medians, noise) if medians else []


def summarise(trial_number: int, runs: list[TrialResult]) -> Confirmation:
    """Fold one candidate's re-runs into its :class:`Confirmation` (ties are marked later)."""
    finished = [r for r in runs if r.status not in FAILED_STATUSES]  # a failed re-run says nothing of the config
    ok_runs = [r for r in finished if r.feasible and r.samples_per_s > 0]
    measured = [r.samples_per_s for r in ok_runs]
    median = statistics.median(measured) if measured else None
    figures: dict[str, float | None] = {}
    if median is not None:
        reference = ok_runs[0]
        scale = median / reference.samples_per_s
        for name in THROUGHPUT_FIGURES:
            value = getattr(reference, name)
            figures[name] = None if value is None else value * scale
    return Confirmation(
        trial_number=trial_number,
        samples_per_s=median,
        figures=figures,
        cv=coefficient_of_variation(measured),
        repeats=len(finished),
        runs_samples_per_s=tuple(measured),
        peak_memory_bytes=max((r.peak_memory_bytes for r in finished), default=0),
        statuses=tuple(r.status for r in runs),
        feasible=bool(measured) and all(r.feasible for r in finished),
    )


def mark_ties(confirmations: list[Confirmation], unsettled: Collection[int] = ()) -> list[Confirmation]:
    """Flag the candidates whose re-runs overlap the leader's (ties), and those in ``unsettled`` (the
    leader too, where any other is flagged).

    The leader is the feasible candidate with the highest confirmed median. Another ties with it
    when the leader's slowest re-run is no faster than the other's fastest: with a handful of
    re-runs that is the plain reading of "within noise", free of any distribution assumption.
    ``unsettled``: the candidates still in question when the budget stopped the re-runs (their
    order with the leader was not settled, as after a single re-run each); a flag, not a tie: they
    keep the order of their re-run medians (module docstring).
    """
    feasible = [c for c in confirmations if c.feasible and c.samples_per_s is not None]
    if not feasible:
        return confirmations
    leader = max(feasible, key=lambda c: c.samples_per_s or 0.0)
    tied = {c.trial_number for c in feasible if min(leader.runs_samples_per_s) <= max(c.runs_samples_per_s)}
    open_question = {c.trial_number for c in feasible if c.trial_number in unsettled}
    return [
        dataclasses.replace(
            c,
            ties_with_leader=len(tied) > 1 and c.trial_number in tied,
            unsettled=len(open_question) > 1 and c.trial_number in open_question,
        )
        for c in confirmations
    ]


def confirm_top(
    study: optuna.Study,
    request: SearchRequest,
    top_k: int = 3,
    repeats: int = 3,
    on_run: Callable[[int, int, TrialResult], None] | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
    *,
    search_s: float,
    budget_fraction: float = SearchOptions.confirm_budget,
) -> list[Confirmation]:
    """Re-measure the leader and those of the top-k feasible trials within the noise of it, with
    the HF default beside them, interleaved, until their order is settled or the budget is spent,
    and record the outcome in the study (module docstring).

    Args:
        study: The study searched with ``request``.
        request: How trials are run (the same model, device, ceiling and measurement).
        top_k: Candidates considered.
        repeats: Re-runs of each candidate at most (at least 2, so noise can be seen).
        on_run: Called after every re-run with (round, trial number, result).
        run_trial: Runs a :class:`autotune.runner.TrialJob` (``run_isolated``'s signature), as in
            :func:`._loop.run_search`.
        search_s: The search's wall seconds before the confirmation (what the budget is a share of).
        budget_fraction: ``--confirm-budget``: no re-run after the first round starts that would take
            the re-runs' seconds past this share of ``search_s``, by the mean re-run so far.

    Returns:
        One :class:`Confirmation` per trial re-run (the HF default's too), fastest confirmed first
        (empty with no feasible trial).

    Raises:
        AutotuneError: ``top_k`` below 1 or ``repeats`` below 2.
        KeyboardInterrupt: After killing the running re-run; nothing is recorded then.
    """
    if top_k < 1:
        raise AutotuneError(f"--confirm-top {top_k}: give at least 1 (or 0 to skip confirmation)")
    if repeats < 2:
        raise AutotuneError(f"--confirm-repeats {repeats}: give at least 2, so run-to-run noise can be seen")
    leaders = _leaders(study, top_k)
    if not leaders:
        return []
    configs = {number: config for number, config, _ in leaders}
    noise = noise_fraction(study)
    active = within_reach_of_the_leader({number: figure for number, _, figure in leaders}, noise)
    # The HF default beside them, unless it is one (module docstring): the speedup over it then
    # compares re-runs of the same period.
    default = comparable_hf_default(judged_trials(study.get_trials(deepcopy=False)))
    reference = default if default is not None and default.number not in active else None
    if reference is not None:
        configs[reference.number] = TrialConfig.from_params(reference.params)
        active.append(reference.number)
    budget_s = budget_fraction * search_s
    runs: dict[int, list[TrialResult]] = {number: [] for number in active}
    seconds, count = 0.0, 0
    stopped = schema.CONFIRMATION_ALL_ROUNDS
    for round_index in range(repeats):
        for number in in_round_order(active, round_index):
            # The first round always runs (the minimum, module docstring); a later re-run only where
            # one more of the mean so far keeps the re-runs within the budget.
            if round_index >= 1 and seconds + seconds / count > budget_s:
                stopped = schema.CONFIRMATION_BUDGET
                break
            result = rerun(request, configs[number], f"{number}-confirm-{round_index}", run_trial)
            runs[number].append(result)
            seconds, count = seconds + result.wall_s, count + 1
            if on_run is not None:
                on_run(round_index, number, result)
        if stopped == schema.CONFIRMATION_BUDGET:
            break
        if round_index >= 1:  # two re-runs each: noise can be seen; drop who can no longer be ahead
            active = still_in_question([summarise(number, runs[number]) for number in active])
            if len(active) <= 1:
                stopped = schema.CONFIRMATION_SETTLED  # a leader alone: its two re-runs confirm its figure
                break
    unsettled = still_within_reach(runs, active, noise) if stopped == schema.CONFIRMATION_BUDGET else []
    confirmations = mark_ties([summarise(number, results) for number, results in runs.items()], unsettled)
    record = {
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "top_k": top_k,
        "repeats": repeats,
        "candidates": [number for number, _, _ in leaders],
        "reference": None if reference is None else reference.number,
        "noise": noise,
        "runs": count,
        "seconds": seconds,
        "budget_fraction": budget_fraction,
        "search_s": search_s,
        "budget_s": budget_s,
        "stopped": stopped,
        "trials": {str(c.trial_number): c.to_attr() for c in confirmations},
    }
    study.set_user_attr(schema.STUDY_CONFIRMATION, record)
    return sorted(confirmations, key=lambda c: (not c.feasible, -(c.samples_per_s or 0.0)))
