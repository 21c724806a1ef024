"""Compile time is its own budget (issue 23, point 5): a torch.compile trial gets ``--compile-timeout`` to end
its first optimizer step and the trial timeout from then on; one still compiling past it is
``compile_timeout``, with what it cost; inductor's cache is shared by the trials of a search."""

from __future__ import annotations

import os

import pytest

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, Workload, child_environment, run_isolated
from autotune.runner._deadlines import TrialDeadlines
from autotune.units import GiB


@pytest.mark.slow
def test_a_trial_still_compiling_past_the_compile_timeout_is_compile_timeout_with_its_cost(
    tmp_path, bert_tiny, cpu, fast_measure
):
    # Dynamo traces the BERT forward and backward for seconds before the first step can end.
    workload = Workload.for_model(
        bert_tiny, device=cpu, seq_len=32, ceiling_bytes=8 * GiB, measure=fast_measure, compile_timeout_s=1.0
    )
    job = TrialJob(
        workload=workload,
        config=TrialConfig(micro_batch=8, pin_memory=False, compile="inductor"),
        work_dir=str(tmp_path / "trial-0"),
    )
    result = run_isolated(job, timeout_s=300)
    assert result.status == "compile_timeout"
    assert result.error.startswith(
        "torch.compile (inductor) still compiling after the 1 s compile timeout (--compile-timeout)"
    )
    assert result.compile_s >= 1.0 and result.wall_s >= result.compile_s  # what it cost, shown


def test_the_trial_timeout_counts_from_the_end_of_the_first_step_when_compile_has_its_own_budget():
    deadlines = TrialDeadlines(started=0.0, timeout_s=60.0, compile_timeout_s=600.0)
    assert not deadlines.check(now=500.0)  # compiling, inside its budget, long past the trial timeout
    deadlines.first_step_ended(now=550.0, compile_s=540.0)
    assert not deadlines.check(now=600.0)
    assert deadlines.check(now=611.0) and deadlines.expired == "timeout"
    result = deadlines.result("inductor:max-autotune")
    assert result.status == "timeout" and result.compile_s == 540.0
    assert result.error == "no result within the 60 s timeout after its first step (compiled in 540 s); killed"


def test_still_compiling_past_its_budget_and_without_a_budget_one_timeout_for_all():
    compiling = TrialDeadlines(started=0.0, timeout_s=900.0, compile_timeout_s=600.0)
    assert compiling.check(now=601.0) and compiling.expired == "compile_timeout"
    assert compiling.result("inductor").compile_s == 601.0
    plain = TrialDeadlines(started=0.0, timeout_s=60.0, compile_timeout_s=None)
    plain.first_step_ended(now=50.0, compile_s=0.0)
    assert plain.check(now=61.0) and plain.expired == "timeout"
    assert plain.result("off").error == "no result within the 60 s timeout; killed"


def test_the_inductor_cache_is_the_work_roots_shared_by_every_trial_unless_the_user_set_one(tmp_path, cpu, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    first = child_environment(cpu, str(tmp_path / "runs" / "trial-0-123"))
    second = child_environment(cpu, str(tmp_path / "runs" / "trial-7-123"))
    assert (
        first["TORCHINDUCTOR_CACHE_DIR"]
        == second["TORCHINDUCTOR_CACHE_DIR"]
        == str(tmp_path / "runs" / "inductor-cache")
    )
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/theirs")
    assert "TORCHINDUCTOR_CACHE_DIR" not in child_environment(cpu, str(tmp_path / "runs" / "trial-0-123"))
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/theirs"


def test_the_compile_timeout_option_is_checked_like_the_trial_timeout(tmp_path):
    from tests.support.cli import run_cli_in_process

    result = run_cli_in_process(
        "search", "--model", "bert-tiny", "--device", "cpu", "--compile-timeout", "0", cwd=tmp_path
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        == "autotune: error: --compile-timeout 0.0: give a number of seconds above 0, up to and including 86,400"
    )


def test_a_timeout_that_kills_a_trial_still_stepping_is_slow_not_hung_and_is_not_tried_again():
    from autotune.result import worth_retrying

    slow = TrialDeadlines(started=0.0, timeout_s=900.0, compile_timeout_s=None)
    for end in (350.0, 700.0):  # steps of 350 s (set-up in the first), then the fullest batch's, killed in it
        slow.step_ended(now=end, compile_s=0.0)
    assert slow.check(now=901.0) and slow.still_stepping()
    result = slow.result("off")
    assert result.still_stepping and not worth_retrying(result)
    assert "killed while its steps still came (2 ended, the longest 350 s, the last 201 s before)" in result.error
    assert result.error.endswith("--trial-timeout gives a trial longer")
    hung = TrialDeadlines(started=0.0, timeout_s=900.0, compile_timeout_s=None)
    for end in (20.0, 21.0, 22.0):  # a collective stuck after three steps of about a second
        hung.step_ended(now=end, compile_s=0.0)
    assert hung.check(now=901.0) and not hung.still_stepping()
    result = hung.result("off")
    assert result.error == "no result within the 900 s timeout; killed" and worth_retrying(result)
    never = TrialDeadlines(started=0.0, timeout_s=60.0, compile_timeout_s=None)  # hung before its first step ended
    assert never.check(now=61.0) and not never.still_stepping() and worth_retrying(never.result("off"))
