"""The processes of a multi-rank trial (autotune.runner._launch): a rank or launcher whose
orchestrator is gone kills its own process group, so a SIGKILLed search leaves no rank training.
(The launch itself is exercised end to end in tests/runner/test_ranks.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from autotune.runner._launch import ORCHESTRATOR_PID_ENV


@pytest.mark.slow
def test_a_rank_whose_orchestrator_died_kills_its_group():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that no longer runs: the orchestrator that was SIGKILLed
    rank = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from autotune.runner._launch import die_with_orchestrator; "
            "die_with_orchestrator(); time.sleep(60)",
        ],
        env={**os.environ, ORCHESTRATOR_PID_ENV: str(gone.pid)},
        start_new_session=True,  # as torch's launcher starts a rank: its group is its own
    )
    assert rank.wait(timeout=30) == -signal.SIGKILL
