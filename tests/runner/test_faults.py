"""Fault injection with real faults in real trial children (see tests/support/faults.py), at the study
level: what is recorded in a real Optuna storage (OOM = COMPLETE with value 0 and a violated
constraint; crash, timeout and error = FAIL), the retry of crashes and timeouts, and that the study
stays consistent. How the runner classifies each fault of one child: tests/runner/test_pool.py,
test_failures.py and test_watch.py.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.levers import TrialConfig
from autotune.result import TrialResult
from tests.support.processes import wait_until_gone

pytestmark = pytest.mark.slow

GiB = 1024**3
# Long enough for a tiny model to build and start training on a busy 2-core machine; a hang is
# reported as a timeout whether it began before or after the fault fired.
SHORT_TIMEOUT_S = 4.0


# --- study level: what the storage records, retries, consistency ------------------------------


@pytest.fixture
def study_for(tmp_path, sqlite_url, tiny_workload):
    """A real study in SQLite and the SearchRequest that runs faults in it."""
    from autotune.space import SearchSpace
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study

    def make(
        *faults: str,
        timeout_s: float = 120.0,
        micro_batch: int = 8,
        seq_len: int = 32,
        address_space_bytes: int | None = None,
    ):
        request = SearchRequest(
            workload=tiny_workload(
                seq_len=seq_len,
                callbacks=tuple(f"tests.support.faults:{fault}" for fault in faults),
                address_space_bytes=address_space_bytes,
            ),
            space=SearchSpace(choices={"micro_batch": [micro_batch], "pin_memory": [False]}),
            trial_timeout_s=timeout_s,
            work_root=str(tmp_path / "runs"),
            screen=False,  # every config runs: these tests are about what happens in the child
        )
        name = "-".join(faults) or f"mb{micro_batch}"
        return open_study(open_storage(sqlite_url), name, request), request

    return make


def run_trial(study: optuna.Study, request) -> optuna.trial.FrozenTrial:
    from autotune.study import SearchProgress
    from autotune.study._loop import run_one_trial

    run_one_trial(study, request, SearchProgress())
    return study.get_trials()[-1]


def assert_consistent(study: optuna.Study) -> None:
    """No trial left RUNNING; every finished trial carries its result; states match statuses; the
    row the live table and `autotune best --all` show says the status and the reason."""
    from rich.text import Text

    from autotune.views.trial_table import trial_cells

    for trial in study.get_trials():
        assert trial.state != TrialState.RUNNING, f"trial {trial.number} left RUNNING"
        if trial.state == TrialState.WAITING:
            continue
        result = TrialResult.from_trial(trial)
        assert result is not None, f"trial {trial.number} has no result"
        assert trial.user_attrs["status"] == result.status
        cells = trial_cells(trial.number, TrialConfig.from_params(trial.params), result)
        # The cells are Rich markup, a trial's error escaped in them (views.text.for_rich): read as shown.
        assert result.status in cells[1] and result.error[:40] in Text.from_markup(cells[-1]).plain
        if result.status in ("crash", "timeout", "error", "interrupted"):
            assert trial.state == TrialState.FAIL and result.error
        elif result.status in ("oom", "over_ceiling"):
            assert trial.state == TrialState.COMPLETE and trial.value == 0.0
            assert trial.system_attrs["constraints"][0] > 0
        elif result.status == "ok":
            assert trial.state == TrialState.COMPLETE and trial.value > 0
            assert trial.system_attrs["constraints"][0] <= 0


def test_allocator_oom_under_the_address_space_limit_is_complete_with_value_zero(study_for):
    # 1024 x 512 tokens through BERT: each layer's attention scores alone want 2 GiB; the child
    # may grow its address space by 1 GiB only, so torch's allocator fails inside it.
    study, request = study_for(micro_batch=1024, seq_len=512, address_space_bytes=1 * GiB)
    trial = run_trial(study, request)
    assert trial.state == TrialState.COMPLETE
    assert trial.value == 0.0
    result = TrialResult.from_trial(trial)
    assert result.status == "oom" and "DefaultCPUAllocator" in result.error
    assert "can't allocate memory" in result.stderr_tail
    assert result.attempts == 1  # a property of the config: never retried
    assert trial.system_attrs["constraints"][0] > 0
    with pytest.raises(ValueError):
        _ = study.best_trial  # Optuna itself sees no feasible trial
    assert_consistent(study)


def test_memory_error_is_oom(study_for):
    # A 4 GiB bytearray fits on the host, but not under the child's 1 GiB address-space budget.
    study, request = study_for("MemoryErrorAtStep", address_space_bytes=1 * GiB)
    trial = run_trial(study, request)
    assert (trial.state, trial.value) == (TrialState.COMPLETE, 0.0)
    result = TrialResult.from_trial(trial)
    assert result.status == "oom" and result.error.startswith("MemoryError")
    assert "MemoryError" in result.stderr_tail
    assert_consistent(study)


def test_onednn_failing_to_allocate_a_primitive_under_the_address_space_budget_is_oom(study_for):
    study, request = study_for("OneDnnOutOfAddressSpaceAtStep", address_space_bytes=1 * GiB)
    trial = run_trial(study, request)
    assert (trial.state, trial.value) == (TrialState.COMPLETE, 0.0)
    result = TrialResult.from_trial(trial)
    assert (result.status, result.error) == ("oom", "RuntimeError: could not create a primitive")
    assert_consistent(study)


def test_transient_crash_is_retried_once_and_then_measured(study_for):
    study, request = study_for("SigkillOnFirstAttempt")
    trial = run_trial(study, request)
    assert trial.state == TrialState.COMPLETE
    result = TrialResult.from_trial(trial)
    assert result.status == "ok" and result.attempts == 2
    assert trial.user_attrs["first_attempt"]["status"] == "crash"
    assert trial.user_attrs["first_attempt"]["error"] == "killed by SIGKILL"
    assert_consistent(study)


def test_segfault_is_a_crash_and_fails_after_two_attempts(study_for):
    study, request = study_for("SegfaultAtStep")
    trial = run_trial(study, request)
    assert trial.state == TrialState.FAIL
    result = TrialResult.from_trial(trial)
    assert (result.status, result.error, result.attempts) == ("crash", "killed by SIGSEGV", 2)
    assert trial.user_attrs["first_attempt"]["error"] == "killed by SIGSEGV"
    # faulthandler wrote the crashing stack to the child's log; both attempts share the log.
    assert "Fatal Python error: Segmentation fault" in result.stderr_tail
    assert "faults.py" in result.stderr_tail
    log = next(Path(request.work_root).glob("*/child.log")).read_text()
    assert "attempt 1 ended: crash: killed by SIGSEGV; retrying once" in log
    assert log.count("Fatal Python error: Segmentation fault") == 2
    assert_consistent(study)


def test_hang_past_the_timeout_is_killed_and_the_retry_times_out_too(study_for):
    study, request = study_for("HangAtStep", timeout_s=SHORT_TIMEOUT_S)
    trial = run_trial(study, request)
    assert trial.state == TrialState.FAIL
    result = TrialResult.from_trial(trial)
    assert (result.status, result.attempts) == ("timeout", 2)
    assert f"no result within the {SHORT_TIMEOUT_S:g} s timeout" in result.error
    assert trial.user_attrs["first_attempt"]["status"] == "timeout"
    for pid_file in Path(request.work_root).glob("*/hung.pid"):  # the fault fired before the timeout
        assert wait_until_gone(int(pid_file.read_text()))
    assert_consistent(study)


def test_a_trial_whose_steps_keep_ending_when_its_timeout_kills_it_is_slow_and_not_tried_again(study_for):
    """A config slower than its timeout (a 135M model in emulated bf16 on a CPU took 350 s a step and was killed
    at 900 s, then run for 900 s more): its steps kept ending, so it is recorded as too slow, once. The tiny
    workload trains 4 steps (1 warm-up, 3 timed) of STEP_S each: it cannot end within 4 x STEP_S, and its
    first step ends well before unless the set-up takes 3 x STEP_S."""
    from tests.support.faults import StepsPastTheTimeout

    study, request = study_for("StepsPastTheTimeout", timeout_s=4 * StepsPastTheTimeout.STEP_S)
    trial = run_trial(study, request)
    result = TrialResult.from_trial(trial)
    assert (result.status, result.attempts, result.still_stepping) == ("timeout", 1, True)
    assert "killed while its steps still came" in result.error
    assert "too slow for the timeout, not hung, so not tried again" in result.error
    assert "first_attempt" not in trial.user_attrs
    assert_consistent(study)


def test_a_stopped_child_past_the_timeout_is_killed_and_the_retry_times_out_too(study_for):
    # SIGSTOP, unlike a hang, leaves a process that handles no signal but SIGKILL: the timeout still ends it.
    # The stop must fire in at least one attempt (the retry's child forks from a running forkserver, and a
    # forked tiny BERT reaches its first step in 1-3 s on a busy 2-core machine): 2.5 x SHORT_TIMEOUT_S
    # leaves room for that, where 20 s per attempt cost the suite 40 s of waiting on a stopped process.
    study, request = study_for("StopAtStep", timeout_s=2.5 * SHORT_TIMEOUT_S)
    trial = run_trial(study, request)
    result = TrialResult.from_trial(trial)
    assert (result.status, result.attempts) == ("timeout", 2)
    stopped = [int(pid) for pid in (Path(request.work_root) / "stopped.pids").read_text().split()]
    assert stopped and all(
        wait_until_gone(pid) for pid in stopped
    )  # stopped (a loaded machine: once or twice), then gone
    assert_consistent(study)


def test_exception_deep_inside_trainer_is_an_error_and_not_retried(study_for):
    study, request = study_for("RaiseDeepInForward")
    trial = run_trial(study, request)
    assert trial.state == TrialState.FAIL
    result = TrialResult.from_trial(trial)
    assert (result.status, result.attempts) == ("error", 1)
    assert result.error.startswith("ValueError: injected fault in the forward of")
    assert "faults.py" in result.stderr_tail  # the traceback's deepest frames
    assert result.stderr_tail.rstrip().endswith("ValueError: injected fault in the forward of Linear")
    assert "first_attempt" not in trial.user_attrs
    assert_consistent(study)
