"""Real file systems for the fault tests: a small tmpfs (to fill to the last byte with
``tests.support.faults.fill_file_system``), remounted read-only where a test needs that.

Mounting needs root (CI runs as root); elsewhere the test is skipped with the reason.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted on ``directory``; skips the test where mounting is not allowed."""
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)], capture_output=True, text=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def remount_read_only(directory: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(directory)], check=True)
