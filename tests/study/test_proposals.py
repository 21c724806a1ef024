"""Distinct proposals, the end of a finite space, and --patience (autotune.study._proposals in the real loop).

The loop tests drive the real study loop (``run_search``: ask, screening, tell, Optuna's storage
and samplers) with a lookup table as the trial runner, as ``benchmarks/bench_search`` does: they
test which configs the loop asks for and when it stops, not what a trial measures. A real search
with real children is in ``test_exhaust_cli`` below.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.levers import TrialConfig
from autotune.result import TrialResult, came_back_counts
from autotune.runner import TrialJob, Workload
from autotune.space import load_space
from autotune.storage import open_storage
from autotune.storage.schema import TRIAL_PROPOSED_AGAIN as CAME_BACK_ATTR
from autotune.study import SearchBudget, SearchRequest, open_study
from autotune.study._loop import START, cap_decision, run_search
from autotune.study._proposals import (
    noise_fraction,
    stop_reason,
    trials_since_improvement,
)
from autotune.views.ranking import describe_distinct
from tests.support.cli import FAST_SEARCH_ARGS, run_cli_in_process

GiB = 1024**3
FOUR_CONFIGS = 'micro_batch: [8]\ngrad_accum: [1]\ncheckpointing: [false]\ndtype: [bf16, fp32]\noptim: [adamw_torch]\npin_memory: [false]\ncompile: ["off", inductor]\n'
# 48 configs: enough for TPE's model to take over after its random start-up trials.
FORTY_EIGHT_CONFIGS = (
    "micro_batch: [8, 16, 32]\ngrad_accum: [1, 2]\ncheckpointing: [false, true]\ndtype: [fp32, bf16]\n"
    "optim: [adamw_torch, adafactor]\npin_memory: [false]\n"
)


class LookupRunner:
    """``run_isolated``'s signature, answered from a function of the config; records what it ran."""

    def __init__(self, samples_per_s: Callable[[TrialConfig], float], step_time_cv: float = 0.02) -> None:
        self.samples_per_s = samples_per_s
        self.step_time_cv = step_time_cv
        self.ran: list[TrialConfig] = []

    def __call__(self, job: TrialJob, timeout_s: float, on_tick: Callable[[], None] | None = None) -> TrialResult:
        self.ran.append(job.config)
        speed = self.samples_per_s(job.config)
        return TrialResult(
            status="ok",
            samples_per_s=speed,
            model_tflops=speed / 100,
            peak_memory_bytes=GiB // 2,
            ceiling_bytes=job.workload.ceiling_bytes,
            step_time_cv=self.step_time_cv,
            measured_steps=4,
        )


def make_request(tmp_path: Path, cpu, bert_tiny, space_text: str) -> SearchRequest:
    space_file = tmp_path / "space.yaml"
    space_file.write_text(space_text)
    space = load_space(str(space_file), cpu)
    # No screening and no early stop: the lookup's figures are the whole story.
    return SearchRequest(
        workload=Workload.for_model(bert_tiny, device=cpu, seq_len=32, ceiling_bytes=2 * GiB),
        space=space,
        work_root=str(tmp_path / "runs"),
        screen=False,
        prune_ratio=0.0,
    )


def speed_of(config: TrialConfig, fast_dtype: str = "bf16") -> float:
    """A structured landscape: ``fast_dtype``, adafactor and bigger batches are faster."""
    return (
        10.0
        * config.micro_batch**0.5
        * (1.3 if config.dtype == fast_dtype else 1.0)
        * (1.1 if config.optim == "adafactor" else 1.0)
        / config.grad_accum**0.1
    )


def test_four_configs_four_trials_measure_all_four(tmp_path, cpu, bert_tiny):
    request = make_request(tmp_path, cpu, bert_tiny, FOUR_CONFIGS)
    assert request.space.size == 4
    study = open_study(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "four", request, sampler_seed=0)
    runner = LookupRunner(speed_of)
    done = run_search(study, request, SearchBudget(trials=4), run_trial=runner)
    assert done == 4
    assert len(set(runner.ran)) == 4  # bf16 with inductor included: every config of the space
    assert {(c.dtype, c.compile) for c in runner.ran} == {
        ("bf16", "off"),
        ("bf16", "inductor"),
        ("fp32", "off"),
        ("fp32", "inductor"),
    }
    reason = stop_reason(study, request.space.size, None)
    assert reason is not None and "every config of the space has been measured or screened (4 of 4)" in reason
    # Asked for more, the search says it is done and runs nothing.
    assert run_search(study, request, SearchBudget(trials=3), run_trial=runner) == 0
    assert len(runner.ran) == 4
    # A queued trial (a dead worker's re-run) is still popped and answered from the record: none is left waiting.
    study.enqueue_trial(study.trials[0].params)
    assert stop_reason(study, request.space.size, None) is None
    assert run_search(study, request, SearchBudget(trials=3), run_trial=runner) == 0
    assert len(runner.ran) == 4 and not study.get_trials(states=(TrialState.WAITING,))
    assert study.trials[-1].user_attrs["reused_from"] == study.trials[0].number


def test_every_proposal_is_a_new_config_until_the_space_is_done(tmp_path, cpu, bert_tiny):
    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "all", request, sampler_seed=1)
    runner = LookupRunner(speed_of)
    done = run_search(study, request, SearchBudget(trials=60), run_trial=runner)
    # TPE's model proposes the untaken configs, then the last ones are enumerated: 48 trials, 48 configs.
    assert done == 48 and len(set(runner.ran)) == 48
    budget = [t for t in study.trials if "reused_from" not in t.user_attrs and t.state == TrialState.COMPLETE]
    assert len(budget) == 48
    assert "48 trials measured or screened 48 distinct configs" in describe_distinct(study.trials)


def test_the_model_finds_the_best_config_before_random_order_would(tmp_path, cpu, bert_tiny):
    """On a structured landscape the model's proposals reach the best config early, not by chance.

    The landscape agrees with the machine on the dtype, as a real one does: bf16 is the faster one only
    where the CPU multiplies it in hardware. On a CPU that emulates it (AVX2 only: seen with
    scripts/as_avx2_cpu.sh) the throughput prior rightly expects bf16 many times slower, and a landscape
    where it was faster anyway had the search reach the best config at position 25 of 48 for every seed.
    """
    fast_dtype = "bf16" if cpu.has_matmul_hardware("bf16") else "fp32"

    def speed(config: TrialConfig) -> float:
        return speed_of(config, fast_dtype)

    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    best = max(
        (TrialConfig.from_params(dict(zip(request.space.choices, v))) for v in _product(request.space.choices)),
        key=speed,
    )
    positions = []
    for seed in range(3):
        study = open_study(optuna.storages.InMemoryStorage(), f"s{seed}", request, sampler_seed=seed)
        for _ in study.get_trials(states=(TrialState.WAITING,)):
            study.tell(study.ask(), state=TrialState.FAIL)  # take the seed trials off the queue: the sampler alone
        runner = LookupRunner(speed)
        run_search(study, request, SearchBudget(trials=48), run_trial=runner)
        positions.append(runner.ran.index(best) + 1)
    # Random order finds one given config of 48 at position 24.5 on average.
    assert sorted(positions)[1] <= 16, positions


def _product(choices: dict) -> list[tuple]:
    import itertools

    return list(itertools.product(*choices.values()))


def test_a_repeat_is_answered_from_the_record_and_is_not_a_trial(tmp_path, cpu, bert_tiny):
    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "repeat", request, sampler_seed=2)
    runner = LookupRunner(speed_of)
    run_search(study, request, SearchBudget(trials=3), run_trial=runner)
    first = study.trials[0]
    study.enqueue_trial(first.params)  # a proposal that repeats trial 0's config
    assert run_search(study, request, SearchBudget(trials=1), run_trial=runner) == 1
    assert len(runner.ran) == 4 and len(set(runner.ran)) == 4  # the repeat ran nothing; a new config did
    repeat = [t for t in study.trials if "reused_from" in t.user_attrs]
    assert [t.user_attrs["reused_from"] for t in repeat] == [first.number]
    assert repeat[0].value == first.value
    assert came_back_counts(study.trials)[first.number] == 1
    # The study-wide cap does not count it either: 4 trials of a cap of 5 leave room for one more.
    assert cap_decision(study.trials, 5, 60.0, datetime.datetime.now()) == START


def test_sampler_records_when_it_came_back_to_a_measured_config(tmp_path, cpu, bert_tiny):
    # One knob that matters and 3 configs: past the start-up trials, TPE's best candidate is the
    # measured fastest config; the sampler turns to the untaken one and says where it came from.
    space = "micro_batch: [8, 16, 32, 64]\ngrad_accum: [1, 2]\ncheckpointing: [false]\ndtype: [fp32]\noptim: [adamw_torch]\npin_memory: [false]\n"
    request = make_request(tmp_path, cpu, bert_tiny, space)
    study = open_study(optuna.storages.InMemoryStorage(), "back", request, sampler_seed=3)
    runner = LookupRunner(speed_of)
    run_search(study, request, SearchBudget(trials=8), run_trial=runner)
    assert len(set(runner.ran)) == 8
    noted = [t.user_attrs[CAME_BACK_ATTR] for t in study.trials if CAME_BACK_ATTR in t.user_attrs]
    assert noted, "TPE never preferred a measured config on a space it had nearly exhausted"
    measured_numbers = {t.number for t in study.trials if t.state == TrialState.COMPLETE}
    assert set(noted) <= measured_numbers


# --- patience ---------------------------------------------------------------------------------------


def frozen(number: int, tflops: float | None, cv: float = 0.02, status: str = "ok") -> optuna.trial.FrozenTrial:
    result = TrialResult(
        status=status,
        samples_per_s=(tflops or 0.0) * 100,
        model_tflops=tflops or 0.0,
        step_time_cv=cv,
        peak_memory_bytes=GiB,
        ceiling_bytes=2 * GiB,
    )
    trial = optuna.trial.create_trial(
        params={"micro_batch": 8 + number},
        distributions={"micro_batch": optuna.distributions.IntDistribution(1, 1000)},
        value=tflops or 0.0,
        user_attrs={"result": result.to_dict(), "status": status},
    )
    trial.number = number
    return trial


def test_gains_within_the_noise_do_not_reset_patience():
    trials = [frozen(0, 1.00), frozen(1, 1.03), frozen(2, 1.20), frozen(3, 1.21), frozen(4, 0.5)]
    assert trials_since_improvement(trials, noise=0.05) == 2  # 1.21 is within 5 % of 1.20: a tie
    assert trials_since_improvement(trials, noise=0.0) == 1
    oom = [frozen(0, None, status="oom"), frozen(1, None, status="oom")]
    assert trials_since_improvement(oom, noise=0.05) == 2  # nothing fits: none raised the best


def test_noise_is_the_confirmation_cv_else_the_step_time_cv(tmp_path, cpu, bert_tiny):
    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(optuna.storages.InMemoryStorage(), "noise", request, sampler_seed=0)
    run_search(study, request, SearchBudget(trials=3), run_trial=LookupRunner(speed_of, step_time_cv=0.07))
    assert noise_fraction(study) == pytest.approx(0.07)
    study.set_user_attr("confirmation", {"trials": {"0": {"cv": 0.11, "repeats": 3}, "1": {"cv": 0.13, "repeats": 3}}})
    assert noise_fraction(study) == pytest.approx(0.12)


def test_patience_stops_a_search_that_no_longer_improves(tmp_path, cpu, bert_tiny):
    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(optuna.storages.InMemoryStorage(), "flat", request, sampler_seed=0)
    # A flat landscape: every config within 1 % of the others, the step-time noise 2 %.
    runner = LookupRunner(lambda c: 50.0 + (c.micro_batch % 3) * 0.1)
    done = run_search(study, request, SearchBudget(trials=30, patience=5), run_trial=runner)
    assert done == 6  # the first trial sets the best; 5 in a row tie with it
    reason = stop_reason(study, request.space.size, 5)
    assert reason is not None and reason.startswith("patience: 5 trials in a row") and "(2.0%)" in reason
    # Without patience the same search runs its budget.
    study = open_study(optuna.storages.InMemoryStorage(), "flat2", request, sampler_seed=0)
    assert run_search(study, request, SearchBudget(trials=10), run_trial=runner) == 10


def test_patience_must_be_positive(tmp_path):
    result = run_cli_in_process("search", "--model", "bert-tiny", "--device", "cpu", "--patience", "0", cwd=tmp_path)
    assert result.returncode != 0
    assert "autotune: error: --patience 0" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_exhaust_cli(tmp_path):
    """A real search (real children) of a 4-config space with --trials 5: the 4 configs are
    measured once each, and the search says it is done."""
    space = tmp_path / "four.yaml"
    space.write_text(
        "micro_batch: [8]\ngrad_accum: [1]\ncheckpointing: [false]\ndtype: [bf16, fp32]\noptim: [adamw_torch, adafactor]\npin_memory: [false]\n"
    )
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    result = run_cli_in_process(
        "search",
        "--model",
        "bert-tiny",
        "--device",
        "cpu",
        "--space",
        str(space),
        "--storage",
        storage,
        *FAST_SEARCH_ARGS,
        "--trials",
        "5",
        "--prune-ratio",
        "0",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    study = optuna.load_study(study_name="bert-tiny-cpu-s32", storage=storage)
    measured = [t for t in study.trials if t.state == TrialState.COMPLETE and "reused_from" not in t.user_attrs]
    assert len(measured) == 4 and len({tuple(sorted(t.params.items())) for t in measured}) == 4
    assert "search done: every config of the space has been measured or screened (4 of 4)" in result.stdout
    assert "4 trials measured or screened 4 distinct configs" in result.stdout
    shown = run_cli_in_process("best", "--storage", storage, "--all", cwd=tmp_path)
    assert shown.returncode == 0 and "4 distinct configs" in shown.stdout


def test_workers_start_no_trial_once_patience_is_spent(tmp_path, cpu, bert_tiny):
    """The stop rule is the ask's (autotune.study.ask_trial), the one place every worker passes."""
    from autotune.study._loop import ask_trial
    from autotune.study._proposals import SearchFinished

    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(optuna.storages.InMemoryStorage(), "pool", request, sampler_seed=0)
    run_search(study, request, SearchBudget(trials=5), run_trial=LookupRunner(lambda c: 50.0))  # all ties

    with pytest.raises(SearchFinished):
        ask_trial(study, request, 4)  # 4 ties in a row after the first trial
    assert ask_trial(study, request, 5) is not None
    assert ask_trial(study, request, None) is not None


def test_dashboard_note_says_how_often_the_sampler_came_back(tmp_path, cpu, bert_tiny):
    from autotune.views.dashboard import study_note

    request = make_request(tmp_path, cpu, bert_tiny, FORTY_EIGHT_CONFIGS)
    study = open_study(optuna.storages.InMemoryStorage(), "note", request, sampler_seed=0)
    run_search(study, request, SearchBudget(trials=2), run_trial=LookupRunner(speed_of))
    study.enqueue_trial(study.trials[0].params)
    run_search(study, request, SearchBudget(trials=1), run_trial=LookupRunner(speed_of))
    note = study_note(study)
    assert "3 trials measured or screened 3 distinct configs" in note
    # The queued repeat of #0 (and any measured config TPE preferred before it was turned elsewhere).
    assert "the sampler came back to a measured config" in note and "#0 x1" in note


def test_every_trial_the_sampler_proposes_has_the_global_batch(tmp_path, cpu, tiny_workload, sqlite_url):
    """The real TPE sampler, past its random start-up, over a real storage: only products of 48."""
    import random

    space_file = tmp_path / "space.yaml"
    space_file.write_text(
        "micro_batch: [4, 8, 16, 24, 32, 64, 128]\ngrad_accum: [1, 2]\ndtype: [fp32, bf16]\ncheckpointing: [false, true]\n"
    )
    space = load_space(str(space_file), cpu, global_batch=48)
    study = open_study(
        open_storage(sqlite_url), "gb", SearchRequest(workload=tiny_workload(ceiling_bytes=2**30), space=space)
    )
    rng = random.Random(0)
    products = set()
    for _ in range(20):
        trial = study.ask(space.distributions())
        config = TrialConfig.from_params(trial.params)
        products.add(config.global_batch)
        study.tell(trial, rng.random())  # a throughput-like value: the sampler's input, not a measurement
    assert products == {48}
    assert len({t.params["micro_batch"] for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))}) > 1


def test_the_search_never_proposes_a_pair_that_cannot_train(tmp_path, cpu, bert_tiny):
    """fp32 autocast beside bf16 weights: the space searches both, the sampler leaves out their pair,
    and the space is done once the six configs that train are measured."""
    space = (
        "micro_batch: [8]\ngrad_accum: [1]\ncheckpointing: [false, true]\ndtype: [bf16, fp32]\n"
        "weight_dtype: [fp32, bf16]\noptim: [adamw_torch]\npin_memory: [false]\n"
    )
    request = make_request(tmp_path, cpu, bert_tiny, space)
    assert request.space.size == 6
    study = open_study(open_storage(f"sqlite:///{tmp_path / 's.db'}"), "pairs", request, sampler_seed=0)
    runner = LookupRunner(speed_of)
    assert run_search(study, request, SearchBudget(trials=10), run_trial=runner) == 6
    ran = {(c.checkpointing, c.dtype, c.weight_dtype) for c in runner.ran}
    assert len(ran) == 6 and not any(dtype == "fp32" and weights == "bf16" for _, dtype, weights in ran)
    reason = stop_reason(study, request.space.size, None)
    assert reason is not None and "(6 of 6)" in reason
