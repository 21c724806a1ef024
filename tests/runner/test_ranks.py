"""Trials that span several ranks (autotune.runner._ranks), run for real on the CPU with gloo: the
group's throughput and the largest rank's peak, and every failure only a distributed run has (a rank
killed mid-trial, the rendezvous port in use, a rendezvous that times out) one classified result,
never a hang, with no process of the trial left behind."""

from __future__ import annotations

import json
import os
import re
import socket

import psutil
import pytest

from autotune.levers import TrialConfig
from autotune.result import Status, TrialResult
from autotune.runner import TrialJob, run_isolated
from autotune.runner._ranks import combine_ranks, run_ranks
from autotune.storage import schema

GiB = 1024**3
LATE_RANK_DIR = os.path.join(os.path.dirname(__file__), "..", "support", "late_rank")
# The trial timeout of the rendezvous that a late rank never joins: the test waits all of it.
RENDEZVOUS_TIMEOUT_S = 12


@pytest.fixture
def two_rank_job(tmp_path, tiny_workload):
    def make(*faults: str, **workload_fields) -> TrialJob:
        workload = tiny_workload(
            devices_per_trial=2, callbacks=tuple(f"tests.support.faults:{fault}" for fault in faults), **workload_fields
        )
        return TrialJob(workload=workload, config=TrialConfig(micro_batch=4), work_dir=str(tmp_path / "trial"))

    return make


def descendants() -> set[int]:
    return {process.pid for process in psutil.Process().children(recursive=True)}


def processes_naming(path: str) -> list[psutil.Process]:
    """Live processes whose command line names ``path``: a trial's launcher and ranks name its
    ``job.pickle``, so this finds a rank even after its launcher died and it was reparented (a
    descendant check alone would miss it)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.status() != psutil.STATUS_ZOMBIE and any(path in part for part in process.cmdline()):
                found.append(process)
        except psutil.Error:
            pass  # ended while being read
    return found


@pytest.fixture
def assert_no_process_left(tmp_path):
    """Checks that the trial left no process: none but those that ran before it (a forkserver that
    an earlier test in this process started) descend from the test, and none anywhere names the
    test's directory (where every trial of the test has its work directory)."""
    before = descendants()

    def check() -> None:
        assert descendants() <= before
        assert processes_naming(str(tmp_path)) == []

    return check


@pytest.mark.slow
def test_a_rendezvous_port_in_use_is_a_crash_saying_so(two_rank_job, assert_no_process_left):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_ranks(two_rank_job(), timeout_s=300, port=port)
    assert result.status == Status.CRASH
    assert result.error == f"rendezvous port {port} already in use: the 2 ranks could not meet"
    assert_no_process_left()


@pytest.mark.slow
def test_a_rank_that_never_joins_times_the_rendezvous_out(two_rank_job, monkeypatch, assert_no_process_left):
    monkeypatch.syspath_prepend(LATE_RANK_DIR)  # rank 1 sleeps at start-up (its sitecustomize)
    # Rank 1 sleeps 600 s: any timeout ends the trial with it missing; a short one keeps the wait short.
    result = run_isolated(two_rank_job(), timeout_s=RENDEZVOUS_TIMEOUT_S)
    assert result.status == Status.TIMEOUT
    # Rank 1 is named; under a loaded machine rank 0 may still be importing at the timeout too, and is then
    # named as well.
    assert re.fullmatch(
        rf"rendezvous of 2 ranks timed out: rank (0, )?1 never started; no result within the "
        rf"{RENDEZVOUS_TIMEOUT_S:g} s timeout; killed",
        result.error,
    )
    assert_no_process_left()


def test_ranks_combine_into_the_sum_of_throughputs_and_the_largest_peak_of_each_source():
    first = TrialResult(
        status=Status.OK, samples_per_s=10.0, model_tflops=1.0, peak_memory_bytes=5, memory_peaks={"a": 5, "b": 1}
    )
    second = TrialResult(
        status=Status.OK, samples_per_s=12.0, model_tflops=1.5, peak_memory_bytes=7, memory_peaks={"a": 7, "b": 0}
    )
    combined = combine_ranks([first, second])
    assert (combined.samples_per_s, combined.model_tflops) == (22.0, 2.5)
    assert combined.peak_memory_bytes == 7
    assert combined.memory_peaks == {"a": 7, "b": 1}
    assert combined.runtime["rank_peak_bytes"] == "5,7"
    assert first.memory_peaks == {"a": 5, "b": 1}  # the ranks' own records are left as they were


def test_a_pass_before_training_over_two_ranks_is_counted_over_the_whole_run_and_projected_once(bert_tiny):
    """DPO's precomputed reference over 2 ranks: each rank passes over its shard and counts it over the run's
    passes, which under max_steps every rank's share of the global batch makes (each rank counted its own share
    alone: twice the pass); combined, the pass is the slowest rank's over all samples, so the projection takes the
    trial's steady rate back and adds the pass once, half of one rank's time over the data."""
    from autotune.levers import TrialConfig
    from autotune.result import Pace, over_the_run, projected_seconds, run_length
    from autotune.runner import Workload
    from autotune.spec.dataset import PreparedDataset

    samples, steps, rank_rate, per_sample = 400, 50, 20.0, 0.01  # a rank's steady samples/s, its pass a sample
    data = PreparedDataset("d", "d", "d", "text", None, 0, samples, samples, False)
    workload = Workload.for_model(
        bert_tiny,
        seq_len=32,
        ceiling_bytes=2**30,
        devices_per_trial=2,
        dataset=data,
        run_length=run_length({"max_steps": steps}, None),
    )
    config = TrialConfig(micro_batch=4)  # each rank's share of the global batch
    passes = workload.run_passes(config)
    assert passes == steps * 4 * 2 / samples  # both ranks' samples each step
    ranks = [
        TrialResult(
            status=Status.OK,
            samples_per_s=over_the_run(rank_rate, per_sample, passes),
            setup_pass_s=per_sample * samples / 2 * slower,
            setup_pass_samples=samples // 2,
            run_passes=passes,
        )
        for slower in (1.0, 1.1)
    ]
    trial = combine_ranks(ranks)
    assert (trial.setup_pass_s, trial.setup_pass_samples) == (per_sample * samples / 2 * 1.1, samples)
    pace = Pace.measured(trial, trial.samples_per_s, 4 * 2, packed_samples=False)
    assert pace.samples_per_s == pytest.approx(2 * rank_rate, rel=0.06)  # the slower rank's pass: within 6 %
    projected = projected_seconds(workload.run_length, samples, pace)
    assert projected == pytest.approx(steps * 8 / (2 * rank_rate) + per_sample * samples / 2 * 1.1, rel=0.06)


@pytest.mark.slow
def test_a_search_records_a_killed_rank_as_that_attempts_crash_and_its_retry_trains_both_ranks(
    tmp_path, tiny_workload, assert_no_process_left
):
    """A rank killed mid-trial is a crash naming the rank, no process of the trial is left, and in a
    search (issue 22) it is that attempt's crash, retried once as a crash is; the retry is two ranks trained
    as one trial: the group's throughput, the largest rank's peak. (One trial for all of it: each attempt
    is two interpreters importing torch and transformers. That a crash on both attempts fails the trial
    is the loop's rule for any crash: tests/runner/test_faults.py.)"""
    from autotune.space import SearchSpace
    from autotune.storage import open_storage
    from autotune.study import SearchBudget, SearchRequest, open_study
    from autotune.study._loop import run_search

    request = SearchRequest(
        workload=tiny_workload(
            devices_per_trial=2, callbacks=("tests.support.faults:SigkillRankOneOnTheFirstAttempt",)
        ),
        space=SearchSpace(choices={"micro_batch": [4, 8], "pin_memory": [False]}),
        work_root=str(tmp_path / "runs"),
        trial_timeout_s=300,
    )
    study = open_study(open_storage(f"sqlite:///{tmp_path / 'study.db'}"), "ranks", request)
    run_search(study, request, SearchBudget(trials=1))  # the retry of a crash is the same trial
    (trial,) = study.get_trials()
    retried = TrialResult.from_trial(trial)
    # Rank 1 died in the first attempt; the trial's record keeps it, and the retry trained.
    assert trial.user_attrs[schema.TRIAL_FIRST_ATTEMPT]["error"] == "rank 1 of 2 killed by SIGKILL"
    assert trial.user_attrs[schema.TRIAL_FIRST_ATTEMPT]["status"] == Status.CRASH
    assert (retried.status, retried.attempts) == (Status.OK, 2) and retried.samples_per_s > 0
    assert_no_process_left()
    # The retry trained both ranks in one process group (DDP over gloo), each measuring its share.
    (work_dir,) = (tmp_path / "runs").glob("trial-0-*")
    assert (work_dir / "rank-1-killed-once").exists()  # the fault fired in this trial's first attempt
    ranks = [TrialResult.from_dict(json.load(open(work_dir / f"rank{r}.json"))) for r in (0, 1)]
    assert all(r.status == Status.OK and r.samples_per_s > 0 for r in ranks)
    assert retried.samples_per_s == pytest.approx(sum(r.samples_per_s for r in ranks))
    assert retried.peak_memory_bytes == max(r.peak_memory_bytes for r in ranks)
    assert retried.runtime["ranks"] == "2"
    assert "find_unused_parameters" in (work_dir / "rank0.log").read_text()  # DDP's reducer spoke
