"""Every key autotune writes into an Optuna study, with who writes it and who reads it.

A study outlives the autotune version that made it and is read by other programs (optuna-dashboard,
the user's own scripts): the keys below are its file format. Modules name a key through these
constants only, never as a string of their own.

Study user attributes (``study.user_attrs``):

========================  =============================================  ==================================
key                       written by                                     read by
========================  =============================================  ==================================
``metric``                study set-up (:mod:`autotune.study._setup`)    the dashboard (metric name)
``identity``              study set-up: model, task, seq len, device,    study set-up of a resumed or
                          dataset, fixed arguments                       joining search; ``estimate``
``space``                 study set-up: the knobs' choices               study set-up (one space a study);
                                                                         the report (knob effects)
``ceiling_bytes``         study set-up                                   study set-up (a changed ceiling
                                                                         is refused); ranking; report
``device_kind``           study set-up (``cpu`` or ``cuda``)             export (the mapping's device)
``base_args``             study set-up: the user's fixed arguments       export (kept in every format)
``seed_notes``            study set-up: how the seeds were fitted        ``search`` (printed once)
``confirmation``          confirmation (:mod:`autotune.study._confirm`)  ranking, export, report, dashboard
``time_spent``            the end of a search (:mod:`autotune.study._run`): ``search``'s last line, the dashboard
                          where its wall time went (``TimeSpent``)       note
``dataset_samples``       study set-up: the samples one epoch of the     the run-time line (search, ``best``,
                          user's run trains (``None``: synthetic tokens  report, export:
                          or packed data longer than the trials read)    :mod:`autotune.views.run_time`)
``search_options``        study set-up, and each search that resumes or  ``verify``
                          joins it: the ``search`` options as typed      (:mod:`autotune.study._verify`):
                          (``SearchOptions``, by field name)             the workload planned again
========================  =============================================  ==================================

The ``confirmation`` record's keys: ``measured_at``, ``top_k``, ``repeats``, ``candidates`` (the top-k
trial numbers considered), ``reference`` (the HF-default seed trial re-run beside them, so the speedup
over it compares re-runs of the same period; ``None`` where it was a candidate re-run already or did not
run and fit; absent from records written before it), ``noise``, ``runs``, ``seconds``,
``budget_fraction``, ``search_s``, ``budget_s``, ``stopped`` (``CONFIRMATION_*`` below), ``trials``
(trial number -> its re-runs' summary, ``Confirmation.to_attr``).

A trial's ``result`` records the versions it ran with (``TrialResult.versions``: each library of
``autotune.runner._measured.RECORDED_DISTRIBUTIONS``, ``not installed`` where absent, Python, the device's
name, CUDA and the driver on a GPU; trials recorded before a library joined that list lack its key).

Study system attributes: ``autotune_setup_by`` (study set-up, while it sets a new study up; read
by a joining worker waiting for the identity).

Trial user attributes (``trial.user_attrs``):

========================  =============================================  ==================================
key                       written by                                     read by
========================  =============================================  ==================================
``result``                ``tell`` (:mod:`autotune.study._record`): the  everything downstream:
                          whole :class:`autotune.result.TrialResult`     ranking, export, report, dashboard
``status``                ``tell``: the result's status alone            the dashboard's trial table
``seed``                  seeds (``hf-default``, ``best-practice``)      ranking (speedup over the default)
``seed_instead_of``       seeds: the levers the space could not hold     the speedup line (names the
                          at the default's value, with that value        nearest config so)
``reused_from``           the trial loop: the trial this repeat's        ranking (left out), screening
                          result was copied from
``proposed_again``        the sampler (:mod:`autotune.study._proposals`):  ``best --all``, the dashboard note
                          the measured trial its drawn landscape
                          ranked above every untaken config
``first_attempt``         the trial loop: why a retried attempt failed   the dashboard, ``best --all``
``predicted_peak_bytes``  screening: the estimate a screened trial       the dashboard
                          rests on
``predicted_host_bytes``  screening, for a ZeRO offload config: the      the export's note (host RAM the
                          host memory its offloaded states take          winner needs)
========================  =============================================  ==================================

Trial system attributes: ``constraints`` (``tell``: ``[peak - ceiling in GiB]``, feasible when
<= 0; the legacy list Optuna 5 reads as constraint 0 and optuna-dashboard 0.21 reads alone:
``trial.set_constraint`` writes ``constraints:<key>``, which that dashboard ignores), and
``autotune_owner`` (the trial loop: host, PID namespace, PID and start time of the worker that
runs it; read by liveness to tell a dead worker's trial from a live one's).
"""

from __future__ import annotations

# Study user attrs.
STUDY_METRIC = "metric"
STUDY_IDENTITY = "identity"
STUDY_SPACE = "space"
STUDY_CEILING_BYTES = "ceiling_bytes"
STUDY_DEVICE_KIND = "device_kind"
STUDY_BASE_ARGS = "base_args"
STUDY_SEED_NOTES = "seed_notes"
STUDY_CONFIRMATION = "confirmation"
STUDY_TIME_SPENT = "time_spent"
STUDY_SEARCH_OPTIONS = "search_options"
STUDY_DATASET_SAMPLES = "dataset_samples"
# Why a confirmation stopped (its record's ``stopped``): no candidate beside the leader could still be
# ahead; the budget allowed no more re-runs; every round ran.
CONFIRMATION_SETTLED = "settled"
CONFIRMATION_BUDGET = "budget"
CONFIRMATION_ALL_ROUNDS = "all rounds"
# Study system attr.
STUDY_SETUP_BY = "autotune_setup_by"

# Trial user attrs.
TRIAL_RESULT = "result"
TRIAL_STATUS = "status"
TRIAL_SEED = "seed"
TRIAL_SEED_INSTEAD_OF = "seed_instead_of"
TRIAL_REUSED_FROM = "reused_from"
TRIAL_PROPOSED_AGAIN = "proposed_again"
TRIAL_FIRST_ATTEMPT = "first_attempt"
# The config's predicted peak, written when it is proposed (study._screening.record_predictions): the
# calibrated estimate (the figure screening judges) and the estimator's prior, before any calibration.
# The same names key them in the stored result's memory_peaks, beside what was measured.
TRIAL_PREDICTED_PEAK_BYTES = "predicted_peak_bytes"
TRIAL_PRIOR_PEAK_BYTES = "prior_peak_bytes"
# ZeRO offload: the host memory the config's offloaded states take (the prior's estimate; exact counts).
TRIAL_PREDICTED_HOST_BYTES = "predicted_host_bytes"
# The throughput prior's real tokens/s for the config, written beside its peaks when it is proposed (before
# any calibration: what `autotune estimate` predicts), so every trial compares the prior with what it measured.
TRIAL_PRIOR_TOKENS_PER_S = "prior_tokens_per_s"
# Trial system attrs.
TRIAL_CONSTRAINTS = "constraints"
TRIAL_OWNER = "autotune_owner"

# The objective's name, as Optuna and the dashboard show it.
METRIC_NAME = "model TFLOPs"
# Values of TRIAL_SEED.
SEED_HF_DEFAULT = "hf-default"
SEED_BEST_PRACTICE = "best-practice"
