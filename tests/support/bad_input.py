"""What the bad-input and fault tests share: the search they start, a study made beforehand, and the
check that a failure is one ``autotune: error:`` line."""

from __future__ import annotations

import subprocess

from tests.support.cli import REPO

SEARCH = ["search", "--trials", "1", "--confirm-top", "0", "--seq-len", "32"]
TINY_SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")


def create_study(url: str, name: str, ceiling_bytes: int) -> None:
    """A study made through autotune's own API in a real storage, as an earlier search leaves it."""
    from autotune.runner import Workload
    from autotune.space import load_space
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study

    workload = Workload.for_model("bert-tiny", seq_len=32, ceiling_bytes=ceiling_bytes)
    request = SearchRequest(workload=workload, space=load_space(TINY_SPACE, workload.device))
    open_study(open_storage(url), name, request)


def assert_one_error_line(completed: subprocess.CompletedProcess, phrase: str) -> None:
    """Exit 2, no traceback, and exactly one line on stderr: ``autotune: error: ...`` naming ``phrase``."""
    lines = [line for line in completed.stderr.splitlines() if line.strip()]
    assert "Traceback" not in completed.stderr + completed.stdout, completed.stderr[-3000:]
    assert completed.returncode == 2, completed.stderr[-3000:]
    assert len(lines) == 1, completed.stderr[-3000:]
    assert lines[0].startswith("autotune: error: ")
    assert phrase in lines[0], lines[0]
