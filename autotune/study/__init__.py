"""The search: a study of trials, from the request to the confirmed winner.

The CLI prepares a :class:`SearchRequest` (:func:`prepare_request`), opens the study
(:func:`open_study`: set-up, seeds, the identity check) and makes one call, :func:`search`: kept
results recorded, dead runs' trials re-queued, the one trial loop (:func:`run_search`: one worker
per device, each trial screened, reused or run in a child by :mod:`autotune.runner`, then recorded
by :func:`tell`), why it stopped, the leaders re-measured (:func:`confirm_top`), the study's note.
The search benchmark makes the same call with a trial runner of its own. Liveness keeps a shared
study going when a worker dies. Only this package
writes trials; ranking, export, report and the dashboard read what it wrote.

Modules, in the order a search meets them: ``_request`` (what to search), ``_setup`` (create or
join a study), ``_seeds`` (its first trials), ``_proposals`` (the sampler, when the search is done), ``_loop`` (ask -> reuse | screen | run -> tell),
``_screening`` (configs known not to fit), ``_liveness`` (heartbeats, dead workers' trials),
``_record`` (``tell`` and the memory constraint), ``_confirm`` (interleaved re-runs of the leaders),
``_run`` (:func:`search`: all of it in order).
"""

from __future__ import annotations

from autotune.study._confirm import Confirmation, confirm_top
from autotune.study._liveness import recover_orphans
from autotune.study._loop import (
    MAX_ATTEMPTS,
    ask_trial,
    cap_decision,
    make_job,
    measured_trials,
    prune_threshold,
    run_one_trial,
    run_search,
)
from autotune.study._record import memory_constraint_gib, record_pending_results, tell
from autotune.study._request import (
    PreparedSearch,
    SearchBudget,
    SearchOptions,
    SearchProgress,
    SearchRequest,
    default_study_name,
    prepare_request,
    worker_devices,
)
from autotune.study._screening import margin_for, memory_fit_from_trials
from autotune.study._proposals import SearchFinished, stop_reason
from autotune.study._run import SearchHooks, SearchOutcome, search
from autotune.study._seeds import hf_default_config
from autotune.study._setup import check_identity, open_study

__all__ = [
    "MAX_ATTEMPTS",
    "Confirmation",
    "PreparedSearch",
    "SearchBudget",
    "SearchFinished",
    "SearchHooks",
    "SearchOptions",
    "SearchOutcome",
    "SearchProgress",
    "SearchRequest",
    "ask_trial",
    "cap_decision",
    "check_identity",
    "confirm_top",
    "default_study_name",
    "hf_default_config",
    "make_job",
    "margin_for",
    "measured_trials",
    "memory_fit_from_trials",
    "memory_constraint_gib",
    "open_study",
    "prepare_request",
    "prune_threshold",
    "record_pending_results",
    "recover_orphans",
    "run_one_trial",
    "run_search",
    "search",
    "stop_reason",
    "tell",
    "worker_devices",
]
