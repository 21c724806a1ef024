"""Steady-state step timing inside a trial: a Trainer callback and its statistics.

What is timed is a whole optimizer step: every gradient-accumulation micro-batch, the data loading
between steps, the optimizer update. Clocks are read after the device is synchronised, so queued
GPU work lands in the step that queued it. Warm-up steps (allocator growth, autotuning, the first
compilation) and any later step during which ``torch.compile`` compiled are excluded from the
statistics and recorded separately.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from collections.abc import Callable

from transformers import TrainerCallback


@dataclasses.dataclass(frozen=True)
class MeasureSettings:
    """How long a trial measures.

    Measurement stops at the first of: the CV of the last ``min_steps`` step times is at most
    ``cv_target`` (steady), ``max_steps`` steps were measured, or ``max_seconds`` were spent measuring.

    Attributes:
        warmup_steps: Optimizer steps excluded from throughput (allocator growth, compilation).
        min_steps: Measured steps before the CV target may stop measurement; also the size of the
            window the median and CV are taken over.
        max_steps: Measured steps at most.
        max_seconds: Measured seconds at most (after warm-up).
        cv_target: Stop once the coefficient of variation of the last ``min_steps`` steps is below.
        prune_after_steps: Measured steps after which early stop may judge a trial (the median of
            what was measured so far against the pruning threshold). A trial pruned for being at
            less than half the best's speed (the default ratio) is told apart by three steps: step
            times move by a few percent, not by 2x, once warm-up is over.
    """

    warmup_steps: int = 3
    min_steps: int = 8
    max_steps: int = 40
    max_seconds: float = 30.0
    cv_target: float = 0.05
    prune_after_steps: int = 3

    @property
    def total_steps_cap(self) -> int:
        """Optimizer steps the Trainer is allowed (warm-up plus the measurement budget)."""
        return self.warmup_steps + self.max_steps


@dataclasses.dataclass(frozen=True)
class StepStats:
    """The steady-state figures of one trial.

    Attributes:
        median_s: Median optimizer-step time over the steady window.
        cv: Coefficient of variation (stdev / mean) of the step times in that window.
        measured_steps: Steps measured after warm-up (the window is the last ``min_steps`` of them).
        warmup_steps: Steps excluded: the configured warm-up plus any step that compiled.
        warmup_s: Wall time of the excluded steps (compilation included).
        compile_s: Time ``torch.compile`` reported spending in compilation (0 without compile).
        converged: The CV target was met; False when the step or time budget ran out first.
        measured_s: Wall time of every measured step (not only the window).
        measured_tokens: Input tokens those steps trained, as the Trainer counted them
            (``state.num_input_tokens_seen``; 0 where it does not count).
    """

    median_s: float
    cv: float
    measured_steps: int
    warmup_steps: int
    warmup_s: float
    compile_s: float = 0.0
    converged: bool = False
    measured_s: float = 0.0
    measured_tokens: int = 0

    @property
    def mean_s(self) -> float:
        """Mean time of a measured step: the throughput's figure when batches differ in content."""
        return self.measured_s / self.measured_steps if self.measured_steps else 0.0


def coefficient_of_variation(values: list[float]) -> float:
    """Sample standard deviation over the mean; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


def dynamo_compile_seconds() -> float:
    """Seconds ``torch.compile`` (dynamo + its backend, forward and backward) has spent in this process.

    Read from dynamo's own timers; 0 where dynamo was never imported (no compile, nothing to count).
    """
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return 0.0
    try:
        return float(utils.calculate_time_spent().get("total_wall_time", 0.0))
    except Exception:  # noqa: BLE001 - a private API; losing it must not fail a trial
        return 0.0


def _tokens_seen(state: object) -> int:
    """The Trainer's running count of input tokens (``include_num_input_tokens_seen``); 0 if it keeps none."""
    return int(getattr(state, "num_input_tokens_seen", 0) or 0)


class StepTimer(TrainerCallback):
    """Times whole optimizer steps (data loading and every accumulation micro-batch included).

    Each step's time runs from the end of the previous optimizer step to the end of this one, read
    after ``synchronize`` so that queued device work is counted. The first step's time starts at its
    ``on_step_begin``. Training stops once the steady state is measured (see :class:`MeasureSettings`).
    """

    def __init__(
        self,
        settings: MeasureSettings,
        synchronize: Callable[[], None],
        on_measured_step: Callable[[StepTimer], bool] | None = None,
        compile_clock: Callable[[], float] = dynamo_compile_seconds,
    ) -> None:
        """
        Args:
            settings: When to stop measuring.
            synchronize: Waits for queued device work (``torch.cuda.synchronize`` or a no-op).
            on_measured_step: Called after every measured step; returning True stops training early
                (used to prune a trial that is clearly slower than the best).
            compile_clock: Cumulative compilation seconds in this process; a step during which it
                advanced compiled something and is treated as warm-up.
        """
        self.settings = settings
        self._synchronize = synchronize
        self._on_measured_step = on_measured_step
        self._compile_clock = compile_clock
        self._compile_at_start = compile_clock()
        self._compile_at_last_step = self._compile_at_start
        self.first_step_started_at: float | None = None
        self._last_step_end: float | None = None
        self.warmup_times: list[float] = []
        self.step_times: list[float] = []
        self.measured_step_numbers: list[int] = []  # the Trainer's global step of each measured step
        self.step_tokens: list[int] = []  # input tokens of each measured step (Trainer's count)
        self._tokens_at_last_step = 0
        self.stopped_early = False

    def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001 - Trainer's signature
        if self._last_step_end is None:
            self._synchronize()
            self._last_step_end = self.first_step_started_at = time.perf_counter()
            self._tokens_at_last_step = _tokens_seen(state)

    def on_step_end(self, args, state, control, **kwargs):  # noqa: ANN001
        self._synchronize()
        now = time.perf_counter()
        assert self._last_step_end is not None
        elapsed, self._last_step_end = now - self._last_step_end, now
        compiled_now = self._compile_clock()
        compiled_during_step = compiled_now > self._compile_at_last_step
        self._compile_at_last_step = compiled_now
        tokens, self._tokens_at_last_step = _tokens_seen(state) - self._tokens_at_last_step, _tokens_seen(state)
        if len(self.warmup_times) < self.settings.warmup_steps or compiled_during_step:
            # A recompilation after warm-up (a new shape, a guard failure) is not steady-state work.
            self.warmup_times.append(elapsed)
            return control
        self.step_times.append(elapsed)
        self.measured_step_numbers.append(state.global_step)
        self.step_tokens.append(int(tokens))
        if self._done():
            control.should_training_stop = True
        elif self._on_measured_step is not None and self._on_measured_step(self):
            self.stopped_early = True
            control.should_training_stop = True
        return control

    def _window(self) -> list[float]:
        return self.step_times[-self.settings.min_steps :]

    def _converged(self) -> bool:
        return len(self.step_times) >= self.settings.min_steps and (
            coefficient_of_variation(self._window()) <= self.settings.cv_target
        )

    def _done(self) -> bool:
        s = self.settings
        if len(self.step_times) >= s.max_steps or sum(self.step_times) >= s.max_seconds:
            return True
        return self._converged()

    def stats(self) -> StepStats:
        """Median and CV over the steady-state window (the last ``min_steps`` steps, or all if fewer)."""
        window = self._window()
        return StepStats(
            median_s=statistics.median(window) if window else 0.0,
            cv=coefficient_of_variation(window),
            measured_steps=len(self.step_times),
            warmup_steps=len(self.warmup_times),
            warmup_s=sum(self.warmup_times),
            compile_s=max(self._compile_clock() - self._compile_at_start, 0.0),
            converged=self._converged(),
            measured_s=sum(self.step_times),
            measured_tokens=sum(self.step_tokens),
        )
