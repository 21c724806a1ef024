"""The CPU memory probe a trial child measures with (the CUDA probe: tests/runner/test_cuda_fakes.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

from autotune.runner._memory_probe import CpuMemoryProbe

MiB = 1024**2
GiB = 1024**3


@pytest.mark.slow
def test_cpu_probe_counts_a_child_process():
    """A worker that holds 300 MiB shows up in the tree's peak, not in the trial process's own."""
    probe = CpuMemoryProbe(interval_s=0.02, relist_interval_s=0.1)
    probe.start()
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nb = bytearray(300 * 1024 * 1024)\nprint('ready', flush=True)\ntime.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # several listings and samples while the child holds its memory
        own_rss = psutil.Process().memory_info().rss
        peaks = probe.peaks()
    finally:
        child.kill()
        child.wait()
        probe.stop()
    assert peaks["peak_rss_tree_sampled_bytes"] >= own_rss + 280 * MiB
    assert peaks["peak_rss_tree_bytes"] >= peaks["peak_rss_tree_sampled_bytes"]
    # The child's bytearray is anonymous memory: it counts in the anonymous figure too.
    own = psutil.Process().memory_info()
    assert peaks["peak_anon_rss_tree_sampled_bytes"] >= (own.rss - own.shared) + 280 * MiB
    assert peaks["peak_anon_rss_tree_sampled_bytes"] <= peaks["peak_rss_tree_sampled_bytes"]
    assert CpuMemoryProbe.ceiling_source == "peak_rss_tree_bytes"


def _unmapped_in_child(queue) -> None:
    from autotune.runner._memory_probe import unmapped_import_file_bytes

    queue.put(unmapped_import_file_bytes())


@pytest.mark.slow
def test_a_forkserver_child_counts_the_library_pages_a_fresh_process_maps():
    """The forkserver imported torch; its child maps those library pages only once it touches them."""
    from autotune.runner._pool import forkserver_context

    context = forkserver_context("cpu")
    queue = context.Queue()
    child = context.Process(target=_unmapped_in_child, args=(queue,))
    child.start()
    unmapped = queue.get(timeout=120)
    child.join()
    assert unmapped > 30 * MiB  # libtorch alone maps far more than this while importing
    # A process that imported torch itself, under a bare interpreter that maps far fewer library
    # pages (a spawned child): nothing is missing, and the difference is clamped at 0.
    inner = "import torch\nfrom autotune.runner._memory_probe import unmapped_import_file_bytes\nprint(unmapped_import_file_bytes())"
    outer = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {inner!r}], check=True)"
    spawned = subprocess.run([sys.executable, "-c", outer], capture_output=True, text=True, check=True)
    assert int(spawned.stdout.strip()) == 0


def test_cpu_probe_adds_the_unmapped_library_pages_to_the_ceilings_figure_only():
    probe = CpuMemoryProbe(interval_s=0.02, relist_interval_s=0.1, unmapped_import_bytes=100 * MiB)
    probe.start()
    time.sleep(0.2)
    peaks = probe.peaks()
    probe.stop()
    raw = max(peaks["peak_rss_tree_sampled_bytes"], peaks["peak_rss_self_bytes"])
    assert peaks["peak_rss_tree_bytes"] == raw + 100 * MiB
    assert peaks["unmapped_import_file_bytes"] == 100 * MiB
