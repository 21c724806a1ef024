"""The step timer inside a trial: a Trainer callback that times whole optimizer steps.

What is timed is a whole optimizer step: every gradient-accumulation micro-batch, the data loading
between steps, the optimizer update. Clocks are read after the device is synchronised, so queued
GPU work lands in the step that queued it. Warm-up steps (allocator growth, autotuning, the first
compilation) and any later step during which ``torch.compile`` compiled are excluded from the
statistics (:class:`autotune.spec.measure.StepStats`) and recorded separately.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from autotune.spec.measure import MeasureSettings, StepStats, coefficient_of_variation


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


def several_ranks() -> bool:
    """Whether this process is one rank of a trial of several (torch.distributed set up, more than one rank)."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def any_rank(flags: tuple[bool, ...], device: Any) -> tuple[bool, ...]:
    """Each of ``flags`` (this rank's answers) true where it is on any rank of the trial.

    Every rank calls it at the end of every step, so the ranks stop at the same step, and for the same reason.
    Each rank's own measurement converges at its own step (its CV, its time budget), and a rank that left the
    loop alone ran the Trainer's closing collectives (``store_flos``'s gather of a float) against the others' next
    step: gloo aborted the trial ("Received data size doesn't match expected size", seen on 2-rank ZeRO offload
    trials on the CPU, docs/benchmarks.md, "ZeRO and several ranks"); a rank stopped as still compiling returns
    without the fullest batch's step the others would run. One all-reduce of a few ints a step, on the rank's
    device (``TrainingArguments.device``: NCCL's collectives take CUDA tensors).
    """
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([int(flag) for flag in flags], dtype=torch.int32, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tuple(bool(value) for value in tensor.tolist())


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
        self.recompiled_steps = 0  # steps after warm-up during which torch.compile compiled
        self._other_rank_compiling = False  # a trial of several ranks: another rank is still compiling

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self._last_step_end is None:
            self._synchronize()
            self._last_step_end = self.first_step_started_at = time.perf_counter()
            self._tokens_at_last_step = _tokens_seen(state)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        self._synchronize()
        now = time.perf_counter()
        assert self._last_step_end is not None
        elapsed, self._last_step_end = now - self._last_step_end, now
        stop = self._record(elapsed, state)
        if args is not None and several_ranks():
            stop, self._other_rank_compiling = any_rank((stop, self.still_compiling), args.device)
            self._last_step_end = time.perf_counter()  # the agreement is the timer's work, not the next step's
        if stop:
            control.should_training_stop = True
        return control

    def _record(self, elapsed: float, state: TrainerState) -> bool:
        """Count one step of ``elapsed`` seconds; whether this rank's measurement is done."""
        compiled_now = self._compile_clock()
        compiled_during_step = compiled_now > self._compile_at_last_step
        self._compile_at_last_step = compiled_now
        tokens, self._tokens_at_last_step = _tokens_seen(state) - self._tokens_at_last_step, _tokens_seen(state)
        if len(self.warmup_times) < self.settings.warmup_steps or compiled_during_step:
            # A recompilation after warm-up (a new shape, a guard failure) is not steady-state work.
            recompiled = len(self.warmup_times) >= self.settings.warmup_steps
            self.warmup_times.append(elapsed)
            self.recompiled_steps += recompiled
            return self.still_compiling
        self.step_times.append(elapsed)
        self.measured_step_numbers.append(state.global_step)
        self.step_tokens.append(int(tokens))
        if self._done():
            return True
        if self._on_measured_step is not None and self._on_measured_step(self):
            self.stopped_early = True
            return True
        return False

    @property
    def still_compiling(self) -> bool:
        """More steps after warm-up compiled than ``recompile_limit`` allows: batches of a new shape
        compile at every step, and the trial has no steady state to measure (on any rank of the trial's)."""
        return self._other_rank_compiling or self.recompiled_steps > self.settings.recompile_limit

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
