"""Steady-state step timing inside a trial: a Trainer callback and its statistics."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

from transformers import TrainerCallback


@dataclasses.dataclass(frozen=True)
class MeasureSettings:
    """How long a trial measures.

    Attributes:
        warmup_steps: Optimizer steps excluded from throughput (allocator growth, compilation).
        min_steps: Measured steps before the CV target may stop measurement.
        max_steps: Measured steps at most.
        max_seconds: Measured seconds at most (after warm-up).
        cv_target: Stop once the coefficient of variation of the last ``min_steps`` steps is below.
    """

    warmup_steps: int = 3
    min_steps: int = 8
    max_steps: int = 40
    max_seconds: float = 30.0
    cv_target: float = 0.05

    @property
    def total_steps_cap(self) -> int:
        return self.warmup_steps + self.max_steps


@dataclasses.dataclass(frozen=True)
class StepStats:
    median_s: float
    cv: float
    measured_steps: int
    warmup_steps: int
    warmup_s: float


def coefficient_of_variation(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


class StepTimer(TrainerCallback):
    """Times whole optimizer steps (data loading and every accumulation micro-batch included).

    Each step's time runs from the end of the previous optimizer step to the end of this one, read
    after ``synchronize`` so that queued device work is counted. Training stops once the steady
    state is measured (see :class:`MeasureSettings`).
    """

    def __init__(
        self,
        settings: MeasureSettings,
        synchronize: Callable[[], None],
        on_measured_step: Callable[[StepTimer], bool] | None = None,
    ) -> None:
        """
        Args:
            settings: When to stop measuring.
            synchronize: Waits for queued device work (``torch.cuda.synchronize`` or a no-op).
            on_measured_step: Called after every measured step; returning True stops training early
                (used to prune a trial that is clearly slower than the best).
        """
        self.settings = settings
        self._synchronize = synchronize
        self._on_measured_step = on_measured_step
        self.first_step_started_at: float | None = None
        self._last_step_end: float | None = None
        self.warmup_times: list[float] = []
        self.step_times: list[float] = []
        self.stopped_early = False

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's signature
        if self._last_step_end is None:
            self._synchronize()
            self._last_step_end = self.first_step_started_at = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self._synchronize()
        now = time.perf_counter()
        assert self._last_step_end is not None
        elapsed, self._last_step_end = now - self._last_step_end, now
        if len(self.warmup_times) < self.settings.warmup_steps:
            self.warmup_times.append(elapsed)
            return control
        self.step_times.append(elapsed)
        if self._done():
            control.should_training_stop = True
        elif self._on_measured_step is not None and self._on_measured_step(self):
            self.stopped_early = True
            control.should_training_stop = True
        return control

    def _done(self) -> bool:
        s = self.settings
        n = len(self.step_times)
        if n >= s.max_steps or sum(self.step_times) >= s.max_seconds:
            return True
        return n >= s.min_steps and coefficient_of_variation(self.step_times[-s.min_steps :]) <= s.cv_target

    def stats(self) -> StepStats:
        """Median and CV over the steady-state window (the last ``min_steps`` steps, or all)."""
        window = self.step_times[-self.settings.min_steps :] if self.step_times else []
        return StepStats(
            median_s=statistics.median(window) if window else 0.0,
            cv=coefficient_of_variation(window),
            measured_steps=len(self.step_times),
            warmup_steps=len(self.warmup_times),
            warmup_s=sum(self.warmup_times),
        )
