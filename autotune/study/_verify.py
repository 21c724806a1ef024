"""``autotune verify``: does the study's answer still hold on today's install?

A study's answer (the winner, and its speedup over the trainer's default) was measured with the libraries
installed then. After ``pip install -U`` it may no longer hold: a transformers nightly once made a 750-step
run take 43 h (unsloth#1144). Verify measures the answer again, as the search measured it:

* The workload is planned again from the options the search recorded (``search_options``,
  :mod:`autotune.storage.schema`) through the one plan (:func:`._request.prepare_request`), on the study's
  device (the device the search used, or ``--device`` / ``--gpu``, whose name must be the study's), under
  the study's ceiling; what the plan makes must be the study's identity (:func:`._setup.check_identity`).
  The search's ``--callback`` classes are not carried over: the re-runs add only verify's own.
* The winner and the trainer's default seed trial are re-run in trial children, as the search runs trials,
  interleaved (A B, then B A, ...: :func:`._confirm.in_round_order`, :func:`._confirm.rerun`), each figure
  the median of its re-runs (:func:`._confirm.summarise`), the peak the largest.
* Each figure (both throughputs, the speedup, the winner's peak memory) is judged against the record by
  the rule that decides whether two figures differ in a confirmation
  (:func:`._confirm.within_reach_of_the_leader`: intervals of ``x (1 +- 2 x noise)`` that no longer
  overlap), the noise being the larger of the study's measured one (:func:`._proposals.noise_fraction`)
  and today's re-runs' (the same rule, :func:`._proposals.measured_noise`), or, with ``--tolerance``, by
  that fraction of the recorded figure. A figure that is worse beyond it, or that no
  re-run measured (every re-run failed, ran out of memory or went over the ceiling), is a regression.
* The versions the winner's trial recorded (``TrialResult.versions``) are compared with those today's
  re-runs record.
* ``--profile``: after the judged re-runs, each of the two runs once more with its first :data:`PROFILE_STEPS`
  steps after warm-up under torch's profiler (``_confirm.rerun``'s ``profile_steps``, ``autotune/runner/_step_profile.py``):
  where its step time went. Not judged, and not among the re-runs: recording every operator slows the step.

Nothing is written to the study: verify reads it, and its re-runs are its own.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import optuna
import psutil

from autotune.errors import AutotuneError
from autotune.levers import TrialConfig
from autotune.plan import SearchOptions, VerifyOptions
from autotune.result import (
    FigureCheck,
    Judgement,
    StepProfile,
    StudyAnswer,
    TrialResult,
    Verification,
    VersionChange,
)
from autotune.runner import run_isolated
from autotune.spec.ceiling import ranks_sharing
from autotune.storage import schema
from autotune.study._confirm import in_round_order, interval_width, rerun, summarise, within_reach_of_the_leader
from autotune.study._proposals import measured_noise, noise_fraction
from autotune.study._request import SearchRequest, prepare_request
from autotune.study._setup import check_identity

# Steps ``--profile`` records after warm-up: enough to see a step's repeating pattern (its data loading, its
# optimizer step) without a trace too large to open; a step of a 1B decoder is tens of thousands of kernels.
PROFILE_STEPS = 3
# What to do when the recorded options no longer plan the study's workload here.
SAME_SETUP_REMEDY = (
    "verify measures what the study measured: put back what its search read (the model, the data, "
    "--base-args, the space), or search again"
)


def verify(
    study: optuna.Study,
    answer: StudyAnswer,
    options: VerifyOptions,
    on_run: Callable[[int, int, TrialResult], None] | None = None,
    run_trial: Callable[..., TrialResult] = run_isolated,
) -> Verification:
    """Measure ``answer`` (the study's, as its readers show it) again and judge it (module docstring).

    Args:
        study: The study.
        answer: Its winner, the trainer's default and their recorded figures (``autotune.views.verify``).
        options: ``verify``'s options.
        on_run: Called after every re-run with (round, trial number, result); a profiled run's round is
            ``options.repeats``, after the last.
        run_trial: Runs a :class:`autotune.runner.TrialJob` (``run_isolated``'s signature).

    Raises:
        AutotuneError: The study records no search options, its device is not here, its options plan
            another setup here, or ``--profile`` is asked of trials of several ranks.
        KeyboardInterrupt: After killing the running re-run.
    """
    request = verify_request(study, options)
    if options.profile and request.workload.devices_per_trial > 1:
        raise AutotuneError(
            f"--profile profiles a trial of one process, and study {study.study_name!r} trains each trial on "
            f"{request.workload.devices_per_trial} ranks (each would profile its own): verify it without --profile"
        )
    trials = {trial.number: trial for trial in study.get_trials(deepcopy=False)}
    numbers = list(dict.fromkeys(n for n in (answer.winner_trial, answer.default_trial) if n is not None))
    runs: dict[int, list[TrialResult]] = {number: [] for number in numbers}
    started = time.perf_counter()
    for round_index in range(options.repeats):
        for number in in_round_order(numbers, round_index):
            config = TrialConfig.from_params(trials[number].params)
            result = rerun(request, config, f"{number}-verify-{round_index}", run_trial)
            runs[number].append(result)
            if on_run is not None:
                on_run(round_index, number, result)
    seconds = time.perf_counter() - started
    profiled: dict[int, TrialResult] = {}
    for number in numbers if options.profile else ():  # after the judged re-runs: profiling slows a step
        config = TrialConfig.from_params(trials[number].params)
        profiled[number] = rerun(request, config, f"{number}-profile", run_trial, profile_steps=PROFILE_STEPS)
        if on_run is not None:
            on_run(options.repeats, number, profiled[number])
    summaries = {number: summarise(number, results) for number, results in runs.items()}
    # Each figure's interval is as wide as the noise of the period it was measured in: a quiet search
    # does not make a re-run on a busy machine precise, nor the reverse. So the larger of the two.
    today_noise = measured_noise(
        [c.cv for c in summaries.values() if c.repeats >= 2], [r for results in runs.values() for r in results]
    )
    study_noise = noise_fraction(study)
    noise = max(study_noise, today_noise)
    winner = summaries[answer.winner_trial]

    def check(what: str, recorded: float, today: float | None, higher_is_better: bool = True) -> FigureCheck:
        judgement = judge(recorded, today, noise, options.tolerance, higher_is_better)
        return FigureCheck(what, recorded, today, judgement, higher_is_better)

    checks = [check("winner", answer.winner_samples_per_s, winner.samples_per_s)]
    if answer.default_trial is not None and answer.default_samples_per_s is not None and answer.speedup is not None:
        default = summaries[answer.default_trial]
        speedup = None
        if winner.samples_per_s is not None and default.samples_per_s:
            speedup = winner.samples_per_s / default.samples_per_s
        checks += [
            check("default", answer.default_samples_per_s, default.samples_per_s),
            check("speedup", answer.speedup, speedup),
        ]
    checks.append(check("peak memory", answer.winner_peak_bytes, winner.peak_memory_bytes or None, False))
    recorded_result = TrialResult.from_trial(trials[answer.winner_trial])
    today_versions = next((r.versions for results in runs.values() for r in results if r.versions), {})
    return Verification(
        answer=answer,
        checks=tuple(checks),
        changed=changed_versions(recorded_result.versions if recorded_result else {}, today_versions),
        noise=noise,
        study_noise=study_noise,
        today_noise=today_noise,
        interval=interval_width(noise),
        tolerance=options.tolerance,
        runs={number: tuple(r.status for r in results) for number, results in runs.items()},
        failures=tuple(
            f"#{number} re-run {index + 1}: {result.status}" + (f" ({result.error})" if result.error else "")
            for number, results in runs.items()
            for index, result in enumerate(results)
            if not result.feasible
        )
        + tuple(
            f"#{number} profiled run: {result.status}"
            + (f" ({result.error})" if result.error else " (no step after warm-up ran to profile)")
            for number, result in profiled.items()
            if not result.profile
        ),
        seconds=seconds,
        device=f"{request.workload.device.label} ({request.workload.device.name})",
        recorded_callbacks=tuple((study.user_attrs.get(schema.STUDY_SEARCH_OPTIONS) or {}).get("callbacks") or ()),
        callbacks=options.callbacks,
        profiles={
            number: StepProfile.from_dict(result.profile) for number, result in profiled.items() if result.profile
        },
    )


def verify_request(study: optuna.Study, options: VerifyOptions) -> SearchRequest:
    """The study's workload planned again from the options its search recorded, on its device (or
    ``--device`` / ``--gpu``), under its ceiling, with verify's callbacks, one trial at a time.

    Raises:
        AutotuneError: No options recorded, the study's device not here, another setup planned here.
    """
    recorded = study.user_attrs.get(schema.STUDY_SEARCH_OPTIONS)
    if not recorded:
        raise AutotuneError(
            f"study {study.study_name!r} does not record the options of the search that made it (made before "
            "autotune recorded them, or by a script): resume it once with `autotune search` and its options, then verify"
        )
    known = {field.name for field in dataclasses.fields(SearchOptions)}
    values = {name: value for name, value in recorded.items() if name in known}
    values.update(callbacks=tuple(options.callbacks), workers=1, screen=False)
    if (ceiling := study.user_attrs.get(schema.STUDY_CEILING_BYTES)) is not None:
        # The study's, whatever this machine's memory: a rank's, given as the whole its ranks share.
        sharing = ranks_sharing(
            str(study.user_attrs.get(schema.STUDY_DEVICE_KIND)), int(values.get("devices_per_trial") or 1)
        )
        values["memory_ceiling"] = f"{int(ceiling) * sharing}B"
    if options.device is not None or options.gpu is not None:
        values.update(device=options.device, gpu=options.gpu, gpus=None)
    elif values.get("gpus"):  # one worker: the search's first GPU (its first group of a trial's GPUs)
        first = str(values["gpus"]).split(",")[: int(values.get("devices_per_trial") or 1)]
        values.update(gpus=",".join(first) if len(first) > 1 else None, gpu=None if len(first) > 1 else int(first[0]))
    search_options = SearchOptions(**values)
    identity = study.user_attrs.get(schema.STUDY_IDENTITY) or {}
    device = search_options.worker_devices()[0]  # before the plan: a device that is not here is said at once
    if identity.get("device") != device.name:
        raise AutotuneError(
            f"study {study.study_name!r} was measured on {identity.get('device')}, and {device.label} here is "
            f"{device.name}: verify measures on the study's device; run it where one is, or name one with --device or --gpu"
        )
    request = prepare_request(search_options, psutil.virtual_memory().available).request
    check_identity(study, request.identity(), remedy=SAME_SETUP_REMEDY)
    return request


def judge(
    recorded: float, today: float | None, noise: float, tolerance: float | None, higher_is_better: bool = True
) -> Judgement:
    """``today`` against ``recorded``: within the noise (or ``tolerance``), better, or worse.

    Without ``tolerance``, two figures differ when their intervals ``x (1 +- 2 x noise)`` no longer
    overlap (:func:`._confirm.within_reach_of_the_leader`, the rule a confirmation tells candidates
    apart by); with it, when ``today`` is more than that fraction of ``recorded`` away from it.
    """
    if today is None:
        return Judgement.NOT_MEASURED
    if tolerance is None:
        if len(within_reach_of_the_leader({0: recorded, 1: today}, noise)) == 2:
            return Judgement.WITHIN
    elif recorded * (1 - tolerance) <= today <= recorded * (1 + tolerance):
        return Judgement.WITHIN
    return Judgement.BETTER if (today > recorded) == higher_is_better else Judgement.WORSE


def changed_versions(recorded: dict[str, str], today: dict[str, str]) -> tuple[VersionChange, ...]:
    """The versions that differ between a trial's record and today's re-runs (``None``: not recorded);
    none where today's re-runs recorded none (no re-run started training). The device is not a version:
    the study's identity holds it."""
    if not today:
        return ()
    names = [name for name in dict.fromkeys([*recorded, *today]) if name != "device"]
    return tuple(
        VersionChange(name, recorded.get(name), today.get(name))
        for name in names
        if recorded.get(name) != today.get(name)
    )
