"""scripts/wheelhouse.sh's steps that read wheels (standard library only: any connected python runs it).

wheelhouse_requirements.py DIR EXCLUDED            autotune's requirements (its wheel in DIR), one a line,
                                                   less the projects EXCLUDED names
wheelhouse_requirements.py --extras DIR            the requirements of autotune's WHEELHOUSE_EXTRAS (trl,
                                                   liger-kernel), downloaded without their dependencies
wheelhouse_requirements.py --extras-needs DIR EXCLUDED   what those extras' wheels in DIR require, less
                                                   the projects EXCLUDED names (downloaded with theirs)
wheelhouse_requirements.py --prune DIR EXCLUDED    delete the wheels in DIR of the projects EXCLUDED names
wheelhouse_requirements.py --constraints LOCK EXCLUDED   the lock's pins as ``name==version``, one a line, less
                                                   the projects EXCLUDED names (the target's own, at its versions)

The lock's pins constrain versions only: pip's hash-checking mode refuses the open ranges of a wheel's own
requirements ("all requirements must have their versions pinned with ==", pip 23.2 here), so the hashes are
checked after the download (scripts/lock.py verify).

The extras go in without their dependencies first because each names the target's own stack (TRL:
transformers, accelerate; liger-kernel: torch, triton): resolved whole, pip would download a CUDA torch
and its gigabytes of NVIDIA libraries into the wheelhouse, which the prune step would then have to chase.
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

from lock import distribution_file, normalized, read_pins  # scripts/lock.py, beside this file

# The extras the wheelhouse carries besides autotune's own requirements: scripts/gpu_acceptance.sh llm
# trains through TRL's SFTTrainer (sft) and searches the liger lever (liger).
WHEELHOUSE_EXTRAS = ("sft", "liger")


def excluded_projects(path: Path) -> set[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {normalized(line) for line in lines if line}


def wheel_project(wheel: Path) -> str:
    found = distribution_file(wheel)
    return found[0] if found else ""


def requires_dist(wheel: Path) -> list[str]:
    """A wheel's ``Requires-Dist`` lines, as written."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(metadata).decode().splitlines()
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]


def project_of(requirement: str) -> str:
    found = re.match(r"[A-Za-z0-9._-]+", requirement)
    return normalized(found.group(0)) if found else ""


def unconditional(requirements: list[str], excluded: set[str]) -> list[str]:
    """The requirements of no extra (an environment marker is kept, for pip to judge), less the excluded projects."""
    return [r for r in requirements if "extra ==" not in r and project_of(r) not in excluded]


def autotune_wheel(directory: Path) -> Path:
    return next(w for w in directory.glob("*.whl") if wheel_project(w) == "autotune")


def autotune_requirements(directory: Path, excluded: set[str]) -> list[str]:
    """The unconditional ``Requires-Dist`` of autotune's wheel (no extra), less the excluded projects."""
    return unconditional(requires_dist(autotune_wheel(directory)), excluded)


def extra_requirements(directory: Path, extras: tuple[str, ...] = WHEELHOUSE_EXTRAS) -> list[str]:
    """The requirements of ``extras`` in autotune's wheel, their ``; extra == "name"`` marker dropped."""
    kept = []
    for line in requires_dist(autotune_wheel(directory)):
        requirement, _, marker = (part.strip() for part in line.partition(";"))
        extra = re.fullmatch(r"""extra\s*==\s*["']([^"']+)["']""", marker)
        if extra and extra.group(1) in extras:
            kept.append(requirement)
    return kept


def extras_needs(directory: Path, excluded: set[str], extras: tuple[str, ...] = WHEELHOUSE_EXTRAS) -> list[str]:
    """What the extras' own wheels in ``directory`` require unconditionally, less the excluded projects."""
    projects = {project_of(r) for r in extra_requirements(directory, extras)}
    needs: list[str] = []
    for wheel in sorted(directory.glob("*.whl")):
        if wheel_project(wheel) in projects:
            needs += [r for r in unconditional(requires_dist(wheel), excluded) if r not in needs]
    return needs


def locked_constraints(lock: Path, excluded: set[str]) -> list[str]:
    """The lock's pins as ``name==version``, less the excluded projects (the target's own, at its versions)."""
    return [f"{name}=={pin.version}" for name, pin in read_pins(lock).items() if name not in excluded]


def main(argv: list[str]) -> None:
    if argv[:1] == ["--extras"]:
        print("\n".join(extra_requirements(Path(argv[1]))))
        return
    if argv[:1] == ["--constraints"]:
        print("\n".join(locked_constraints(Path(argv[1]), excluded_projects(Path(argv[2])))))
        return
    mode = argv[0] if argv[:1] in (["--prune"], ["--extras-needs"]) else ""
    directory, excluded_file = (Path(a) for a in argv[1 if mode else 0 :])
    excluded = excluded_projects(excluded_file)
    if mode == "--prune":
        for wheel in directory.glob("*.whl"):
            if wheel_project(wheel) in excluded:
                wheel.unlink()
        return
    found = (
        extras_needs(directory, excluded) if mode == "--extras-needs" else autotune_requirements(directory, excluded)
    )
    print("\n".join(found))


if __name__ == "__main__":
    main(sys.argv[1:])
