"""DeepSpeed in the CPU forkserver's preloads (runner/_cpu_deepspeed.py): imported quietly, never fatal."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

IMPORT_AND_REPORT = (
    "import os, sys\n"
    "import autotune.runner._cpu_deepspeed\n"
    "print('deepspeed' in sys.modules, os.environ['DS_ACCELERATOR'])\n"
)


def _run(env: dict[str, str]) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    return subprocess.run(
        [sys.executable, "-c", IMPORT_AND_REPORT],
        capture_output=True,
        text=True,
        env={**environment, **env},
        timeout=300,
    )


@pytest.mark.slow
def test_deepspeed_is_imported_for_the_cpu_without_probing_for_an_accelerator():
    pytest.importorskip("deepspeed")
    done = _run({})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["True", "cpu"]
    # DeepSpeed's probe, which the named accelerator skips, warns on every CPU machine.
    assert "unable to detect" not in done.stderr


@pytest.mark.slow
def test_a_deepspeed_that_fails_to_import_leaves_the_forkserver_standing(tmp_path):
    """multiprocessing's forkserver passes over an ImportError in a preload and dies of anything else."""
    broken = tmp_path / "deepspeed"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('an op built for another torch')\n")
    done = _run({"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "cpu"]
