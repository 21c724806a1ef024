"""What the lock pins (requirements/lock-cpu-py311.txt, written by scripts/lock.sh), read with the standard
library only: scripts/wheelhouse.sh runs this with whichever python the connected machine has.

lock.py verify LOCK DIR    every wheel and sdist in DIR of a locked project is the locked version and one of
                           its locked files (sha256); exit 1 naming each that is not; the projects the lock does
                           not hold are named on stderr
lock.py drift LOCK         this interpreter's projects against the lock (and requirements/torch.txt), as the
                           Markdown that docs/drift.md records (scripts/latest.sh)
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LOCK = REPO / "requirements" / "lock-cpu-py311.txt"
TORCH = REPO / "requirements" / "torch.txt"
# In a scripts/test.sh venv beside the lock and torch, each put there by its own step: the checkout itself
# (editable, --no-deps), and the two installers (`python3 -m venv` seeds pip; `uv pip sync` keeps pip and uv).
BESIDE_THE_LOCK = ("autotune", "pip", "uv")

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")
HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: frozenset[str]


def normalized(name: str) -> str:
    """A project name as PEP 503 compares them (wheel file names use ``_`` for ``-``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, Pin]:
    """Each ``name==version`` of a requirements file, with the ``--hash`` lines that follow it."""
    pins: dict[str, Pin] = {}
    name = ""
    for line in path.read_text().splitlines():
        pinned = PIN.match(line)
        if pinned:
            name = normalized(pinned.group(1))
            pins[name] = Pin(pinned.group(2), frozenset())
        elif name and line.startswith(" "):
            found = frozenset(HASH.findall(line))
            if found:
                pins[name] = Pin(pins[name].version, pins[name].hashes | found)
        else:
            name = ""
    return pins


def expected_versions(lock: Path = LOCK, torch: Path = TORCH) -> dict[str, str]:
    """The version of every project the tested set pins: the lock's, and torch's from requirements/torch.txt."""
    return {name: pin.version for name, pin in {**read_pins(lock), **read_pins(torch)}.items()}


def installed_versions() -> dict[str, str]:
    """This interpreter's installed projects (the first on sys.path of each name, as imports see them), with
    a local version label dropped (torch's ``+cpu``: requirements/torch.txt pins the release)."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        found.setdefault(normalized(dist.metadata["Name"]), dist.version.split("+", 1)[0])
    return found


def compared(expected: dict[str, str], installed: dict[str, str]) -> list[tuple[str, str, str]]:
    """(project, pinned, installed) for each project of either, ``-`` where one has none; the projects
    installed beside the lock left out."""
    names = sorted((expected.keys() | installed.keys()) - set(BESIDE_THE_LOCK))
    return [(name, expected.get(name, "-"), installed.get(name, "-")) for name in names]


def differences(expected: dict[str, str], installed: dict[str, str]) -> list[tuple[str, str, str]]:
    """The rows of :func:`compared` where the pinned and the installed version differ."""
    return [row for row in compared(expected, installed) if row[1] != row[2]]


def distribution_file(path: Path) -> tuple[str, str] | None:
    """(project, version) of a wheel or an sdist by its file name; None for any other file."""
    if path.name.endswith(".whl"):
        project, version = path.name.split("-")[:2]
    elif path.name.endswith(".tar.gz"):
        project, _, version = path.name.removesuffix(".tar.gz").rpartition("-")
    else:
        return None
    return normalized(project), version


def verify(directory: Path, pins: dict[str, Pin]) -> tuple[list[str], list[str]]:
    """(problems, unlocked): each file in ``directory`` of a locked project that is not the locked version or
    whose sha256 is not among the lock's; the projects the lock does not hold (autotune's own wheel aside)."""
    problems: list[str] = []
    unlocked: list[str] = []
    for path in sorted(directory.iterdir()):
        found = distribution_file(path)
        if found is None or found[0] == "autotune":
            continue
        project, version = found
        pin = pins.get(project)
        if pin is None:
            unlocked.append(f"{project}=={version}")
        elif version != pin.version:
            problems.append(f"{path.name}: version {version}, the lock pins {pin.version}")
        elif hashlib.sha256(path.read_bytes()).hexdigest() not in pin.hashes:
            problems.append(f"{path.name}: its sha256 is not one of the lock's {len(pin.hashes)} for {project}")
    return problems, unlocked


def drift_markdown(expected: dict[str, str], installed: dict[str, str]) -> str:
    """The projects that differ from the lock, as a table, and every installed version, for docs/drift.md."""
    changed = differences(expected, installed)
    total = len(compared(expected, installed))
    lines = [f"{len(changed)} of {total} projects differ from the lock (and requirements/torch.txt)."]
    if changed:
        lines += ["", "| project | locked | newest |", "|---|---|---|"]
        lines += [f"| {name} | {pinned} | {newest} |" for name, pinned, newest in changed]
    versions = ", ".join(f"{name} {version}" for name, version in sorted(installed.items()))
    lines += ["", f"Installed: {versions}."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    command, lock = argv[0], Path(argv[1])
    if command == "verify":
        problems, unlocked = verify(Path(argv[2]), read_pins(lock))
        if unlocked:
            print(f"not in {lock.name} (resolved by pip for this target): {', '.join(unlocked)}", file=sys.stderr)
        for problem in problems:
            print(f"lock: error: {problem}", file=sys.stderr)
        return 1 if problems else 0
    elif command == "drift":
        print(drift_markdown(expected_versions(lock), installed_versions()))
    else:
        print(f"lock: error: unknown command {command} (verify, drift)", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
