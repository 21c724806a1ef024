"""The orchestrator's view of a running child: its memory, and the kernel's OOM-kill counter.

A child killed by SIGKILL died either because someone killed it or because the kernel's OOM
killer chose it. The child cannot say which (it is dead), so the orchestrator watches from outside:
it samples the resident memory of the child's process tree and the host's available memory while
the child runs, and reads the kernel's count of OOM kills before and after.
"""

from __future__ import annotations

import psutil

# The host counts as "near its memory limit" when less than this share of its RAM was available
# at the last sample before the child died.
LOW_AVAILABLE_FRACTION = 0.05


def oom_kill_count(vmstat_path: str = "/proc/vmstat") -> int | None:
    """How many processes the kernel's OOM killer has killed since boot (Linux >= 4.13).

    The counter is host-wide and counts memory-cgroup (container) OOM kills too. ``None`` where it
    cannot be read (not Linux, an older kernel).
    """
    try:
        with open(vmstat_path) as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def killed_for_memory(
    oom_kills_before: int | None,
    oom_kills_after: int | None,
    available_bytes: int | None,
    total_bytes: int,
) -> bool:
    """Whether a child that died by SIGKILL was most likely killed by the kernel's OOM killer.

    Args:
        oom_kills_before: :func:`oom_kill_count` when the child started.
        oom_kills_after: :func:`oom_kill_count` after it died.
        available_bytes: Host memory available at the last sample while the child ran.
        total_bytes: Host RAM.
    """
    if oom_kills_before is not None and oom_kills_after is not None and oom_kills_after > oom_kills_before:
        return True  # the kernel says it killed something while the child ran
    return available_bytes is not None and available_bytes < LOW_AVAILABLE_FRACTION * total_bytes


class ChildWatch:
    """Samples a child's process tree from the orchestrator, about every poll of the pool.

    Attributes:
        peak_rss_tree_bytes: Highest resident memory of the child and its workers seen so far.
        last_available_bytes: Host memory available at the last sample.
    """

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._oom_kills_at_start = oom_kill_count()
        self.peak_rss_tree_bytes = 0
        self.last_available_bytes: int | None = None

    def sample(self) -> None:
        try:
            root = psutil.Process(self._pid)
            processes = [root, *root.children(recursive=True)]
        except psutil.Error:
            return  # the child is gone; keep the last sample
        rss = 0
        for process in processes:
            try:
                rss += process.memory_info().rss
            except psutil.Error:
                pass  # a worker that exited between listing and reading
        self.peak_rss_tree_bytes = max(self.peak_rss_tree_bytes, rss)
        self.last_available_bytes = psutil.virtual_memory().available

    def killed_for_memory(self) -> bool:
        """Read once the child died by SIGKILL: see :func:`killed_for_memory`."""
        return killed_for_memory(
            self._oom_kills_at_start, oom_kill_count(), self.last_available_bytes, psutil.virtual_memory().total
        )
