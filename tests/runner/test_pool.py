"""Running one trial in a child (autotune.runner._pool): every fault of a real child is classified by
what happened (exit code, signal, the peak against the ceiling), with the memory seen from outside
kept (faults: tests/support/faults.py)."""

from __future__ import annotations

import pytest

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, run_isolated
from autotune.runner._watch import oom_kill_count

pytestmark = pytest.mark.slow

GiB = 1024**3
MiB = 1024**2


@pytest.fixture
def job_for(tmp_path, tiny_workload):
    """A trial of bert-tiny on the CPU, with fault callbacks from tests/support/faults.py."""

    def make(*faults: str, ceiling_bytes: int = 8 * GiB) -> TrialJob:
        return TrialJob(
            workload=tiny_workload(
                ceiling_bytes=ceiling_bytes, callbacks=tuple(f"tests.support.faults:{fault}" for fault in faults)
            ),
            config=TrialConfig(micro_batch=8, pin_memory=False),
            work_dir=str(tmp_path / "trial"),
        )

    return make


def test_non_zero_exit_without_result_is_a_crash(job_for):
    result = run_isolated(job_for("ExitNonZeroAtStep"), timeout_s=120)
    assert result.status == "crash"
    assert result.error == "exited with code 3 without a result"


def test_over_the_ceiling_is_measured_and_flagged(job_for):
    result = run_isolated(job_for(ceiling_bytes=64 * MiB), timeout_s=120)
    assert result.status == "over_ceiling"
    assert result.samples_per_s > 0
    assert result.peak_memory_bytes > result.ceiling_bytes == 64 * MiB


def test_sigkill_is_a_crash_and_keeps_the_memory_seen_from_outside(job_for):
    oom_kills_before = oom_kill_count()
    result = run_isolated(job_for("GrabMemoryThenSigkill"), timeout_s=120)
    if oom_kill_count() != oom_kills_before:
        pytest.skip("the kernel OOM-killed some process on this host meanwhile: SIGKILL counts as OOM then")
    # No OOM kill was counted and the host had memory to spare: someone killed it, not the kernel.
    assert result.status == "crash"
    assert result.error == "killed by SIGKILL"
    assert result.memory_peaks["orchestrator_sampled_rss_tree_bytes"] > 300 * MiB


def _report_imports(queue) -> None:
    import os
    import sys

    queue.put(("transformers" in sys.modules, "deepspeed" in sys.modules, os.environ.get("DS_ACCELERATOR")))


def test_a_cpu_trial_child_starts_with_deepspeed_loaded_and_a_forkserver_serves_one_device():
    """Every trial's Trainer imports DeepSpeed where it is installed (runner._baseline.CPU_TRIAL_PROCESS_IMPORTS):
    on the CPU the forkserver has, so no trial pays for it."""
    from autotune.runner._pool import forkserver_context

    deepspeed_installed = pytest.importorskip("deepspeed") is not None
    context = forkserver_context("cpu")
    queue = context.Queue()
    child = context.Process(target=_report_imports, args=(queue,))
    child.start()
    has_transformers, has_deepspeed, accelerator = queue.get(timeout=300)
    child.join()
    assert has_transformers and has_deepspeed == deepspeed_installed and accelerator == "cpu"
    # A CUDA trial must not fork from a process that imported DeepSpeed for the CPU (its environment
    # names the CPU accelerator): the forkserver refuses instead of serving it.
    with pytest.raises(RuntimeError, match="another device"):
        forkserver_context("cuda")
