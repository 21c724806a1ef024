"""How a trial is measured: when the steady-state measurement stops, and its statistics.

What is timed is a whole optimizer step: every gradient-accumulation micro-batch, the data loading
between steps, the optimizer update. Clocks are read after the device is synchronised, so queued
GPU work lands in the step that queued it. Warm-up steps (allocator growth, autotuning, the first
compilation) and any later step during which ``torch.compile`` compiled are excluded from the
statistics and recorded separately.
"""

from __future__ import annotations

import dataclasses
import statistics


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
        recompile_limit: Steps after warm-up that may compile before the trial is stopped (below).
        prune_after_steps: Measured steps after which early stop judges a trial by the median of
            what was measured so far against the pruning threshold alone. Before that, from the
            first measured step on, only a trial below the threshold by more than the step-time
            noise is stopped (:func:`clearly_slower`).
    """

    # 1: the first step allocates (optimizer states, the allocator's pools, lazy initialisation); from
    # the second on a step is close to steady (bert-tiny on this CPU, four configs, each step over the
    # median of steps 4 on: step 1 1.10-1.60, step 2 0.86-1.29, step 3 0.84-1.09; again with
    # --warmup-steps 0, three configs: step 1 1.10-2.44, step 2 1.07-1.09, and the figure with step 2
    # in the window 1.000-1.005 times the figure without; issue 29). One step
    # of 1.29 cannot move the figure, the median of the window, by more than half the gap between two
    # neighbouring steps; nor can it stop a config that could win: the early stop after one measured
    # step needs it below ``prune ratio x best`` by three step-time CVs, so a config as fast as the best
    # is stopped only if that step is more than 2.3 times its steady time (0.5 ratio, 5 % CV). Compiling
    # steps are excluded whatever this says. Each warm-up step beyond the first cost up to 10 s of a
    # 1024-sample step here, and 13 % of the README's CPU search at 2 (docs/benchmarks.md, issue 29).
    warmup_steps: int = 1
    min_steps: int = 8
    max_steps: int = 40
    # 10 s, not more: a window of steps is as noisy as the machine from one window to the next, and
    # on a shared CPU a fixed matmul loop moves by 8-10 % from one 10 s window to the next
    # (docs/benchmarks.md, "Repeatability"), while 8 steps at a 10 % step CV already put the median
    # within about 3.5 %. A longer window buys precision the next run does not reproduce; the
    # leaders' re-runs (confirmation) answer that noise. At 30 s, a trial whose steps missed the CV
    # target (most of them on this 2-core CPU) cost three times as much for nothing (issue 29).
    max_seconds: float = 10.0
    cv_target: float = 0.05
    prune_after_steps: int = 3
    # Steps after warm-up that may compile (each left out of the statistics) before the trial is
    # stopped as still compiling (``Status.RECOMPILING``). A compiled trial whose batches vary in length
    # compiles with dynamic shapes from its first step (autotune.levers.compile_environment: the
    # Trainer's dynamic=None would compile the first length as a constant and again at the second,
    # torch._dynamo.config.automatic_dynamic_shapes), so it compiles once, in warm-up. A step that still
    # compiles after that met what the dynamic graph cannot take (a guard that fails, a specialised
    # size); one that compiles at every step has no steady state (issue 38, 10: a CPU SFT trial with
    # inductor and packing ran 317 s at 0.009 steps/s), and past torch's recompile_limit (8) dynamo runs
    # that code eager, another figure than the compiled one the trial is named for. 2: room for a rare
    # guard failure, not for a compile per step.
    recompile_limit: int = 2

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


def over_the_run(rate: float, setup_s_per_sample: float, passes: float) -> float:
    """A steady rate (samples or tokens a second) over the user's whole run, where the trainer also runs one
    pass over the data before its first step (DPO's ``precompute_ref_log_probs``: the reference's forward
    over every pair, once), ``setup_s_per_sample`` seconds a sample: each sample trained ``passes`` times
    costs ``1 / rate`` a time plus its share of that pass, ``setup_s_per_sample / passes``.

    The one rule of it: a trial's measured rates (``autotune.runner``) and the throughput prior's predicted
    ones (``autotune.estimate``) count the pass so, and the projected run time adds it once."""
    if setup_s_per_sample <= 0 or rate <= 0:
        return rate
    return 1.0 / (1.0 / rate + setup_s_per_sample / max(passes, 1e-9))


def coefficient_of_variation(values: list[float]) -> float:
    """Sample standard deviation over the mean; 0 for fewer than two values."""
    if len(values) < 2:
        return 0.0
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else 0.0


# The step-time noise assumed where the best trial measured none of its own (a CV of 0 from fewer
# than two steps) or less: a steady CPU step moves by 3.5-5 % (docs/benchmarks.md, "Repeatability").
PRUNE_NOISE_FLOOR = 0.05
# Standard deviations of one step time that an early judgement allows for: a trial is stopped before
# ``prune_after_steps`` only if it stays below the threshold with its steps that much faster.
PRUNE_NOISE_SIGMAS = 3.0


def clearly_slower(
    step_times_s: list[float], samples_per_step: float, threshold: float, noise: float, settings: MeasureSettings
) -> bool:
    """Whether a trial's measured steps so far put it clearly below ``threshold`` samples/s.

    The projection is ``samples_per_step`` over the median of the measured steps (warm-up and
    compiling steps are never among them). From ``prune_after_steps`` (at most ``min_steps``)
    measured steps on, it is judged against the threshold as it is. Before that, from the first
    measured step, only where it is below the threshold even with every step
    :data:`PRUNE_NOISE_SIGMAS` step-time CVs faster: ``projection x (1 + 3 x noise) < threshold``,
    the noise being the best trial's step-time CV, at least :data:`PRUNE_NOISE_FLOOR`. A trial
    at a tenth of the best's speed then costs one measured step, not three, and one slow step of a
    trial that could still win (within the noise of the threshold) stops nothing.

    Args:
        step_times_s: The measured steps' times so far.
        samples_per_step: Samples each step trained (the global batch, less the steps the fp16 grad
            scaler skipped).
        threshold: ``prune ratio x`` the best feasible samples/s so far.
        noise: The best trial's step-time CV.
        settings: The trial's measurement settings.
    """
    if not step_times_s:
        return False
    projected = samples_per_step / statistics.median(step_times_s)
    if len(step_times_s) >= min(settings.prune_after_steps, settings.min_steps):
        return projected < threshold
    return projected * (1 + PRUNE_NOISE_SIGMAS * max(noise, PRUNE_NOISE_FLOOR)) < threshold
