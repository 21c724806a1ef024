"""scripts/wheelhouse.sh's two steps that read wheels (standard library only: any connected python runs it).

wheelhouse_requirements.py DIR EXCLUDED      autotune's requirements (its wheel in DIR), one a line,
                                             less the projects EXCLUDED names
wheelhouse_requirements.py --prune DIR EXCLUDED   delete the wheels in DIR of the projects EXCLUDED names
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path


def normalized(name: str) -> str:
    """A project name as PEP 503 compares them (wheel file names use ``_`` for ``-``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def excluded_projects(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {normalized(line) for line in lines if line}


def wheel_project(wheel: Path) -> str:
    return normalized(wheel.name.split("-", 1)[0])


def autotune_requirements(directory: Path, excluded: set[str]) -> list[str]:
    """The unconditional ``Requires-Dist`` of autotune's wheel (no extra), less the excluded projects."""
    wheel = next(w for w in directory.glob("*.whl") if wheel_project(w) == "autotune")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    requirements = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    kept = []
    for requirement in requirements:
        if "extra ==" in requirement:
            continue
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        if name and normalized(name.group(0)) not in excluded:
            kept.append(requirement)
    return kept


def main(argv: list[str]) -> None:
    prune = argv[:1] == ["--prune"]
    directory, excluded_file = (Path(a) for a in argv[1 if prune else 0 :])
    excluded = excluded_projects(excluded_file)
    if prune:
        for wheel in directory.glob("*.whl"):
            if wheel_project(wheel) in excluded:
                wheel.unlink()
        return
    print("\n".join(autotune_requirements(directory, excluded)))


if __name__ == "__main__":
    main(sys.argv[1:])
