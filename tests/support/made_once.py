"""A session fixture's value made once per test run, whatever the number of xdist workers: the workers
share the base temp directory's parent and take turns through a file lock (pytest-xdist's documented
way, "Making session-scoped fixtures execute only once"); the first that asks makes it, the rest read
its pickled record."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def run_root(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The directory every worker of this run shares (the base temp directory without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


def made_once(root: Path, name: str, make: Callable[[Path], T]) -> T:
    """``make(root / name)``, made by the first worker that asks, read by the rest.

    A failed ``make`` leaves no record, so the next worker that asks tries again (and fails the same way).
    """
    from filelock import FileLock

    record = root / f"{name}.pickle"
    with FileLock(str(root / f"{name}.lock")):
        if record.exists():
            return pickle.loads(record.read_bytes())
        workdir = root / name
        workdir.mkdir(exist_ok=True)
        made = make(workdir)
        record.write_bytes(pickle.dumps(made))
        return made
