"""The tested set (issue 37): requirements/lock-cpu-py311.txt pins every project the suite and the demo run
with, hashes included; pyproject.toml's ranges hold those pins and stop before majors never tested; the
environment running this suite is that set; every install path reads the lock."""

from __future__ import annotations

import hashlib
import re

import tomllib
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.cli import REPO
from tests.support.scripts import script

lock = script("lock")
LOCK_PATH = "requirements/lock-cpu-py311.txt"
# What the lock was resolved for (scripts/lock.sh: --python-version 3.11 --python-platform x86_64-manylinux_2_28).
LOCK_TARGET = {
    **default_environment(),
    "python_version": "3.11",
    "platform_machine": "x86_64",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
# The one extra the lock leaves out: liger-kernel's Triton comes with a CUDA torch (scripts/lock.sh).
UNLOCKED_EXTRAS = {"liger"}


def pyproject_requirements() -> dict[str, list[Requirement]]:
    """pyproject.toml's requirements by extra, the unconditional ones under ``""``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {extra: [Requirement(text) for text in texts] for extra, texts in groups.items()}


def test_the_lock_pins_each_project_once_with_the_hashes_of_its_files():
    text = (REPO / LOCK_PATH).read_text()
    entries = [line for line in text.splitlines() if line and not line.startswith((" ", "#"))]
    pins = lock.read_pins(REPO / LOCK_PATH)
    assert len(entries) == len(pins) > 50, "every entry is one `name==version` (scripts/lock.sh writes them)"
    assert {name for name, pin in pins.items() if not pin.hashes} == set()
    # torch is installed beside it (requirements/torch.txt), and its CPU build was resolved (no CUDA wheels).
    assert "torch" not in pins
    assert not [name for name in pins if name == "triton" or re.match(r"nvidia-(cu|nccl)", name)]


def test_the_lock_holds_every_requirement_of_pyproject_within_its_range():
    """The unconditional requirements and every extra but liger's, in the lock's target environment."""
    pinned = lock.expected_versions()
    outside: list[str] = []
    for extra, requirements in pyproject_requirements().items():
        if extra in UNLOCKED_EXTRAS:
            continue
        for requirement in requirements:
            if requirement.marker is not None and not requirement.marker.evaluate({**LOCK_TARGET, "extra": extra}):
                continue
            version = pinned.get(canonicalize_name(requirement.name))
            if version is None or not requirement.specifier.contains(version, prereleases=True):
                outside.append(f"[{extra}] {requirement}: the lock has {version}")
    assert outside == [], "run bash scripts/lock.sh (and the suite on what it writes)"


def test_every_range_stops_before_a_major_the_suite_never_ran():
    """Each requirement has an upper bound; where the tested set pins the project, its release lies inside
    and the next major outside (0.x: 1.0)."""
    pinned = lock.expected_versions()
    wrong: list[str] = []
    for requirement in (r for requirements in pyproject_requirements().values() for r in requirements):
        specifier: SpecifierSet = requirement.specifier
        if not any(spec.operator in ("<", "<=", "==", "~=") for spec in specifier):
            wrong.append(f"{requirement}: no upper bound")
        version = pinned.get(canonicalize_name(requirement.name))
        if version is not None and Version(f"{Version(version).major + 1}") in specifier:
            wrong.append(f"{requirement}: admits {Version(version).major + 1}.0, the suite ran {version}")
    assert wrong == []


def test_this_environment_is_the_tested_set():
    """The interpreter running the suite has exactly the lock's projects at the lock's versions, torch at
    requirements/torch.txt's, and beside them only autotune, pip and uv (scripts/test.sh installs so).
    scripts/latest.sh deselects this test: its venv holds the newest releases on purpose."""
    differences = lock.differences(lock.expected_versions(), lock.installed_versions())
    assert differences == [], (
        "(project, locked, installed): this environment is not the tested set; bash scripts/test.sh installs it"
    )


def test_every_install_path_reads_the_lock():
    scripts = REPO / "scripts"
    test_sh = (scripts / "test.sh").read_text()
    assert f"--require-hashes {LOCK_PATH}" in test_sh and "--no-deps -e ." in test_sh
    for path in (scripts / "demo.sh", REPO / "docker" / "Dockerfile"):
        assert f"--constraint {LOCK_PATH}" in path.read_text(), path
    wheelhouse = (scripts / "wheelhouse.sh").read_text()
    assert f'LOCK="$REPO/{LOCK_PATH}"' in wheelhouse
    assert '--constraints "$LOCK"' in wheelhouse and 'lock.py" verify "$LOCK" "$OUT"' in wheelhouse
    assert f"!{LOCK_PATH}" in (REPO / "docker" / "Dockerfile.dockerignore").read_text()


def test_verify_names_each_file_that_is_not_the_locked_release(tmp_path):
    """scripts/wheelhouse.sh's check: the locked version and one of the locked files, byte for byte."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    good = wheels / "optuna-5.0.0-py3-none-any.whl"
    good.write_bytes(b"the locked file")
    (wheels / "plotly-7.0.0-py3-none-any.whl").write_bytes(b"another release")
    (wheels / "pyyaml-6.0.4.tar.gz").write_bytes(b"tampered")
    (wheels / "liger_kernel-0.8.5-py3-none-any.whl").write_bytes(b"not in the lock")
    (wheels / "autotune-0.1.0-py3-none-any.whl").write_bytes(b"ours")
    digest = hashlib.sha256(good.read_bytes()).hexdigest()
    locked = tmp_path / "lock.txt"
    locked.write_text(
        f"optuna==5.0.0 \\\n    --hash=sha256:{digest}\n    # via autotune\n"
        f"plotly==7.1.0 \\\n    --hash=sha256:{'1' * 64}\n"
        f"pyyaml==6.0.4 \\\n    --hash=sha256:{'2' * 64} \\\n    --hash=sha256:{'3' * 64}\n"
    )
    problems, unlocked = lock.verify(wheels, lock.read_pins(locked))
    assert problems == [
        "plotly-7.0.0-py3-none-any.whl: version 7.0.0, the lock pins 7.1.0",
        "pyyaml-6.0.4.tar.gz: its sha256 is not one of the lock's 2 for pyyaml",
    ]
    assert unlocked == ["liger-kernel==0.8.5"]
