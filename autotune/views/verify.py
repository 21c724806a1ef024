"""What ``autotune verify`` reads of a study and prints: the answer as recorded, each re-run, each figure
against its record, the versions that changed, and one verdict line (``autotune.study._verify`` measures
and judges)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from rich.console import Console

from autotune.errors import AutotuneError
from autotune.result import FigureCheck, Judgement, StepProfile, StudyAnswer, TrialResult, Verification
from autotune.spec.measure import PRUNE_NOISE_FLOOR
from autotune.units import format_bytes
from autotune.views.ranking import confirmations_of, speedup_over_default, study_ranking, study_trainer

# Each figure's words: where it moved beyond the noise, by judgement and by which way is better.
_MOVED = {
    (Judgement.BETTER, True): "faster than recorded",
    (Judgement.WORSE, True): "slower than recorded",
    (Judgement.BETTER, False): "smaller than recorded",
    (Judgement.WORSE, False): "larger than recorded",
}


def study_answer(study: optuna.Study) -> StudyAnswer:
    """The study's answer as ``best`` and ``export`` show it: the ranking's winner, the speedup's default
    beside it, their figures like with like (:func:`autotune.views.ranking.speedup_over_default`).

    Raises:
        AutotuneError: No trial ran and fit: there is no answer to verify.
    """
    ranking = study_ranking(study)
    if not ranking:
        raise AutotuneError(
            f"study {study.study_name!r} has no winner to verify: no trial ran and fit under its ceiling "
            "(`autotune best --all` shows why); search it first"
        )
    best = ranking[0]
    speedup = speedup_over_default(study.get_trials(deepcopy=False), confirmations_of(study))
    if speedup is None or speedup.ratio is None:  # no default that ran and fit: the winner alone
        return StudyAnswer(best.number, best.samples_per_s, best.peak_memory_bytes, rerun_medians=best.confirmed)
    return StudyAnswer(
        winner_trial=best.number,
        winner_samples_per_s=speedup.best_samples_per_s,
        winner_peak_bytes=best.peak_memory_bytes,
        default_trial=speedup.default_trial,
        default_samples_per_s=speedup.default_samples_per_s,
        rerun_medians=speedup.rerun_medians,
    )


class VerifyPrinter:
    """What ``autotune verify`` prints, in order: :meth:`started`, :meth:`rerun` after each re-run,
    :meth:`finished` (which returns the exit status)."""

    def __init__(self, console: Console, study: Any, answer: StudyAnswer, repeats: int) -> None:
        self._console = console
        self._study = study
        self._answer = answer
        self._repeats = repeats
        self._baseline = study_trainer(study).baseline_words

    def _line(self, text: str) -> None:
        self._console.print(text, markup=False, highlight=False, soft_wrap=True)

    def _name(self, number: int) -> str:
        return f"winner #{number}" if number == self._answer.winner_trial else f"{self._baseline} #{number}"

    def started(self) -> None:
        answer = self._answer
        recorded = (
            "the confirmation's re-run medians" if answer.rerun_medians else "single search measurements, one each"
        )
        default = f" and the {self._baseline} #{answer.default_trial}" if answer.default_trial is not None else ""
        self._line(
            f"verify study {self._study.study_name!r}: measuring the winner #{answer.winner_trial}{default} again, "
            f"interleaved, {self._repeats} round(s), against what the study recorded ({recorded})"
        )
        if answer.default_trial is None:
            self._line(f"note: the {self._baseline} did not run and fit in the study: no speedup to verify")

    def rerun(self, round_index: int, number: int, result: TrialResult) -> None:
        if round_index >= self._repeats:  # the profiled run after the rounds (verify --profile)
            self._line(
                f"  profiled: {self._name(number)} {result.status}" + (f", {result.error[:80]}" if result.error else "")
            )
            return
        figure = f"{result.samples_per_s:.1f} samples/s" if result.samples_per_s else result.error[:80]
        self._line(
            f"  round {round_index + 1}/{self._repeats}: {self._name(number)} {result.status}, {figure}, "
            f"peak {format_bytes(result.peak_memory_bytes)}"
        )

    def finished(self, verification: Verification) -> int:
        """Every figure against its record, the versions, the verdict; the exit status (0 holds, 1 regressed)."""
        self._line(
            f"measured on {verification.device}: {sum(map(len, verification.runs.values()))} re-run(s) in "
            f"{verification.seconds:.0f} s"
        )
        for failure in verification.failures:
            self._line(f"  did not run and fit: {failure}")
        for check in verification.checks:
            self._line(f"{self._figure_words(check.what)}: {figure_text(check, verification.tolerance)}")
        self._line(f"judged against: {self._allowance(verification)}")
        self._line(versions_line(verification))
        if verification.recorded_callbacks != verification.callbacks:
            self._line(
                f"note: the search's trials ran with --callback {', '.join(verification.recorded_callbacks) or 'none'}; "
                f"these re-runs with {', '.join(verification.callbacks) or 'none'}"
            )
        for number, profile in verification.profiles.items():
            for line in profile_lines(self._name(number), profile):
                self._line(line)
        self._line(verdict_line(verification))
        return 0 if verification.holds else 1

    def _figure_words(self, what: str) -> str:
        answer = self._answer
        return {
            "winner": f"winner #{answer.winner_trial} samples/s",
            "default": f"{self._baseline} #{answer.default_trial} samples/s",
            "speedup": f"speedup over the {self._baseline}",
            "peak memory": f"winner #{answer.winner_trial} peak memory",
        }[what]

    @staticmethod
    def _allowance(verification: Verification) -> str:
        if verification.tolerance is not None:
            return f"--tolerance {verification.tolerance:.0%} of each recorded figure"
        return (
            f"the measured noise, {verification.noise:.1%} (the larger of the study's, {verification.study_noise:.1%}, "
            f"and today's re-runs', {verification.today_noise:.1%}): a figure changed when its interval, "
            f"+-{verification.interval:.1%} (2 x the noise, at least {PRUNE_NOISE_FLOOR:.0%}), no longer overlaps "
            "the record's"
        )


def _throughput(samples_per_s: float) -> str:
    return f"{samples_per_s:.1f}"


def _speedup(ratio: float) -> str:
    return f"{ratio:.2f}x"


# How each figure is shown (throughputs: samples/s, named by the line).
_FORMATS: dict[str, Callable[[float], str]] = {"speedup": _speedup, "peak memory": format_bytes}


def figure_text(check: FigureCheck, tolerance: float | None) -> str:
    """``412.3 today, 250.0 recorded: +64.9 %, faster than recorded`` (sizes in bytes' units, a speedup as ``x``)."""
    show = _FORMATS.get(check.what, _throughput)
    if check.today is None:
        return f"not measured today (no re-run ran and fit), {show(check.recorded)} recorded"
    change = check.change
    within = "within the noise" if tolerance is None else "within the tolerance"
    moved = _MOVED.get((check.judgement, check.higher_is_better), within)
    return f"{show(check.today)} today, {show(check.recorded)} recorded: {change:+.1%}, {moved}"


def versions_line(verification: Verification) -> str:
    """The versions that changed since the study's winner was measured, and those it did not record."""
    if not verification.changed:
        return "versions: none changed since the study's winner was measured"
    changed = [c for c in verification.changed if c.recorded is not None and c.today is not None]
    unrecorded = [c for c in verification.changed if c.recorded is None and c.today is not None]
    parts = []
    if changed:
        parts.append("changed since the study: " + ", ".join(f"{c.name} {c.recorded} -> {c.today}" for c in changed))
    if unrecorded:
        parts.append(
            "not recorded by the study (measured before autotune recorded them): "
            + ", ".join(f"{c.name} (today {c.today})" for c in unrecorded)
        )
    return "versions: " + ("; ".join(parts) if parts else "none changed that today's re-runs recorded")


def verdict_line(verification: Verification) -> str:
    """The one verdict line: the answer holds (and how), or which figures regressed."""
    if verification.regressed:
        return "verdict: REGRESSED: " + ", ".join(
            f"{check.what} {'not measured' if check.today is None else _MOVED[(check.judgement, check.higher_is_better)]}"
            for check in verification.regressed
        )
    better = [check.what for check in verification.checks if check.judgement == Judgement.BETTER]
    how = f" ({', '.join(better)} better than recorded)" if better else " (every figure as recorded)"
    return f"verdict: the study's answer holds on today's install{how}"


def profile_lines(name: str, profile: StepProfile) -> list[str]:
    """Where a profiled run's step went: its wall time, the device's busy share (CUDA), the data loader's and
    the optimizer's host time, then its operators with most self time, each per step and as a share of the step."""
    per_step = profile.step_s
    parts = [f"{per_step * 1000:.1f} ms per step over {profile.steps} profiled step(s)"]
    if profile.device_busy_s is not None:
        busy = profile.share(profile.device_busy_s)
        waiting = f": the device waited for the host {1 - busy:.0%} of the step" if profile.host_bound else ""
        parts.append(f"some kernel ran {busy:.0%} of it{waiting}")
    else:  # a CPU's operators: the rest of the step is Python and the framework between them
        parts.append(f"operators {profile.share(profile.operators_s):.0%} of it")
    parts.append(f"data loading {profile.share(profile.data_loader_s):.0%}")
    parts.append(f"optimizer step {profile.share(profile.optimizer_s):.0%} (host time)")
    clock = "device" if profile.time_of == "device" else "CPU"
    lines = [f"where the step time went, {name}: " + ", ".join(parts)]
    lines += [
        f"  {op.name}: {op.self_s / profile.steps * 1000:.1f} ms per step ({profile.share(op.self_s):.0%} of the "
        f"step, {clock} self time, {op.calls} call(s))"
        for op in profile.top
    ]
    lines.append(f"  every operator: {profile.table}; the trace (open it in https://ui.perfetto.dev): {profile.trace}")
    return lines
