"""What every trial records beside its figures (autotune/runner/_measured.py); the figures kept when a timeout
ends the fullest batch's step are tested through a real child in tests/runner/test_loader.py."""

from __future__ import annotations

import importlib.metadata
import platform

from autotune.runner._measured import NOT_INSTALLED, RECORDED_DISTRIBUTIONS, installed_version, versions


def test_a_trial_records_each_librarys_installed_version_and_the_device(cpu):
    recorded = versions(cpu)
    assert recorded["torch"] == importlib.metadata.version("torch")
    assert recorded["transformers"] == importlib.metadata.version("transformers")
    assert set(RECORDED_DISTRIBUTIONS) | {"python", "device"} == set(recorded)  # no CUDA or driver on a CPU
    assert recorded["python"] == platform.python_version() and recorded["device"] == cpu.name


def test_a_library_that_is_not_installed_is_said_so_not_guessed():
    assert installed_version("no-such-distribution-autotune") == NOT_INSTALLED
