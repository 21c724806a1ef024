"""What the trial child reads of its training numerics (autotune.runner._loss_recorder). The loss of every
step and the steps a real grad scaler skipped, recorded by real trials: tests/result/test_loss.py.

The imports are inside the tests: a child module imports transformers, which collecting this file need not."""

from __future__ import annotations


def test_finite_weights_are_finite():
    import torch

    from autotune.runner._loss_recorder import weights_are_finite

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    assert weights_are_finite(model)
    assert weights_are_finite(torch.nn.ReLU())  # no parameters at all


def test_one_nan_or_inf_anywhere_in_the_weights_is_found():
    import torch

    from autotune.runner._loss_recorder import weights_are_finite

    for poison in (float("nan"), float("inf"), float("-inf")):
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
        with torch.no_grad():
            model[1].bias[1] = poison
        assert not weights_are_finite(model), poison


def test_half_precision_weights_are_summed_without_overflowing():
    import torch

    from autotune.runner._loss_recorder import weights_are_finite

    # 4096 weights of 60000 each sum to 2.5e8, far past fp16's largest value (65504): summed in fp16
    # they would read as inf; the check sums in fp32.
    model = torch.nn.Linear(64, 64, bias=False).to(torch.float16)
    with torch.no_grad():
        model.weight.fill_(60000.0)
    assert weights_are_finite(model)
    assert torch.isinf(model.weight.sum())  # what an fp16 sum would have said
