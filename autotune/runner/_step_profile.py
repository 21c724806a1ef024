"""Where a trial's step time goes: torch's profiler over a few steps after warm-up (``TrialJob.profile_steps``).

A figure such as "8.6 samples/s, 1.4 % MFU" says how fast, not why. What the device ran, how much of each
step it was busy, and how much went to loading data and to the optimizer is what tells a host-bound step (the
device idle while Python, kernel launches or the data loader run) from a device-bound one, and which operators
a faster config would have to shrink. torch's own profiler records it (``torch.profiler.profile``: CPU
operators, and on CUDA each kernel through CUPTI); this callback starts it at the first step after warm-up and
stops it after ``profile_steps`` optimizer steps, or at the end of training, whichever comes first.

It is never part of a search's measurement: recording every operator costs the step it records time (on this 2-core
CPU, 2026-11-30: bert-tiny's winner profiled at 164, 181 and 241 ms a step in three verifies, the first's judged re-run
took 171 ms; llama-tiny under SFTTrainer 2,010-2,156 ms against 2,000), so a profiled run is a run of its own
(``autotune verify --profile``), and its throughput is not compared with anything. Only a trial of one process is
profiled: the ranks of a multi-rank trial would each write their own.

What is kept (:class:`autotune.result.StepProfile`): the profiled window's wall time per step, the operators
that took most of it (their self time on the device on CUDA, on the CPU otherwise), the data loader's and the
optimizer's time (torch's ``enumerate(DataLoader)#...`` and ``Optimizer.step#...`` ranges), and on CUDA the share
of the window some kernel ran (the union of the kernels' intervals). Beside the trial's log: torch's table of
every operator (``profile.txt``) and the trace (``trace.json.gz``: open it in https://ui.perfetto.dev).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from autotune.result import ProfiledOp, StepProfile

# The operators kept, most time first: a step of a decoder spends most of its time in a handful
# (its matmuls, attention, the loss, the optimizer's update); the table beside the log has them all.
TOP_OPERATORS = 10
# torch's own ranges around the data loader's ``__next__`` and each optimizer's ``step``
# (torch/utils/data/dataloader.py ``_BaseDataLoaderIter.__next__``, torch/optim/optimizer.py ``profile_hook_step``).
DATA_LOADER_RANGE = "enumerate(DataLoader)#"
OPTIMIZER_RANGE = "Optimizer.step#"
# Ranges named by a ``record_function`` (``Class.method#...``, ``ProfilerStep#N``) are spans, not operators.
_RANGE_MARK = "#"
PROFILE_TABLE = "profile.txt"
PROFILE_TRACE = "trace.json.gz"


class StepProfiler(TrainerCallback):
    """Profiles ``steps`` optimizer steps after the first ``warmup_steps`` (module docstring)."""

    def __init__(
        self, steps: int, warmup_steps: int, device_kind: str, out_dir: str, synchronize: Callable[[], None]
    ) -> None:
        self.steps = steps
        self.warmup_steps = warmup_steps
        self.device_kind = device_kind
        self.out_dir = Path(out_dir)
        self._synchronize = synchronize
        self._profiler: profile | None = None
        self._started_at = 0.0
        self._steps_seen = 0
        self.summary: StepProfile | None = None

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._profiler is None and self.summary is None and state.global_step >= self.warmup_steps:
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device_kind == "cuda" else [])
            self._profiler = profile(activities=activities)
            self._synchronize()  # the window starts with no earlier step's work queued
            self._profiler.start()
            self._started_at = time.perf_counter()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        if self._profiler is not None:
            self._steps_seen += 1
            if self._steps_seen >= self.steps:
                self._finish()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._profiler is not None:  # training ended first (the measurement was steady): what it recorded
            self._finish()

    def _finish(self) -> None:
        profiler, self._profiler = self._profiler, None
        assert profiler is not None
        self._synchronize()  # the window ends once the device has run what its steps queued
        wall_s = time.perf_counter() - self._started_at
        profiler.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        on_device = self.device_kind == "cuda"
        averages = profiler.key_averages()
        sort_by = "self_device_time_total" if on_device else "self_cpu_time_total"
        (self.out_dir / PROFILE_TABLE).write_text(
            averages.table(sort_by=sort_by, row_limit=-1, max_name_column_width=80)
        )
        profiler.export_chrome_trace(str(self.out_dir / PROFILE_TRACE))
        files = (str(self.out_dir / PROFILE_TABLE), str(self.out_dir / PROFILE_TRACE))
        self.summary = summarise(averages, profiler.events(), wall_s, max(self._steps_seen, 1), on_device, files)


def summarise(
    averages: Any, events: Any, wall_s: float, steps: int, on_device: bool, files: tuple[str, str] = ("", "")
) -> StepProfile:
    """The profiled window in the figures :class:`StepProfile` keeps (``averages``: torch's ``key_averages()``;
    ``events``: its ``events()``, whose CUDA kernels give the device's busy time; ``files``: where its table and
    trace were written)."""

    def self_s(row: Any) -> float:
        return (row.self_device_time_total if on_device else row.self_cpu_time_total) / 1e6

    # The host's operators, each with the kernel time it launched (on CUDA): kineto lists each kernel again as a
    # row of its own (device_type CUDA), which would count that time twice (torch/autograd/profiler_util.py,
    # ``_build_table``, sums the device rows alone for its total).
    operators = [
        row
        for row in averages
        if _RANGE_MARK not in row.key and row.device_type == torch.autograd.DeviceType.CPU and self_s(row) > 0
    ]
    operators.sort(key=self_s, reverse=True)
    busy_s = _union_seconds(
        (event.time_range.start, event.time_range.end)
        for event in events
        if on_device and event.device_type == torch.autograd.DeviceType.CUDA
    )
    return StepProfile(
        steps=steps,
        wall_s=wall_s,
        time_of="device" if on_device else "cpu",
        operators_s=sum(self_s(row) for row in operators),
        device_busy_s=busy_s if on_device else None,
        data_loader_s=_range_seconds(averages, DATA_LOADER_RANGE),
        optimizer_s=_range_seconds(averages, OPTIMIZER_RANGE),
        top=tuple(ProfiledOp(row.key, self_s(row), int(row.count)) for row in operators[:TOP_OPERATORS]),
        table=files[0],
        trace=files[1],
    )


def _range_seconds(averages: Any, prefix: str) -> float:
    """The host time spent inside torch's ranges named ``prefix...`` (their total, children included)."""
    return sum(row.cpu_time_total for row in averages if row.key.startswith(prefix)) / 1e6


def _union_seconds(intervals: Any) -> float:
    """The length of the union of ``(start, end)`` intervals in microseconds, in seconds: kernels of
    several streams overlap, and the device is busy while any runs."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total / 1e6
