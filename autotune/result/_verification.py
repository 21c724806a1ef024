"""What ``autotune verify`` compares and finds: the study's answer as recorded, each figure measured again
and judged against it, and the libraries that changed since.

Records only: the study's answer is read by the views (the ranking names the winner,
:mod:`autotune.views.verify`), the re-runs and their judgement are the study's
(:mod:`autotune.study._verify`), and the views print them.
"""

from __future__ import annotations

import dataclasses
import enum

from autotune.result._profile import StepProfile


class Judgement(enum.StrEnum):
    """How a figure measured today compares with its record."""

    WITHIN = "within"  # within the noise (or --tolerance) of the record
    BETTER = "better"  # faster (or smaller) than recorded, beyond the noise
    WORSE = "worse"  # slower (or larger) than recorded, beyond the noise: a regression
    NOT_MEASURED = "not measured"  # no re-run finished under the ceiling: a regression


# The judgements that say the study's answer no longer holds.
REGRESSED_JUDGEMENTS = frozenset({Judgement.WORSE, Judgement.NOT_MEASURED})


@dataclasses.dataclass(frozen=True)
class StudyAnswer:
    """What a study answered, as its readers show it (``best``, ``export``): the winner, the trainer's
    default beside it, and their recorded figures (like with like: both the confirmation's re-run
    medians, else both search-time figures).

    Attributes:
        winner_trial: The winner's trial number (the config ``export`` writes).
        winner_samples_per_s: Its recorded throughput.
        winner_peak_bytes: Its recorded peak memory (the larger of search and re-runs).
        default_trial: The trainer's default seed trial (``TrainingArguments()``, or ``SFTConfig()``
            under ``--trainer sft``); ``None`` where it did not run and fit (no speedup recorded).
        default_samples_per_s: Its recorded throughput (``None`` with ``default_trial``).
        rerun_medians: The figures are the confirmation's re-run medians, not single measurements.
    """

    winner_trial: int
    winner_samples_per_s: float
    winner_peak_bytes: int
    default_trial: int | None = None
    default_samples_per_s: float | None = None
    rerun_medians: bool = False

    @property
    def speedup(self) -> float | None:
        """The winner's throughput over the default's, as recorded."""
        if self.default_samples_per_s is None or self.default_samples_per_s <= 0:
            return None
        return self.winner_samples_per_s / self.default_samples_per_s


@dataclasses.dataclass(frozen=True)
class FigureCheck:
    """One figure of the answer, measured again.

    Attributes:
        what: ``winner``, ``default``, ``speedup`` or ``peak memory`` (the winner's).
        recorded: The study's figure.
        today: The re-runs' (their median; the largest peak), ``None`` where none ran and fit.
        judgement: Against the record.
        higher_is_better: Throughput and speedup: more is better; peak memory: less is.
    """

    what: str
    recorded: float
    today: float | None
    judgement: Judgement
    higher_is_better: bool = True

    @property
    def change(self) -> float | None:
        """today / recorded - 1, ``None`` where not measured."""
        return None if self.today is None or self.recorded <= 0 else self.today / self.recorded - 1


@dataclasses.dataclass(frozen=True)
class VersionChange:
    """A library (or Python, CUDA, the driver) whose version differs from the study's record.

    ``recorded`` is ``None`` where the study's trials did not record it (made before autotune
    recorded that library); ``today`` is ``None`` where today's re-runs did not (none finished).
    """

    name: str
    recorded: str | None
    today: str | None


@dataclasses.dataclass(frozen=True)
class Verification:
    """The study's answer measured again, every figure judged, and the versions compared.

    Attributes:
        answer: The study's answer, as recorded.
        checks: Each figure: the winner's and the default's throughput, the speedup, the winner's peak.
        changed: The versions that differ between the winner's record and today's re-runs.
        noise: The noise the figures are judged by: the larger of the study's and today's.
        study_noise: The study's measured noise (``autotune.study._proposals.noise_fraction``).
        today_noise: Today's re-runs', by the same rule (``autotune.study._proposals.measured_noise``).
        interval: The half-width of each figure's interval, as a fraction (``x (1 +- interval)``): 2 x the
            noise, at least 2 x ``autotune.spec.measure.PRUNE_NOISE_FLOOR``.
        tolerance: ``--tolerance``, which replaces the noise where given.
        runs: Re-runs made, of each trial number: their statuses, in run order.
        failures: One line per re-run that did not run and fit (its status and error).
        seconds: Wall seconds the re-runs took.
        device: The device measured on, in words.
        recorded_callbacks: ``--callback`` classes the search's trials ran with (its recorded options).
        callbacks: Those today's re-runs ran with.
        profiles: ``--profile``: where each profiled run's step time went, by trial number (a run that did
            not train is among ``failures``); not judged.
    """

    answer: StudyAnswer
    checks: tuple[FigureCheck, ...]
    changed: tuple[VersionChange, ...]
    noise: float
    study_noise: float
    today_noise: float
    interval: float
    tolerance: float | None
    runs: dict[int, tuple[str, ...]]
    failures: tuple[str, ...]
    seconds: float
    device: str
    recorded_callbacks: tuple[str, ...] = ()
    callbacks: tuple[str, ...] = ()
    profiles: dict[int, StepProfile] = dataclasses.field(default_factory=dict)

    @property
    def regressed(self) -> tuple[FigureCheck, ...]:
        """The figures that say the answer no longer holds."""
        return tuple(check for check in self.checks if check.judgement in REGRESSED_JUDGEMENTS)

    @property
    def holds(self) -> bool:
        return not self.regressed
