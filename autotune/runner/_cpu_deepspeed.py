"""DeepSpeed, imported by the forkserver of a CPU search (why: ``runner._baseline.CPU_TRIAL_PROCESS_IMPORTS``)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os

# The accelerator named, not probed: DeepSpeed's probe logs "Setting accelerator to CPU. If you have
# GPU or other accelerator, we were unable to detect it." on every CPU machine, and on a machine with a
# GPU would pick CUDA for a CPU trial (deepspeed/accelerator/real_accelerator.py, get_accelerator: the
# DS_ACCELERATOR variable comes first). Every trial forked from this process inherits it.
os.environ.setdefault("DS_ACCELERATOR", "cpu")

if importlib.util.find_spec("deepspeed") is not None:
    # A DeepSpeed that fails to import is the trial's to report, as before; the forkserver must not die of it
    # (multiprocessing's forkserver passes over an ImportError in a preload, nothing else).
    with contextlib.suppress(Exception):
        importlib.import_module("deepspeed")
