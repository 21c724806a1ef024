"""Running the real ``autotune`` command line from a test, as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

# No end-of-search confirmation (3 x 3 re-runs by default): a test that wants it passes
# --confirm-top after these (the last occurrence of an option wins).
FAST_SEARCH_ARGS = ["--warmup-steps", "1", "--max-measure-steps", "4", "--seq-len", "32", "--confirm-top", "0"]


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the real ``autotune`` command line in a subprocess, as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )
