"""An air-gapped GPU machine (issue 23): autotune installs from a wheelhouse with the index disabled, next to
the interpreter's own torch, and `search` runs from it without the optional parts (dashboard, plotly,
bitsandbytes, liger, deepspeed, peft)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.views.dashboard import DASHBOARD_MISSING
from tests.support.cli import FAST_SEARCH_ARGS, REPO
from tests.support.offline import listed_projects, preinstalled_python

pytestmark = pytest.mark.slow

MiB = 1024**2
# What the device tool carries to a GPU machine, the repository included (issue 23).
CARRY_LIMIT_BYTES = 64 * MiB
# The one project scripts/wheelhouse-excluded.txt leaves out because the search does not need it.
NOT_NEEDED = "plotly"
OPTIONAL_MODULES = ("optuna_dashboard", "plotly", "bitsandbytes", "liger_kernel", "deepspeed", "peft")


def one_trial_search(python: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            python,
            "-m",
            "autotune",
            "search",
            "--device",
            "cpu",
            "--model",
            "bert-tiny",
            "--trials",
            "1",
            *FAST_SEARCH_ARGS,
            "--storage",
            f"sqlite:///{cwd / 'study.db'}",
            "--work-dir",
            str(cwd / "runs"),
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "COLUMNS": "200", "HF_HUB_OFFLINE": "1"},
    )


def tracked_repository_bytes() -> int:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / f.decode()).stat().st_size for f in files if f and (REPO / f.decode()).is_file())


def test_the_wheelhouse_installs_with_the_index_disabled_and_a_search_runs_from_it(tmp_path):
    wheels = tmp_path / "wheelhouse"
    # The connected machine's step (PyPI), for this interpreter's Python and platform.
    build = subprocess.run(
        ["bash", str(REPO / "scripts" / "wheelhouse.sh"), "--out", str(wheels)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": sys.executable},
    )
    assert build.returncode == 0, build.stderr[-3000:]
    names = sorted(w.name.split("-", 1)[0].lower() for w in wheels.glob("*.whl"))
    assert "autotune" in names and "optuna" in names and "optuna_dashboard" in names
    assert not {"torch", "transformers", "numpy", "plotly"} & set(names), names
    wheelhouse_bytes = sum(w.stat().st_size for w in wheels.iterdir())
    assert wheelhouse_bytes + tracked_repository_bytes() <= CARRY_LIMIT_BYTES

    # The air-gapped machine: an interpreter with torch and its stack only, no index, no pip configuration.
    preinstalled = [name for name in listed_projects() if name != NOT_NEEDED]
    python = str(preinstalled_python(tmp_path / "machine", preinstalled))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "PYTHONPATH"}
    env["PIP_CONFIG_FILE"] = os.devnull
    # The GPU acceptance's own install step: `python -m pip install --no-index --find-links WHEELHOUSE autotune`.
    install = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_acceptance.sh"), "install", str(tmp_path / "acceptance")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**env, "PYTHON": python, "WHEELHOUSE": str(wheels)},
    )
    assert install.returncode == 0, install.stdout[-2000:] + install.stderr[-2000:]
    where = subprocess.run(
        [
            python,
            "-c",
            "import autotune, torch; print(autotune.__file__); print(torch.__file__)\n"
            "import importlib.util; print(importlib.util.find_spec('plotly'))",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.split()
    assert where[0].startswith(str(tmp_path / "machine" / "venv"))  # the wheel's autotune, not this checkout
    assert where[1].startswith(str(tmp_path / "machine" / "preinstalled"))  # the interpreter's own torch
    assert where[2] == "None"

    # The search runs without the optional parts too (none of them on this machine: the dashboard, plotly,
    # bitsandbytes, liger, deepspeed and peft made absent from every process it starts, tests/support/absent),
    # and says how to get the dashboard in one line. One search for both: each is a torch import in two processes.
    absent = {
        **env,
        "PYTHONPATH": str(REPO / "tests" / "support" / "absent"),
        "AUTOTUNE_TEST_ABSENT": ",".join(OPTIONAL_MODULES),
    }
    missing = subprocess.run(
        [
            python,
            "-c",
            "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])",
            *OPTIONAL_MODULES,
        ],
        capture_output=True,
        text=True,
        env=absent,
        check=True,
    )
    assert missing.stdout.strip() == "[]"
    searched = one_trial_search(python, tmp_path, absent)
    assert searched.returncode == 0, searched.stderr[-3000:]
    assert "winner: #0" in searched.stdout
    assert DASHBOARD_MISSING in searched.stderr.splitlines()
    report = subprocess.run(
        [python, "-m", "autotune", "report", "--storage", f"sqlite:///{tmp_path / 'study.db'}", "--out", "r.html"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=absent,
    )
    assert report.returncode == 2
    assert (
        report.stderr.strip()
        == "autotune: error: autotune report needs plotly: pip install 'autotune[report]' (or pip install plotly)"
    )
