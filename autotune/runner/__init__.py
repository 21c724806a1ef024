"""Everything a trial child executes, and the parent's side of starting one.

The parent hands :func:`run_isolated` a :class:`TrialJob`; a fresh child process, started from a
forkserver with torch and transformers preloaded, trains it through the real Trainer, measures it
with the probe of its device (``_memory_probe``, ``_nvml``), under the limits of ``_limits``, and sends
back one :class:`autotune.result.TrialResult`. Nothing in this package reads or writes a study.

Importing this face does not import torch or transformers (only the child's modules do: ``_trial``,
``_loader``, ``_loss_recorder``, ``_step_timer``), so the parent stays light until a trial starts.
"""

from __future__ import annotations

from autotune.runner._baseline import cpu_process_baseline_bytes
from autotune.runner._calibrate import (
    calibrate_bandwidth,
    calibrate_device,
    calibrate_op_rates,
    measure_matmul_peak,
    measure_memory_bandwidth,
)
from autotune.runner._callbacks import load_callback
from autotune.runner._job import TrialJob, Workload, trial_memory_prior
from autotune.runner._limits import allocator_settings, child_address_space_budget, child_environment
from autotune.runner._pool import run_isolated
from autotune.runner._quiet import library_output_to_debug_log
from autotune.runner._side_effects import trial_overrides_note

__all__ = [
    "TrialJob",
    "Workload",
    "allocator_settings",
    "calibrate_bandwidth",
    "calibrate_op_rates",
    "calibrate_device",
    "child_address_space_budget",
    "child_environment",
    "cpu_process_baseline_bytes",
    "library_output_to_debug_log",
    "load_callback",
    "measure_matmul_peak",
    "measure_memory_bandwidth",
    "run_isolated",
    "trial_memory_prior",
    "trial_overrides_note",
]
