"""What the trial child reads of its training numerics (autotune.runner._loss_recorder): finite weights, and
the loss per sample at any accumulation (real trials of a classification head and a causal LM). The loss of
every step and the steps a real grad scaler skipped, recorded by real trials: tests/result/test_loss.py."""

from __future__ import annotations

import pytest
import torch

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, run_isolated
from autotune.runner._loss_recorder import weights_are_finite
from autotune.spec.measure import MeasureSettings


def test_finite_weights_are_finite():

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    assert weights_are_finite(model)
    assert weights_are_finite(torch.nn.ReLU())  # no parameters at all


def test_one_nan_or_inf_anywhere_in_the_weights_is_found():

    for poison in (float("nan"), float("inf"), float("-inf")):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        with torch.no_grad():
            model[1].bias[1] = poison
        assert not weights_are_finite(model), poison


def test_half_precision_weights_are_summed_without_overflowing():

    # 4096 weights of 60000 each sum to 2.5e8, far past fp16's largest value (65504): summed in fp16
    # they would read as inf; the check sums in fp32.
    model = torch.nn.Linear(64, 64, bias=False).to(torch.float16)
    with torch.no_grad():
        model.weight.fill_(60000.0)
    assert weights_are_finite(model)
    assert torch.isinf(model.weight.sum())  # what an fp16 sum would have said


# --- accumulation: the Trainer's loss per sample, whatever the accumulation steps ------------------

# Three steps, the first measured (no warm-up): step 1 trains the same 8 samples from the same weights
# in every config, so its loss per sample is the same at any accumulation.
THREE_STEPS = MeasureSettings(warmup_steps=0, min_steps=3, max_steps=3, max_seconds=60.0, cv_target=0.0)


def _trained(tmp_path, tiny_workload, model, micro_batch: int, grad_accum: int):
    job = TrialJob(
        workload=tiny_workload(model=model, measure=THREE_STEPS),
        config=TrialConfig(micro_batch=micro_batch, grad_accum=grad_accum, pin_memory=False),
        work_dir=str(tmp_path / f"{model.name}-{micro_batch}x{grad_accum}"),
    )
    result = run_isolated(job, timeout_s=300)
    assert result.status == "ok", result.error
    return result


@pytest.mark.slow
def test_a_classification_head_that_ignores_num_items_in_batch_is_flagged_and_its_loss_shown_per_sample(
    tmp_path, tiny_workload, bert_tiny
):
    # BertForSequenceClassification takes **kwargs but computes its own mean loss: at accumulation 2
    # the Trainer adds up two micro-batch means (transformers 5 trainer.py, training_step), so its
    # loss and gradients are twice the per-sample ones (about 1.39 against 0.69 at step 1).
    whole = _trained(tmp_path, tiny_workload, bert_tiny, micro_batch=8, grad_accum=1)
    halves = _trained(tmp_path, tiny_workload, bert_tiny, micro_batch=4, grad_accum=2)
    assert halves.loss_curve[0] == pytest.approx(whole.loss_curve[0], rel=0.1)  # per sample at both
    assert whole.gradient_scale == 1 and halves.gradient_scale == 2


@pytest.mark.slow
def test_a_causal_lm_normalised_over_the_step_is_not_flagged(tmp_path, tiny_workload, gpt2_tiny):
    # GPT2LMHeadModel's loss_function divides by num_items_in_batch: already per token over the step.
    whole = _trained(tmp_path, tiny_workload, gpt2_tiny, micro_batch=8, grad_accum=1)
    halves = _trained(tmp_path, tiny_workload, gpt2_tiny, micro_batch=4, grad_accum=2)
    assert whole.gradient_scale == 1 and halves.gradient_scale == 1
    assert halves.loss_curve[0] == pytest.approx(whole.loss_curve[0], rel=0.1)
