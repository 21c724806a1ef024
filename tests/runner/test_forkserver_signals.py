"""The forkserver's first import: it ignores Ctrl-C from the moment it starts, and it is light."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.cli import REPO

PROBE = """
import os, signal, sys, time
import autotune.runner._forkserver_signals
os.kill(os.getpid(), signal.SIGINT)
time.sleep(0.2)
print("alive", "torch" in sys.modules, "transformers" in sys.modules)
"""


@pytest.mark.slow
def test_a_process_that_imported_it_survives_ctrl_c_without_importing_torch():
    """Ctrl-C in the seconds the forkserver imports torch printed a 40-60 line traceback before
    autotune's own line; the module ignores SIGINT first. Importing it (and so the runner's face) must
    not import torch: that would put those seconds back before the signal is ignored."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["alive", "False", "False"]
