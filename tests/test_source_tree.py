"""autotune runs from a source tree (``PYTHONPATH=repo python -m autotune``), where pyproject's
``package-dir`` mapping that makes ``autotune.spaces`` does not exist (issue 23, point 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig

import pytest

from tests.support.cli import REPO


def source_tree_run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    """``python -S``: no site processing, so no .pth file and no editable install's finder; the only
    paths are this checkout and this interpreter's site-packages directory."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), sysconfig.get_paths()["purelib"]]),
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-S", *args], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.slow
def test_from_a_source_tree_the_default_space_is_the_repositorys_and_estimate_runs(tmp_path):
    found = source_tree_run(
        tmp_path,
        "-c",
        "import importlib.util, autotune, autotune.space as s; "
        "print(autotune.__file__); print(importlib.util.find_spec('autotune.spaces')); print(s.default_space_path())",
    )
    assert found.returncode == 0, found.stderr
    package, spaces_module, space_path = found.stdout.split("\n")[:3]
    assert package == str(REPO / "autotune" / "__init__.py")
    assert spaces_module == "None"  # what the package-dir mapping gives an installed copy is absent here
    assert space_path == str(REPO / "search_spaces" / "default.yaml")
    estimate = source_tree_run(
        tmp_path, "-m", "autotune", "estimate", "--model", "bert-tiny", "--device", "cpu", "--seq-len", "32", "--json"
    )
    assert estimate.returncode == 0, estimate.stderr
    assert json.loads(estimate.stdout)["model"] == "bert-tiny"
