"""A fast config that does not train is not a winner: real trials record their loss, the steps a real
grad scaler skipped, and real divergences (tests/faults.py) end as ``diverged``, never ranked or exported."""

from __future__ import annotations

import dataclasses
import math

import pytest
from optuna.trial import TrialState

from autotune.levers import TrialConfig
from autotune.result import TrialResult, winner_loss
from autotune.result._loss import LOSS_GROWTH_TOLERANCE, compare_losses, loss_grew_beyond
from autotune.runner import TrialJob, run_isolated
from autotune.spec.measure import MeasureSettings

# Eight measured steps after one warm-up step, whatever the step-time CV (a target of 0 is never met).
EIGHT_STEPS = MeasureSettings(warmup_steps=1, min_steps=8, max_steps=8, max_seconds=60.0, cv_target=0.0)
# Five steps (one warm-up) whatever the machine's load.
FIVE_STEPS = MeasureSettings(warmup_steps=1, min_steps=4, max_steps=4, max_seconds=60.0, cv_target=0.0)


def trial_job(tmp_path, tiny_workload, measure, *faults: str, base_args: dict | None = None) -> TrialJob:
    return TrialJob(
        workload=tiny_workload(
            measure=measure,
            base_args=base_args or {},
            callbacks=tuple(f"tests.support.faults:{fault}" for fault in faults),
        ),
        config=TrialConfig(micro_batch=8, pin_memory=False),
        work_dir=str(tmp_path / "trial"),
    )


def plain_trainer_losses(job: TrialJob, steps: int) -> list[float]:
    """The loss a plain Trainer logs at every step, for the same arguments, seed, model and data."""
    import torch
    from transformers import Trainer, TrainingArguments

    from autotune.levers import model_build_kwargs, training_arguments_kwargs, trial_batching
    from autotune.runner._trial import build_dataset, harness_arguments
    from autotune.spec.models import build_model

    torch.manual_seed(0)
    model = build_model(job.workload.model.hf_config, job.workload.model.task, **model_build_kwargs(job.config))
    batching = trial_batching(job.config)
    harness = {**harness_arguments(job, batching), "max_steps": steps, "logging_strategy": "steps", "logging_steps": 1}
    args = TrainingArguments(**{**training_arguments_kwargs(job.config, "cpu", job.workload.base_args), **harness})
    trainer = Trainer(model=model, args=args, train_dataset=build_dataset(job, batching))
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@pytest.mark.slow
def test_a_trial_records_the_loss_of_every_step_as_the_trainer_logs_it(tmp_path, tiny_workload):
    job = trial_job(tmp_path, tiny_workload, EIGHT_STEPS)
    result = run_isolated(job, timeout_s=300)
    assert result.status == "ok", result.error
    assert len(result.loss_curve) == 9 and result.loss_measured_from == 2  # one warm-up step, eight measured
    assert result.loss_nonfinite == [] and result.weights_finite is True and result.skipped_steps == []
    assert result.loss_first == result.loss_curve[1] and result.loss_last == result.loss_curve[-1]
    logged = plain_trainer_losses(job, steps=9)
    assert result.loss_curve == pytest.approx(logged, rel=1e-3)


@pytest.mark.slow
def test_a_nan_in_the_weights_is_diverged_though_the_trainer_filters_the_nan_loss(
    tmp_path, tiny_workload, fast_measure
):
    # logging_nan_inf_filter (on by default) replaces a NaN loss in the Trainer's running loss: the
    # weights, checked after training, still show it.
    result = run_isolated(trial_job(tmp_path, tiny_workload, fast_measure, "PoisonWeightsAtStep"), timeout_s=300)
    assert result.status == "diverged"
    assert result.error.startswith("diverged: the weights hold inf/NaN after training")
    assert result.weights_finite is False
    assert result.samples_per_s > 0  # it was measured: a diverged trial keeps its figures, unranked


@pytest.mark.slow
def test_with_the_nan_filter_off_the_nan_loss_is_recorded_at_its_step(tmp_path, tiny_workload, fast_measure):
    job = trial_job(
        tmp_path, tiny_workload, fast_measure, "PoisonWeightsAtStep", base_args={"logging_nan_inf_filter": False}
    )
    result = run_isolated(job, timeout_s=300)
    assert result.status == "diverged"
    assert result.loss_nonfinite[0] == [3, "nan"]  # PoisonWeightsAtStep fires at step 3
    assert all(math.isfinite(v) for v in result.loss_curve[:2]) and result.loss_curve[2] is None
    assert result.error.startswith("diverged: training loss nan at step 3")


@pytest.mark.slow
def test_steps_the_grad_scaler_skipped_do_not_count_as_trained_samples(tmp_path, tiny_workload):
    # A real torch.amp.GradScaler finds the injected inf at steps 5 and 6 and skips them (tests/faults.py).
    result = run_isolated(trial_job(tmp_path, tiny_workload, EIGHT_STEPS, "CpuGradScalerOverflow"), timeout_s=300)
    assert result.status == "ok", result.error
    assert result.skipped_steps == [5, 6] and result.skipped_measured_steps == 2 and result.measured_steps == 8
    # 6 of the 8 measured steps trained on their 8 samples.
    assert result.samples_per_s == pytest.approx(8 * 6 / 8 / result.step_time_median_s)


@pytest.mark.slow
def test_with_a_fused_optimizer_the_steps_the_scaler_skipped_are_found_by_its_scale(tmp_path, tiny_workload):
    # A fused AdamW takes the scaler's found_inf and skips inside its kernel; GradScaler.step still calls
    # its step(), so accelerate's step_was_skipped stays False (accelerate#4242). The scale dropping says so.
    job = trial_job(tmp_path, tiny_workload, EIGHT_STEPS, "CpuGradScalerOverflow")
    job = dataclasses.replace(job, config=dataclasses.replace(job.config, optim="adamw_torch_fused"))
    result = run_isolated(job, timeout_s=300)
    assert result.status == "ok", result.error
    assert result.skipped_steps == [5, 6] and result.skipped_measured_steps == 2


@pytest.mark.slow
def test_a_scaler_that_skips_every_step_is_diverged(tmp_path, tiny_workload, fast_measure):
    result = run_isolated(
        trial_job(tmp_path, tiny_workload, fast_measure, "CpuGradScalerOverflowEveryStep"), timeout_s=300
    )
    assert result.status == "diverged"
    assert (
        result.error
        == f"diverged: the fp16 grad scaler skipped all {result.measured_steps} measured optimizer steps (nothing trained)"
    )
    assert result.samples_per_s == 0.0


def test_the_tolerance_flags_growth_beyond_the_default_and_never_a_faster_fall():
    default = [0.70] * 10
    within = [0.70] + [0.70 * (1 + LOSS_GROWTH_TOLERANCE - 0.01)] * 9
    beyond = [0.70] + [0.70 * (1 + LOSS_GROWTH_TOLERANCE + 0.01)] * 9
    lower = [0.70] + [0.10] * 9
    assert loss_grew_beyond(compare_losses(within, default)) is None
    assert loss_grew_beyond(compare_losses(lower, default)) is None
    reason = loss_grew_beyond(compare_losses(beyond, default))
    assert reason is not None
    assert reason.startswith(
        "diverged: training loss 0.7 at step 1 -> 0.882 at steps 6-10, the HF default's 0.7 -> 0.7 (+26%"
    )
    # A loss the Trainer reports doubled from step 1 on (accumulation 2 of a model that ignores
    # num_items_in_batch) moves as the default's: it agrees.
    assert compare_losses([1.40] * 10, default).agree
    # Steps are matched by number, non-finite ones left out.
    comparison = compare_losses([0.70, None, 0.70, 0.69], default)
    assert comparison is not None and comparison.steps == [1, 3, 4] and comparison.agree
    assert compare_losses(default[:2], default) is None  # too few shared steps to compare


def open_runaway_study(storage_url: str, work_root: str, bert_tiny, cpu):
    """A study of two configs: the HF default's micro-batch 8 trains normally; micro-batch 16 trains
    with its learning rate raised 10^6-fold (tests/faults.py HugeLearningRateUnlessMicroBatch8)."""
    from autotune.runner import Workload
    from autotune.space import SearchSpace
    from autotune.storage import open_storage
    from autotune.study import SearchRequest, open_study

    request = SearchRequest(
        workload=Workload.for_model(
            bert_tiny,
            device=cpu,
            seq_len=32,
            ceiling_bytes=8 * 1024**3,
            measure=FIVE_STEPS,
            callbacks=("tests.support.faults:HugeLearningRateUnlessMicroBatch8",),
        ),
        space=SearchSpace(choices={"micro_batch": [8, 16], "pin_memory": [False]}),
        work_root=work_root,
        screen=False,
        prune_ratio=0.0,
    )
    return open_study(open_storage(storage_url), "runaway", request), request


@pytest.fixture(scope="module")
def runaway_run_in_order(tmp_path_factory, bert_tiny, cpu):
    """The runaway study after its two trials ran in the search's order: the HF default (a seed)
    first, then the runaway. Read by the tests of the ranking, the export and the summary."""
    from autotune.study import SearchProgress
    from autotune.study._loop import run_one_trial

    root = tmp_path_factory.mktemp("runaway")
    study, request = open_runaway_study(f"sqlite:///{root / 'study.db'}", str(root / "runs"), bert_tiny, cpu)
    for _ in range(2):
        run_one_trial(study, request, SearchProgress())
    return study


@pytest.mark.slow
def test_a_runaway_loss_is_diverged_never_ranked_never_exported(runaway_run_in_order, tmp_path):
    from autotune.spec.files import Destination
    from autotune.storage.schema import SEED_HF_DEFAULT as HF_DEFAULT
    from autotune.storage.schema import TRIAL_SEED as SEED_ATTR
    from autotune.views.export import export_winner
    from autotune.views.ranking import study_ranking

    study = runaway_run_in_order
    default, runaway = study.get_trials()
    assert default.user_attrs[SEED_ATTR] == HF_DEFAULT and default.params["micro_batch"] == 8
    assert TrialResult.from_trial(default).status == "ok"
    result = TrialResult.from_trial(runaway)
    assert runaway.params["micro_batch"] == 16
    assert result.status == "diverged" and result.error.startswith("diverged: "), result.error
    # Recorded like an infeasible config: COMPLETE, value 0, a violated constraint; the sampler avoids it.
    assert runaway.state == TrialState.COMPLETE and runaway.value == 0.0 and runaway.system_attrs["constraints"][0] > 0
    assert [r.number for r in study_ranking(study)] == [default.number]
    assert export_winner(study, "json", Destination(str(tmp_path / "best.json"))).number == default.number
    assert study.best_trial.number == default.number


@pytest.mark.slow
def test_a_trial_told_before_the_default_ran_is_judged_in_the_ranking(tmp_path, sqlite_url, bert_tiny, cpu):
    from autotune.study import SearchProgress
    from autotune.study._loop import ask_trial, run_one_trial
    from autotune.views.ranking import study_ranking

    study, request = open_runaway_study(sqlite_url, str(tmp_path / "runs"), bert_tiny, cpu)
    default_trial, runaway_trial = ask_trial(study, request), ask_trial(study, request)
    run_one_trial(study, request, SearchProgress(), trial=runaway_trial)  # no reference yet
    run_one_trial(study, request, SearchProgress(), trial=default_trial)
    runaway = TrialResult.from_trial(study.get_trials()[runaway_trial.number])
    if runaway.status == "ok":  # finite, so it was told before any reference could judge it
        assert runaway.loss_curve and max(v for v in runaway.measured_losses if v is not None) > 1.0
    assert [r.number for r in study_ranking(study)] == [default_trial.number]


@pytest.mark.slow
def test_the_summary_says_in_words_whether_the_winner_trains_as_the_default(runaway_run_in_order, capsys):
    from rich.console import Console

    from autotune.views.search_display import print_winner_loss

    study = runaway_run_in_order
    default, runaway = study.get_trials()
    own = winner_loss(study.get_trials(), default.number, TrialResult.from_trial(default))
    assert own.describe().startswith(
        f"training loss: the winner is the HF default trial #{default.number} itself (first "
    )
    print_winner_loss(Console(width=200), study)  # the search's closing summary
    printed = " ".join(capsys.readouterr().out.split())
    assert own.describe() in printed
    if TrialResult.from_trial(runaway).samples_per_s > TrialResult.from_trial(default).samples_per_s:
        assert f"not ranked: #{runaway.number} ran at " in printed and "but does not train (diverged: " in printed
    # Were the runaway trial the winner, the comparison would say they disagree, with both figures.
    result = TrialResult.from_trial(runaway)
    if result.loss_nonfinite or result.weights_finite is False:
        pytest.skip("the runaway trial went non-finite on this machine: no finite curve to compare")
    against = winner_loss(study.get_trials(), runaway.number, result)
    text = against.describe()
    assert text.startswith(
        f"training loss, winner #{runaway.number} vs HF default #{default.number}: the losses disagree: "
    )
    assert f"beyond the +{LOSS_GROWTH_TOLERANCE:.0%} tolerance" in text
    assert against.curve_text().startswith("loss by step (winner / HF default): ")


@pytest.mark.slow
def test_the_closing_summary_shows_the_winners_loss_beside_the_defaults(searched_study):
    from autotune.result._loss import hf_default_result
    from autotune.storage import load_study
    from autotune.views.ranking import study_ranking

    study = load_study(searched_study.storage, searched_study.study_name)
    best = study_ranking(study)[0]
    loss = winner_loss(study.get_trials(), best.number, best.result)
    stdout = " ".join(searched_study.search.stdout.split())
    assert loss.describe() in stdout
    assert hf_default_result(study.get_trials()) is not None
    if loss.comparison is not None:  # a winner other than the default: both curves, and a verdict
        assert "the losses agree" in loss.describe() and loss.curve_text() in stdout


def test_judge_against_default_makes_only_an_ok_trial_whose_loss_ran_away_diverged():
    import dataclasses

    from autotune.result import judge_against_default

    default = TrialResult(status="ok", samples_per_s=10.0, loss_curve=[0.70] * 10, loss_measured_from=2)
    runaway = TrialResult(status="ok", samples_per_s=20.0, loss_curve=[0.70] + [7.0] * 9, loss_measured_from=2)
    judged = judge_against_default(runaway, default)
    assert judged.status == "diverged"
    assert judged.error.startswith(
        "diverged: training loss 0.7 at step 1 -> 7 at steps 6-10, the HF default's 0.7 -> 0.7"
    )
    assert judged.samples_per_s == 20.0 and runaway.status == "ok"  # its figures kept; the result given is unchanged
    healthy = TrialResult(status="ok", loss_curve=[0.70] + [0.60] * 9, loss_measured_from=2)
    assert judge_against_default(healthy, default) is healthy
    assert judge_against_default(runaway, None) is runaway  # the default has not run: nothing to judge against
    assert judge_against_default(default, default) is default  # the default is never judged against itself
    oom = dataclasses.replace(runaway, status="oom")
    assert judge_against_default(oom, default) is oom  # only a trial that ran ("ok") can be diverged
