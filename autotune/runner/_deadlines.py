"""A trial's budgets and the parent's last word on it, for one process (``_pool``) and for several
ranks (``_ranks``) alike: when the child is killed (:class:`TrialDeadlines`), and what the parent adds
to any result (:func:`finished`: what it watched from outside, the wall time, the log's tail, the ceiling).
"""

from __future__ import annotations

import dataclasses

from autotune.result import FAILED_STATUSES, Status, TrialResult
from autotune.runner._job import TrialJob
from autotune.runner._watch import ChildWatch
from autotune.spec.ceiling import fits

# How often the parent polls a running trial (its result pipe, its budgets, the heartbeat).
POLL_S = 0.2
# A trial the timeout kills within this many of its longest steps after its last one was still stepping: after
# its last timed step it runs at most one more and the fullest batch's (autotune.runner._trial): a config too
# slow for the budget, which the same budget ends again, not a hang, which a second try may not meet.
STALL_STEPS = 3.0


class TrialDeadlines:
    """When a trial child is killed: the compile budget, then the trial timeout.

    With ``compile_timeout_s`` (torch.compile on and ``--compile-timeout`` given), the child has that
    long to end its first optimizer step, where dynamo and inductor compile (inductor's max-autotune
    on a large model: many minutes), and ``timeout_s`` from then on; otherwise ``timeout_s`` from its
    start. ``expired`` names the budget that ran out.
    """

    def __init__(self, started: float, timeout_s: float, compile_timeout_s: float | None) -> None:
        self.started = started
        self.timeout_s = timeout_s
        self.compile_timeout_s = compile_timeout_s
        self.first_step_at: float | None = None  # when the child said its first step ended
        self.compile_s = 0.0  # dynamo's compile seconds by then, as the child read them
        self.expired: Status | None = None  # TIMEOUT or COMPILE_TIMEOUT
        self.expired_after_s = 0.0
        self.step_ends: list[float] = []  # when each optimizer step ended, as the parent heard it
        # What the timed steps measured, sent before the step on the fullest batch (runner._trial: on_measured).
        self.steps_measured: TrialResult | None = None

    def first_step_ended(self, now: float, compile_s: float) -> None:
        self.first_step_at, self.compile_s = now, compile_s

    def step_ended(self, now: float, compile_s: float) -> None:
        """An optimizer step ended at ``now`` (the first also ends the compile budget)."""
        if self.first_step_at is None:
            self.first_step_ended(now, compile_s)
        self.step_ends.append(now)

    def longest_step_s(self) -> float:
        """The longest time between step ends heard, the first counted from the trial's start (0: none)."""
        ends = [self.started, *self.step_ends]
        return max((b - a for a, b in zip(ends, ends[1:])), default=0.0)

    def since_last_step_s(self) -> float:
        """From the last step end heard to the moment the budget ran out."""
        return self.started + self.expired_after_s - self.step_ends[-1]

    def still_stepping(self) -> bool:
        """Whether, when its budget ran out, the trial's steps still came at their own pace (the last within
        ``STALL_STEPS`` of its longest): too slow for the budget, not hung (not tried again)."""
        return bool(self.step_ends) and self.since_last_step_s() <= STALL_STEPS * self.longest_step_s()

    def _timeout_clock_start(self) -> float:
        """Under a compile timeout the trial's timeout counts from its first step; else from its start."""
        if self.compile_timeout_s is not None and self.first_step_at is not None:
            return self.first_step_at
        return self.started

    def check(self, now: float) -> bool:
        """Whether a budget ran out at ``now`` (then ``expired`` says which)."""
        if self.compile_timeout_s is not None and self.first_step_at is None:
            if now - self.started > self.compile_timeout_s:
                self.expired = Status.COMPILE_TIMEOUT
        elif now - self._timeout_clock_start() > self.timeout_s:
            self.expired = Status.TIMEOUT
        if self.expired is not None:
            self.expired_after_s = now - self.started
        return self.expired is not None

    def result(self, compile_mode: str) -> TrialResult:
        """The killed trial's record: which budget, and what the trial cost until then."""
        if self.expired == Status.COMPILE_TIMEOUT:
            return TrialResult(
                status=Status.COMPILE_TIMEOUT,
                error=f"torch.compile ({compile_mode}) still compiling after the {self.compile_timeout_s:g} s compile "
                f"timeout (--compile-timeout): killed after {self.expired_after_s:.0f} s",
                compile_s=self.expired_after_s,
            )
        after_compile = ""
        if self.first_step_at is not None and self.compile_timeout_s is not None:
            after_compile = f" after its first step (compiled in {self.compile_s:.0f} s)"
        still_stepping = self.still_stepping()
        reason = f"no result within the {self.timeout_s:g} s timeout{after_compile}; killed"
        if still_stepping:
            reason += (
                f" while its steps still came ({len(self.step_ends)} ended, the longest {self.longest_step_s():.0f} s, "
                f"the last {self.since_last_step_s():.0f} s before): too slow for the timeout, not hung, so not tried "
                "again; --trial-timeout gives a trial longer"
            )
        if self.steps_measured is not None:
            # Killed in the step on the fullest batch, after its timed steps: what they measured is kept, and
            # the trial is no less a timeout (whether its fullest batch fits is not known: it is not ranked).
            steps = self.steps_measured
            return dataclasses.replace(
                steps,
                status=Status.TIMEOUT,
                error=f"{reason}. It was killed in the step on its fullest batch, after {steps.measured_steps} timed "
                f"steps at {steps.samples_per_s:.3g} samples/s (kept; whether that batch fits is not known)",
                still_stepping=still_stepping,
            )
        return TrialResult(status=Status.TIMEOUT, error=reason, compile_s=self.compile_s, still_stepping=still_stepping)


def finished(
    result: TrialResult, job: TrialJob, wall_s: float, watch: ChildWatch, measured_itself: bool, log_path: str
) -> TrialResult:
    """The parent's last word on a trial, one process or several ranks: what it watched from outside
    where the trial measured nothing, the wall time, the log's tail of a failure, the ceiling."""
    if not measured_itself and watch.peak_rss_tree_bytes:
        # The child measured nothing itself: keep what the orchestrator saw from outside.
        result.memory_peaks["orchestrator_sampled_rss_tree_bytes"] = watch.peak_rss_tree_bytes
    result.wall_s = wall_s
    result.ceiling_bytes = job.workload.ceiling_bytes
    if result.status == Status.OOM or result.status in FAILED_STATUSES:
        result.stderr_tail = tail(log_path)
    if result.status == Status.OK and not fits(result.peak_memory_bytes, result.ceiling_bytes):
        result.status = Status.OVER_CEILING
    return result


def tail(path: str, lines: int = 40, line_chars: int = 300) -> str:
    """The last lines of the child's log, each cut to ``line_chars`` (one huge line, such as the
    list of extension modules after a segfault, must not push the stack out of the tail)."""
    try:
        with open(path, errors="replace") as f:
            last = f.readlines()[-lines:]
    except OSError:
        return ""
    return "".join(line if len(line) <= line_chars else line[:line_chars] + " [...]\n" for line in last)
