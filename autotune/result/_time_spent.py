"""Where a search's wall time went: measured steps, warm-up and compile, start-up, pruned trials,
confirmation, and the rest, as one record and one line.

A search computes it at its end (``autotune.study.search``) from the trials it ran and the time
its confirmation took, stores it in the study (``time_spent``, :mod:`autotune.storage.schema`), and
``autotune search`` and the study's dashboard note both print :meth:`TimeSpent.line`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from autotune.result._trial_result import GIVEN_UP_STATUSES, Status, TrialResult


@dataclasses.dataclass(frozen=True)
class TimeSpent:
    """A search's wall time by what it was spent on, in seconds.

    Attributes:
        wall_s: The whole search, from before its first trial to the end of its confirmation.
        measured_s: The measured (timed) steps of the trials that ran to the end of their
            measurement: the time the ranking stands on.
        warmup_s: Those trials' warm-up steps, compilation included.
        startup_s: The rest of those trials' wall time: the child's start, the model build, the
            Trainer's set-up, the end of the trial (the worst-case batch, the result).
        pruned_s: The whole wall time of the trials stopped early.
        failed_s: The whole wall time of the trials that failed for good (a timeout, a crash, an error:
            ``GIVEN_UP_STATUSES``), their last attempt's: a timeout's whole budget is here, not in start-up.
        confirmation_s: The confirmation's re-runs (with what happened between them).
        confirmation_measured_s: Of those, the re-runs' measured steps: with :attr:`measured_s`, the
            wall time spent measuring configs that were not pruned.
        trials: Trials run to the end of their measurement; ``pruned``: stopped early; ``failed``: failed for
            good; ``screened``: not run; ``confirmation_runs``: re-runs of the confirmation.
    """

    wall_s: float
    measured_s: float = 0.0
    warmup_s: float = 0.0
    startup_s: float = 0.0
    pruned_s: float = 0.0
    failed_s: float = 0.0
    confirmation_s: float = 0.0
    confirmation_measured_s: float = 0.0
    trials: int = 0
    pruned: int = 0
    failed: int = 0
    screened: int = 0
    confirmation_runs: int = 0

    @classmethod
    def of_search(
        cls,
        results: Iterable[TrialResult],
        wall_s: float,
        confirmation_s: float = 0.0,
        reruns: Iterable[TrialResult] = (),
    ) -> TimeSpent:
        """From the results of the trials a search ran (repeats answered from the record left out)
        and of its confirmation's re-runs."""
        results, reruns = list(results), list(reruns)
        failed = [r for r in results if r.status in GIVEN_UP_STATUSES]
        ran = [
            r
            for r in results
            if r.status not in (Status.SCREENED, Status.PRUNED, Status.INTERRUPTED)
            and r.status not in GIVEN_UP_STATUSES
        ]
        pruned = [r for r in results if r.status == Status.PRUNED]
        return cls(
            wall_s=wall_s,
            measured_s=sum(r.measured_s for r in ran),
            warmup_s=sum(r.warmup_s for r in ran),
            startup_s=sum(max(r.wall_s - r.measured_s - r.warmup_s, 0.0) for r in ran),
            pruned_s=sum(r.wall_s for r in pruned),
            failed_s=sum(r.wall_s for r in failed),
            confirmation_s=confirmation_s,
            confirmation_measured_s=sum(r.measured_s for r in reruns),
            trials=len(ran),
            pruned=len(pruned),
            failed=len(failed),
            screened=sum(r.status == Status.SCREENED for r in results),
            confirmation_runs=len(reruns),
        )

    @property
    def other_s(self) -> float:
        """What no trial and no re-run accounts for: the sampler, screening, the storage, a failed
        first attempt of a retried trial, an interrupted trial."""
        accounted = (
            self.measured_s + self.warmup_s + self.startup_s + self.pruned_s + self.failed_s + self.confirmation_s
        )
        return max(self.wall_s - accounted, 0.0)

    def share(self, seconds: float) -> float:
        return seconds / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        """``time: 4 min 12 s in all: measured steps 61% (9 trials), warm-up and compile 12%, ...``"""
        parts = [
            f"measured steps {self.share(self.measured_s):.0%} ({self.trials} trial{'s' * (self.trials != 1)})",
            f"warm-up and compile {self.share(self.warmup_s):.0%}",
            f"process start-up and model build {self.share(self.startup_s):.0%}",
            f"pruned trials {self.share(self.pruned_s):.0%} ({self.pruned})",
            *([f"failed trials {self.share(self.failed_s):.0%} ({self.failed})"] if self.failed else []),
            f"confirmation {self.share(self.confirmation_s):.0%} ({self.confirmation_runs} re-runs"
            + (
                f", {self.share(self.confirmation_measured_s):.0%} in measured steps)"
                if self.confirmation_runs
                else ")"
            ),
            f"screening and other {self.share(self.other_s):.0%}"
            + (f" ({self.screened} screened)" if self.screened else ""),
        ]
        return f"time: {_duration(self.wall_s)} in all: " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TimeSpent:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})


def _duration(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{rest} s"
