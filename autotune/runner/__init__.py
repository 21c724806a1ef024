"""Everything a trial child executes, and the parent's side of starting one.

The parent hands :func:`run_isolated` a :class:`TrialJob`; a fresh child process, started from a
forkserver with torch and transformers preloaded, trains it through the real Trainer, measures it
with the probe of its device (``_memory``, ``_nvml``), under the limits of ``_limits``, and sends
back one :class:`autotune.result.TrialResult`. Nothing in this package reads or writes a study.
"""

from __future__ import annotations

from autotune.runner._callbacks import load_callback
from autotune.runner._data import load_training_dataset, training_collator
from autotune.runner._failures import classify_exit, is_oom_exception
from autotune.runner._job import TrialJob, Workload
from autotune.runner._limits import (
    child_address_space_budget,
    child_environment,
    limit_address_space,
)
from autotune.runner._memory import (
    CpuMemoryProbe,
    CudaReadings,
    cuda_peaks,
    memory_probe,
    unmapped_import_file_bytes,
)
from autotune.runner._pool import run_isolated

__all__ = [
    "CpuMemoryProbe",
    "CudaReadings",
    "TrialJob",
    "Workload",
    "child_address_space_budget",
    "child_environment",
    "classify_exit",
    "cuda_peaks",
    "is_oom_exception",
    "limit_address_space",
    "load_callback",
    "load_training_dataset",
    "memory_probe",
    "run_isolated",
    "training_collator",
    "unmapped_import_file_bytes",
]
