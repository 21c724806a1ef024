"""Isolated trial execution: one fresh child process per trial, started from a forkserver."""

from __future__ import annotations

from autotune.runner._callbacks import load_callback
from autotune.runner._failures import classify_exit, is_oom_exception
from autotune.runner._job import TrialJob
from autotune.runner._pool import run_isolated

__all__ = ["TrialJob", "run_isolated", "is_oom_exception", "classify_exit", "load_callback"]
