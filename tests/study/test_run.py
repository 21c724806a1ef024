"""``autotune.study.search``, the one call that runs a search: its order (kept results recorded, dead
runs' trials re-queued, the loop, why it stopped, the confirmation, the note), and the loop's checks
made once each (the stop rule once per ask, the repeat check once per trial)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autotune.result import TrialResult
from autotune.space import SearchSpace
from autotune.storage import open_storage, schema
from autotune.study import SearchBudget, SearchHooks, SearchProgress, SearchRequest, _loop, open_study, search
from autotune.study._liveness import worker_identity
from autotune.study._loop import run_search
from autotune.study._record import PENDING_RESULT_FILE, trial_work_dir
from tests.study.test_proposals import FORTY_EIGHT_CONFIGS, LookupRunner, make_request, speed_of

GiB = 1024**3


def counted(monkeypatch: pytest.MonkeyPatch, module: object, name: str) -> list[int]:
    """Counts the calls of ``module.name``, which still runs (a spy, not a stand-in)."""
    calls: list[int] = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, spy)
    return calls


def test_the_stop_rule_runs_once_per_ask_and_the_repeat_check_once_per_trial(monkeypatch, tmp_path, cpu, bert_tiny):
    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(optuna.storages.InMemoryStorage(), "once", request, sampler_seed=0)
    stop_checks = counted(monkeypatch, _loop, "stop_reason")
    repeat_checks = counted(monkeypatch, _loop, "_reuse_measured")
    assert run_search(study, request, SearchBudget(trials=6), run_trial=LookupRunner(speed_of)) == 6
    assert len(study.trials) == 6  # six asks (the two seeds among them), none a repeat
    assert len(stop_checks) == 6
    assert len(repeat_checks) == 6

    # --patience is judged by the same one check per ask: the ask that finds the search done is the last.
    flat = open_study(optuna.storages.InMemoryStorage(), "flat", request, sampler_seed=0)
    stop_checks.clear()
    runner = LookupRunner(lambda c: 50.0 + (c.micro_batch % 3) * 0.1)
    assert run_search(flat, request, SearchBudget(trials=30, patience=5), run_trial=runner) == 6
    assert len(stop_checks) == 7


class RecordedView:
    """A live view that records when the loop runs inside it."""

    def __init__(self, events: list[tuple]) -> None:
        self.events = events

    def __enter__(self) -> RecordedView:
        self.events.append(("view entered",))
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append(("view left",))


def dead_pid() -> int:
    """The PID of a process that has exited (a run that died)."""
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(finished.stdout)


@pytest.mark.slow
def test_search_records_recovers_runs_stops_confirms_and_writes_the_note_in_that_order(
    tmp_path, sqlite_url, tiny_workload
):
    """A study left by two runs: one kept its measured result in a file (the storage was full), one
    died with its trial running. One call records the first, re-queues the second, runs it for real
    (a child), says the two-config space is done, confirms the leader (two real re-runs) and writes
    the note last."""
    work_root = tmp_path / "runs"
    request = SearchRequest(
        workload=tiny_workload(),
        space=SearchSpace(choices={"micro_batch": [8, 16], "pin_memory": [False]}),
        work_root=str(work_root),
        screen=False,
        prune_ratio=0.0,
    )
    study = open_study(open_storage(sqlite_url), "run", request)
    # The two seed trials, left RUNNING by the runs before.
    kept, orphan = study.ask(request.space.distributions()), study.ask(request.space.distributions())
    kept_result = TrialResult(
        status="ok", samples_per_s=1e6, model_tflops=1.0, peak_memory_bytes=GiB, ceiling_bytes=request.ceiling_bytes
    )
    pending = Path(trial_work_dir(str(work_root), kept.number)) / PENDING_RESULT_FILE
    pending.parent.mkdir(parents=True)
    pending.write_text(json.dumps({"trial": kept.number, "result": kept_result.to_dict()}))
    owner = {**worker_identity(), "pid": dead_pid(), "started": None, "trial": orphan.number}
    study._storage.set_trial_system_attr(orphan._trial_id, schema.TRIAL_OWNER, owner)

    events: list[tuple] = []
    hooks = SearchHooks(
        progress=SearchProgress(
            lambda number, config: events.append(("trial started", number)),
            lambda number, config, result: events.append(("trial ended", number, result.status)),
        ),
        view=RecordedView(events),
        on_note=lambda line: events.append(("note", line)),
        on_loop_end=lambda reason: events.append(("loop ended", reason)),
        on_confirm_run=lambda round_index, number, result: events.append(("confirm run", round_index, number)),
        write_note=lambda written: events.append(("note written", schema.STUDY_CONFIRMATION in written.user_attrs)),
    )
    # A budget of 1% of the search's time: the leader's first re-run (the minimum) and no second.
    budget = SearchBudget(trials=5, confirm_top=1, confirm_repeats=2, confirm_budget=0.01)
    outcome = search(study, request, budget, hooks)

    assert outcome.recorded == (kept.number,) and outcome.requeued == (orphan.number,)
    assert outcome.finished == 1  # the re-queued trial; then both configs are measured
    assert outcome.stop_reason is not None and outcome.stop_reason.startswith(
        "every config of the space has been measured"
    )
    rerun = max(t.number for t in study.trials)
    assert study.trials[rerun].params == study.trials[orphan.number].params != study.trials[kept.number].params
    assert [c.trial_number for c in outcome.confirmations] == [kept.number]  # the fastest feasible: the kept result
    assert not outcome.confirmation_interrupted
    assert [event[0] for event in events] == [
        "note",
        "note",
        "view entered",
        "trial started",
        "trial ended",
        "view left",
        "loop ended",
        "confirm run",
        "note written",
    ]
    assert "recorded now" in events[0][1] and f"trial(s) {kept.number} " in events[0][1]
    assert "queued again" in events[1][1] and f"trial(s) {orphan.number} " in events[1][1]
    assert events[3][1] == events[4][1] == rerun and events[4][2] == "ok"
    assert events[6] == ("loop ended", outcome.stop_reason)
    assert events[7][1:] == (0, kept.number)
    assert events[8] == ("note written", True)  # written after the confirmation was recorded
    record = study.user_attrs[schema.STUDY_CONFIRMATION]
    # The search's wall time before the confirmation, the time-share line's clock, is what the budget is a share of.
    assert record["stopped"] == "budget" and 0 < record["search_s"] <= outcome.time_spent.wall_s
    assert record["budget_s"] == pytest.approx(0.01 * record["search_s"])
    assert study.trials[kept.number].state == optuna.trial.TrialState.COMPLETE
    assert not pending.exists()  # recorded once: the file is renamed


class TimedRunner(LookupRunner):
    """A lookup whose every trial took 10 s: 6 s of measured steps, 2 s of warm-up, 2 s besides."""

    def __call__(self, job, timeout_s, on_tick=None) -> TrialResult:
        result = super().__call__(job, timeout_s, on_tick)
        result.wall_s, result.measured_s, result.warmup_s = 10.0, 6.0, 2.0
        return result


def test_a_search_records_where_its_wall_time_went(tmp_path, cpu, bert_tiny):
    from autotune.result import TimeSpent

    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(optuna.storages.InMemoryStorage(), "timed", request, sampler_seed=0)
    outcome = search(study, request, SearchBudget(trials=4, confirm_top=0), run_trial=TimedRunner(speed_of))
    spent = TimeSpent.from_dict(study.user_attrs[schema.STUDY_TIME_SPENT])
    assert spent == outcome.time_spent
    assert (spent.trials, spent.measured_s, spent.warmup_s, spent.startup_s) == (4, 24.0, 8.0, 8.0)
    assert (spent.pruned, spent.confirmation_runs) == (0, 0)
    # A second search on the same study counts only its own trials.
    again = search(study, request, SearchBudget(trials=2, confirm_top=0), run_trial=TimedRunner(speed_of))
    assert again.time_spent.trials == 2 and again.time_spent.measured_s == 12.0
