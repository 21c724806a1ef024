"""The whole search in one call: what ``autotune search`` runs and the search benchmark replays.

:func:`search` takes an opened study (:func:`._setup.open_study`) and, in this order:

1. records the results a run kept while the storage failed (:func:`._record.record_pending_results`),
   before orphan recovery would re-queue their trials;
2. fails and re-queues the trials of runs that died (:func:`._liveness.recover_orphans`);
3. runs the trial loop (:func:`._loop.run_search`) inside the caller's live view;
4. says why it stopped (:func:`._proposals.stop_reason`: the space measured, ``--patience``);
5. re-measures the leaders (:func:`._confirm.confirm_top`), within a share of the wall time so far;
6. records where its wall time went (:class:`autotune.result.TimeSpent`, the study's ``time_spent``);
7. has the caller's writer write the study's note (the dashboard's: this package shows nothing,
   see docs/architecture.md).

The caller prints: the hooks say what happens while it happens, the :class:`SearchOutcome` what
happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import threading
import time
from collections.abc import Callable
from typing import Any

import optuna

from autotune.result import TimeSpent, TrialResult, is_budget_trial
from autotune.runner import run_isolated
from autotune.storage import schema
from autotune.study._confirm import Confirmation, confirm_top
from autotune.study._liveness import recover_orphans, run_by_this_process
from autotune.study._loop import run_search
from autotune.study._proposals import stop_reason
from autotune.study._record import record_pending_results
from autotune.study._request import SearchBudget, SearchProgress, SearchRequest


@dataclasses.dataclass
class SearchHooks:
    """What the caller watches of a search, and how it shows it. All optional.

    Attributes:
        progress: Each trial's start and end (called from the worker threads).
        view: Entered around the trial loop (the command line's live table, ``display.SearchView``).
        on_note: A line for the user before the loop: trials recorded or queued again.
        on_loop_end: Why the loop stopped (``None``: the budget or the time ran out), before the
            confirmation starts.
        on_confirm_run: After each re-run of the confirmation: (round, trial number, result).
        write_note: Writes the study's note at the end (the command line passes
            ``autotune.views.dashboard.save_study_note``).
    """

    progress: SearchProgress = dataclasses.field(default_factory=SearchProgress)
    view: contextlib.AbstractContextManager[Any] = dataclasses.field(default_factory=contextlib.nullcontext)
    on_note: Callable[[str], None] | None = None
    on_loop_end: Callable[[str | None], None] | None = None
    on_confirm_run: Callable[[int, int, TrialResult], None] | None = None
    write_note: Callable[[optuna.Study], object] | None = None


@dataclasses.dataclass(frozen=True)
class SearchOutcome:
    """What a :func:`search` did.

    Attributes:
        recorded: Trials whose kept result was recorded before the loop.
        requeued: Trials of a dead run, failed and queued again before the loop.
        finished: Trials this invocation finished.
        stop_reason: Why the search is done (:func:`._proposals.stop_reason`); ``None`` when the
            budget, the time or the caller stopped it.
        confirmations: The confirmed leaders, fastest first (empty: none fit, no confirmation, or
            a leader ahead of the rest by more than the noise).
        confirmation_interrupted: Ctrl-C cut the confirmation short; none of its re-runs is recorded.
        time_spent: Where the search's wall time went (also stored in the study).
    """

    recorded: tuple[int, ...]
    requeued: tuple[int, ...]
    finished: int
    stop_reason: str | None
    confirmations: tuple[Confirmation, ...] = ()
    confirmation_interrupted: bool = False
    time_spent: TimeSpent | None = None


def search(
    study: optuna.Study,
    request: SearchRequest,
    budget: SearchBudget,
    hooks: SearchHooks | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
    stop: threading.Event | None = None,
) -> SearchOutcome:
    """Run (or resume) the search on ``study``: recovery, the loop, the stop, the confirmation, the note.

    Args:
        study: The study, opened for ``request``.
        request: What to search.
        budget: When to stop starting trials, and how many leaders to confirm (0: none).
        hooks: What the caller watches (see :class:`SearchHooks`).
        run_trial: Runs a :class:`autotune.runner.TrialJob` (``run_isolated``, a fresh child, by
            default); the search benchmark passes a lookup in a measured grid.
        stop: Set by the caller (from a progress hook, say) to start no more trials.

    Raises:
        KeyboardInterrupt: Ctrl-C in the loop, after every running trial was recorded as
            ``interrupted`` (no confirmation, no note then). Ctrl-C in the confirmation is not
            raised: see :attr:`SearchOutcome.confirmation_interrupted`.
    """
    hooks = hooks or SearchHooks()
    started, started_at = time.perf_counter(), datetime.datetime.now()
    recorded = record_pending_results(study, request.work_root)  # first: recovery would re-queue these trials
    if recorded:
        _note(
            hooks,
            f"trial(s) {_numbers(recorded)} measured while the storage could not record them: recorded now from {request.work_root}",
        )
    requeued = recover_orphans(study)
    if requeued:
        _note(hooks, f"trial(s) {_numbers(requeued)} were left running by a run that died; queued again")
    with hooks.view:
        finished = run_search(study, request, budget, hooks.progress, run_trial, stop)
    reason = stop_reason(study, request.space.size, budget.patience)
    if hooks.on_loop_end is not None:
        hooks.on_loop_end(reason)
    confirmations: list[Confirmation] = []
    interrupted = False
    confirm_started = time.perf_counter()
    reruns: list[TrialResult] = []

    def on_confirm_run(round_index: int, number: int, result: TrialResult) -> None:
        reruns.append(result)
        if hooks.on_confirm_run is not None:
            hooks.on_confirm_run(round_index, number, result)

    if budget.confirm_top > 0:
        try:
            confirmations = confirm_top(
                study,
                request,
                budget.confirm_top,
                budget.confirm_repeats,
                on_confirm_run,
                run_trial,
                search_s=confirm_started - started,  # the time-share line's clock, up to the confirmation
                budget_fraction=budget.confirm_budget,
            )
        except KeyboardInterrupt:
            interrupted = True  # the search's own trials are recorded; the ranking stands on them
    spent = TimeSpent.of_search(
        _results_of_this_search(study, started_at),
        wall_s=time.perf_counter() - started,
        confirmation_s=time.perf_counter() - confirm_started,
        reruns=reruns,
    )
    study.set_user_attr(schema.STUDY_TIME_SPENT, spent.to_dict())
    if hooks.write_note is not None:
        hooks.write_note(study)
    return SearchOutcome(tuple(recorded), tuple(requeued), finished, reason, tuple(confirmations), interrupted, spent)


def _results_of_this_search(study: optuna.Study, started_at: datetime.datetime) -> list[TrialResult]:
    """The results of the trials this call ran: started since it began, by this process, not a
    repeat answered from the record."""
    return [
        result
        for trial in study.get_trials(deepcopy=False)
        if trial.datetime_start is not None
        and trial.datetime_start >= started_at
        and is_budget_trial(trial)
        and run_by_this_process(trial)
        and (result := TrialResult.from_trial(trial)) is not None
    ]


def _note(hooks: SearchHooks, line: str) -> None:
    if hooks.on_note is not None:
        hooks.on_note(line)


def _numbers(numbers: list[int]) -> str:
    return ", ".join(map(str, numbers))
