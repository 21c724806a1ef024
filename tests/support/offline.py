"""A Python environment that holds only what an air-gapped GPU machine has (issue 23): a fresh venv whose
only other packages are the projects scripts/wheelhouse-excluded.txt names as preinstalled, and their
requirements, linked from this interpreter's site-packages (torch included), never copied."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support.cli import REPO

EXCLUDED_FILE = REPO / "scripts" / "wheelhouse-excluded.txt"


def listed_projects(path: Path = EXCLUDED_FILE) -> list[str]:
    """The project names of scripts/wheelhouse-excluded.txt, as written."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def requirement_closure(names: list[str]) -> dict[str, metadata.Distribution]:
    """The installed distributions of ``names`` and, recursively, of their unconditional requirements."""
    found: dict[str, metadata.Distribution] = {}
    pending = [canonicalize_name(name) for name in names]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (the GPU machine's scipy, say): the search must not need it
        found[name] = dist
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(canonicalize_name(requirement.name))
    return found


def linked_site(names: list[str], dest: Path) -> Path:
    """A directory of links to exactly the files of :func:`requirement_closure` (packages, modules, dist-info)."""
    dest.mkdir(parents=True)
    site = Path(sysconfig.get_paths()["purelib"])
    for dist in requirement_closure(names).values():
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if (site / top).exists() and not (dest / top).exists():
                (dest / top).symlink_to(site / top)
    return dest


def preinstalled_python(root: Path, preinstalled: list[str]) -> Path:
    """A fresh venv under ``root`` that sees ``preinstalled`` (and their requirements) and nothing else
    of this interpreter; returns its python."""
    venv = root / "venv"
    # Without ensurepip (5 s of CPU, and its old setuptools would shadow the one torch requires): the machine's
    # own pip is linked in with its other packages, as an interpreter with torch installed has one.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(purelib) / "preinstalled.pth").write_text(f"{linked_site([*preinstalled, 'pip'], root / 'preinstalled')}\n")
    return python
