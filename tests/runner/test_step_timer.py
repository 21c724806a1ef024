"""Steady-state step timing: what is excluded, when measurement stops, what is recorded.

No assertion here depends on how fast anything runs: the tests count steps and check rules. The
imports of the timer (a child module) and of torch and transformers are inside the tests: collecting
this file need not import them.
"""

from __future__ import annotations

import statistics
from typing import TYPE_CHECKING

import pytest

from autotune.spec.measure import MeasureSettings, coefficient_of_variation

if TYPE_CHECKING:
    from autotune.runner._step_timer import StepTimer


class ScriptedCompileClock:
    """A compile clock that advances at the steps the test names (a real one needs real compiles)."""

    def __init__(self, compile_at_calls: set[int]) -> None:
        self._calls = 0
        self._seconds = 0.0
        self._compile_at = compile_at_calls

    def __call__(self) -> float:
        if self._calls in self._compile_at:
            self._seconds += 2.0
        self._calls += 1
        return self._seconds


def drive(timer: StepTimer, steps: int) -> int:
    """Call the timer as the Trainer does for ``steps`` optimizer steps; return the steps run."""
    from transformers import TrainerControl, TrainerState

    control = TrainerControl()
    state = TrainerState()
    for step in range(steps):
        timer.on_step_begin(None, state, control)
        state.global_step += 1  # the Trainer counts the step before on_step_end
        control = timer.on_step_end(None, state, control)
        if control.should_training_stop:
            return step + 1
    return steps


def test_coefficient_of_variation():
    assert coefficient_of_variation([]) == 0.0
    assert coefficient_of_variation([2.0]) == 0.0
    values = [1.0, 2.0, 3.0]
    assert coefficient_of_variation(values) == pytest.approx(statistics.stdev(values) / 2.0)


def test_warmup_steps_are_excluded_and_a_met_cv_target_stops_at_min_steps():
    from autotune.runner._step_timer import StepTimer

    settings = MeasureSettings(warmup_steps=2, min_steps=5, max_steps=50, max_seconds=1e9, cv_target=10.0)
    timer = StepTimer(settings, synchronize=lambda: None)
    ran = drive(timer, 100)
    stats = timer.stats()
    assert ran == 2 + 5
    assert stats.warmup_steps == 2 and len(timer.warmup_times) == 2
    assert stats.measured_steps == 5
    assert stats.converged
    assert stats.median_s == statistics.median(timer.step_times[-5:])


def test_an_unmet_cv_target_measures_until_the_step_budget():
    from autotune.runner._step_timer import StepTimer

    settings = MeasureSettings(warmup_steps=1, min_steps=3, max_steps=6, max_seconds=1e9, cv_target=-1.0)
    timer = StepTimer(settings, synchronize=lambda: None)
    assert drive(timer, 100) == 1 + 6
    stats = timer.stats()
    assert stats.measured_steps == 6 and not stats.converged
    assert stats.cv == pytest.approx(coefficient_of_variation(timer.step_times[-3:]))


def test_the_time_budget_stops_measurement():
    from autotune.runner._step_timer import StepTimer

    settings = MeasureSettings(warmup_steps=1, min_steps=3, max_steps=100, max_seconds=0.0, cv_target=-1.0)
    timer = StepTimer(settings, synchronize=lambda: None)
    assert drive(timer, 100) == 2  # one warm-up, then the first measured step spends the budget


def _rank_stops(rank: int, store: str, budgets: tuple[int, int], out: str, compiling_rank: int = -1) -> None:
    """One rank of the tests below: a real gloo group of two processes, each driving its own timer as the
    Trainer does; ``compiling_rank`` compiles at every step (a scripted compile clock: a real one needs a real
    compile)."""
    import types

    import torch
    import torch.distributed as dist
    from transformers import TrainerControl, TrainerState

    from autotune.runner._step_timer import StepTimer

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        settings = MeasureSettings(
            warmup_steps=1, min_steps=1, max_steps=budgets[rank], max_seconds=1e9, cv_target=-1.0, recompile_limit=1
        )
        clock = ScriptedCompileClock(set(range(1, 100)) if rank == compiling_rank else set())
        timer = StepTimer(settings, synchronize=lambda: None, compile_clock=clock)
        args = types.SimpleNamespace(device=torch.device("cpu"))  # what the timer reads of TrainingArguments
        control, state = TrainerControl(), TrainerState()
        while not control.should_training_stop and state.global_step < 20:
            timer.on_step_begin(args, state, control)
            state.global_step += 1
            control = timer.on_step_end(args, state, control)
        with open(f"{out}{rank}", "w") as file:
            file.write(f"{state.global_step} {timer.still_compiling}")
    finally:
        dist.destroy_process_group()


def _two_ranks(tmp_path, budgets: tuple[int, int], compiling_rank: int = -1) -> list[str]:
    import torch.multiprocessing as mp

    tmp_path.mkdir(parents=True, exist_ok=True)
    store, out = str(tmp_path / "store"), str(tmp_path / "rank")
    mp.start_processes(_rank_stops, args=(store, budgets, out, compiling_rank), nprocs=2, start_method="spawn")
    return [(tmp_path / f"rank{rank}").read_text() for rank in (0, 1)]


@pytest.mark.slow
def test_the_ranks_of_a_trial_stop_at_the_same_step_for_the_same_reason(tmp_path):
    """Each rank's measurement ends at its own step; a rank that left the loop alone ran the Trainer's closing
    collectives against the others' next step, and gloo aborted the trial. Two real ranks whose budgets differ
    (2 and 5 measured steps) both stop at the first one's; where one rank keeps compiling, both stop as still
    compiling (the trial then skips the fullest batch's step on every rank, not on one)."""
    assert _two_ranks(tmp_path / "budgets", (2, 5)) == ["3 False", "3 False"]  # a warm-up step and 2 measured
    assert _two_ranks(tmp_path / "compiling", (10, 10), compiling_rank=1) == ["3 True", "3 True"]


def test_every_step_is_timed_after_synchronising():
    from autotune.runner._step_timer import StepTimer

    calls = []
    timer = StepTimer(MeasureSettings(warmup_steps=1, min_steps=2, max_steps=2), synchronize=lambda: calls.append(1))
    drive(timer, 10)
    # One synchronise before the first step starts the clock, then one at the end of each step.
    assert len(calls) == 1 + 3


def test_a_step_that_compiled_is_warmup_not_steady_state():
    from autotune.runner._step_timer import StepTimer

    # The clock is read once at construction, then once per step end: compile during step 4 (call 4).
    clock = ScriptedCompileClock(compile_at_calls={4})
    settings = MeasureSettings(warmup_steps=1, min_steps=5, max_steps=5, max_seconds=1e9, cv_target=-1.0)
    timer = StepTimer(settings, synchronize=lambda: None, compile_clock=clock)
    ran = drive(timer, 100)
    stats = timer.stats()
    assert stats.warmup_steps == 2  # the configured warm-up and the recompiling step
    assert stats.measured_steps == 5
    assert ran == 7
    assert stats.compile_s == 2.0
    assert timer.measured_step_numbers == [2, 3, 5, 6, 7]  # the Trainer's step numbers, warm-up and step 4 left out


def test_steps_that_still_compile_after_warm_up_stop_the_trial_past_the_recompile_limit():
    """Dynamo's automatic dynamic shapes compile once more when a size first changes: that step (and
    up to ``recompile_limit`` such) is left out as today. One more compiling step after warm-up is a
    batch of a new shape compiling at every step (issue 38, 10): the trial stops there, and says so."""
    from autotune.runner._step_timer import StepTimer

    settings = MeasureSettings(warmup_steps=1, min_steps=5, max_steps=40, max_seconds=1e9, cv_target=-1.0)
    # Calls 1, 2, ...: the end of steps 1, 2, ...; every step compiles (packing, a new length each batch).
    every_step = StepTimer(settings, lambda: None, compile_clock=ScriptedCompileClock(set(range(1, 100))))
    assert drive(every_step, 100) == 1 + settings.recompile_limit + 1  # warm-up, the allowed, the one over
    assert every_step.still_compiling and every_step.recompiled_steps == settings.recompile_limit + 1
    assert every_step.stats().measured_steps == 0
    # Compiling during warm-up and at the limit's count of later steps: measured to the end.
    within = StepTimer(settings, lambda: None, compile_clock=ScriptedCompileClock({1, 3, 6}))
    assert drive(within, 100) == 1 + 2 + 40
    assert not within.still_compiling and within.recompiled_steps == 2


def test_dynamo_compile_clock_advances_on_a_real_compile():
    import torch

    from autotune.runner._step_timer import dynamo_compile_seconds

    before = dynamo_compile_seconds()
    compiled = torch.compile(lambda x: x.sin() + 1, backend="eager")  # dynamo only: fast, no C++ build
    compiled(torch.ones(3))
    after_first = dynamo_compile_seconds()
    compiled(torch.ones(3))
    assert after_first > before
    assert dynamo_compile_seconds() == after_first  # a cached graph compiles nothing


@pytest.mark.slow  # trains a real model
def test_timer_in_a_real_trainer_counts_optimizer_steps_not_micro_batches(bert_tiny, tmp_path):
    """With gradient accumulation 2, a Trainer of 2 + 3 optimizer steps gives the timer 5 steps."""
    import torch
    from transformers import Trainer, TrainerState, TrainingArguments

    from autotune.runner._step_timer import StepTimer
    from autotune.spec.models import build_model

    settings = MeasureSettings(warmup_steps=2, min_steps=3, max_steps=3, max_seconds=1e9, cv_target=-1.0)
    timer = StepTimer(settings, synchronize=lambda: None)
    model = build_model(bert_tiny.hf_config, bert_tiny.task)
    ids = torch.randint(0, bert_tiny.vocab_size, (40, 16), generator=torch.Generator().manual_seed(0))
    data = [
        {"input_ids": row, "attention_mask": torch.ones_like(row), "labels": torch.tensor(i % 2)}
        for i, row in enumerate(ids)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=settings.total_steps_cap + 5,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[timer])
    trainer.train()
    assert isinstance(trainer.state, TrainerState)
    assert trainer.state.global_step == 2 + 3  # the timer stopped training once its budget was spent
    assert len(timer.warmup_times) == 2 and len(timer.step_times) == 3
    assert timer.first_step_started_at is not None
    assert all(t > 0 for t in timer.step_times)
