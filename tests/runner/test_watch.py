"""The orchestrator's view of a running child (autotune.runner._watch): the memory of its process
tree sampled from outside, and the evidence that a SIGKILL came from the kernel's OOM killer."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.runner._failures import classify_exit
from autotune.runner._watch import ChildWatch, killed_for_memory, oom_kill_count

GiB = 1024**3
MiB = 1024**2
# A process that starts a worker holding 200 MiB, as a trial child's dataloader workers would.
WORKER_HOLDING_200_MIB = (
    "import subprocess, sys; "
    "worker = subprocess.Popen([sys.executable, '-c', 'import time; held = b\"x\" * (200 * 2**20); time.sleep(60)']); "
    "worker.wait()"
)


@pytest.mark.slow
def test_the_watch_counts_the_childs_workers_and_keeps_its_last_sample_once_the_child_is_gone():
    child = subprocess.Popen([sys.executable, "-c", WORKER_HOLDING_200_MIB], start_new_session=True)
    watch = ChildWatch(child.pid)
    try:
        deadline = time.monotonic() + 60
        while watch.peak_rss_tree_bytes < 200 * MiB and time.monotonic() < deadline:
            watch.sample()
            time.sleep(0.1)
    finally:
        os.killpg(child.pid, signal.SIGKILL)  # the child and its worker: the group this test started
        child.wait()
    assert watch.peak_rss_tree_bytes >= 200 * MiB  # the worker's memory, not only the child's own
    peak, available = watch.peak_rss_tree_bytes, watch.last_available_bytes
    watch.sample()  # the child is gone: the last sample stands
    assert (watch.peak_rss_tree_bytes, watch.last_available_bytes) == (peak, available)
    assert available is not None and available > 0


def test_sigkill_counts_as_oom_only_with_evidence_of_the_oom_killer():
    total = 24 * GiB
    assert killed_for_memory(oom_kills_before=3, oom_kills_after=4, available_bytes=20 * GiB, total_bytes=total)
    assert killed_for_memory(oom_kills_before=3, oom_kills_after=3, available_bytes=200 * MiB, total_bytes=total)
    assert not killed_for_memory(oom_kills_before=3, oom_kills_after=3, available_bytes=20 * GiB, total_bytes=total)
    assert not killed_for_memory(oom_kills_before=None, oom_kills_after=None, available_bytes=None, total_bytes=total)
    assert classify_exit(-9, near_memory_limit=True)[0] == "oom"
    assert classify_exit(-9, near_memory_limit=False) == ("crash", "killed by SIGKILL")
    assert classify_exit(-11, near_memory_limit=True) == ("crash", "killed by SIGSEGV")


def test_oom_kill_counter_is_read_from_vmstat(tmp_path):
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 12\noom_kill 7\nnr_zone_active_anon 1\n")
    assert oom_kill_count(str(vmstat)) == 7
    assert oom_kill_count(str(tmp_path / "missing")) is None
    if Path("/proc/vmstat").exists():
        assert isinstance(oom_kill_count(), int)
