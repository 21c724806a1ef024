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
``_run`` (:func:`search`: all of it in order). ``_verify`` (:func:`verify`: ``autotune verify``, the study's
answer measured again on today's install, through the confirmation's re-runs) reads a study a search made.
"""

from __future__ import annotations

from autotune.study._liveness import STOP_SIGNALS, stop_as_on_ctrl_c
from autotune.study._loop import measured_trials
from autotune.study._request import SearchBudget, SearchProgress, SearchRequest, default_study_name, prepare_request
from autotune.study._run import SearchHooks, search
from autotune.study._screening import margin_for, memory_fit_from_trials
from autotune.study._seeds import default_config
from autotune.study._setup import (
    calibration_study,
    check_identity,
    memory_fit_of_study,
    open_study,
    speed_model_of_study,
)
from autotune.study._verify import verify

__all__ = [
    "STOP_SIGNALS",
    "SearchBudget",
    "SearchHooks",
    "SearchProgress",
    "SearchRequest",
    "check_identity",
    "default_study_name",
    "default_config",
    "margin_for",
    "measured_trials",
    "memory_fit_from_trials",
    "calibration_study",
    "memory_fit_of_study",
    "speed_model_of_study",
    "open_study",
    "prepare_request",
    "search",
    "stop_as_on_ctrl_c",
    "verify",
]
