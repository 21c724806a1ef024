"""A mixture of experts searched end to end on the CPU: a small Qwen3-MoE (16 experts, top 4: tests/support/moe.py)
trains through the real Trainer in each trial child; the recorded model TFLOPs count the experts each token is
routed to, and the memory prior's prediction at proposal lands near the measured peak."""

from __future__ import annotations

import optuna
import pytest

from autotune.spec.flops import model_flops_per_token
from autotune.spec.models import resolve_model
from autotune.storage import schema
from tests.support.cli import search_a_model_directory
from tests.support.moe import write_tiny_moe

pytestmark = pytest.mark.slow

SEQ = 32  # FAST_SEARCH_ARGS' --seq-len


def test_a_mixture_of_experts_trains_and_its_model_flops_are_the_routed_experts(tmp_path):
    model = write_tiny_moe(tmp_path / "qwen3-moe-tiny", "qwen3_moe", layers=4)
    space = "micro_batch: [4, 16]\ndtype: [fp32]\noptim: [adamw_torch_fused]\n"
    searched, storage = search_a_model_directory(tmp_path, model, space, trials=2, study="moe")
    assert searched.returncode == 0, searched.stdout[-3000:] + searched.stderr[-3000:]
    said = " ".join(searched.stdout.split())
    assert "is a mixture of experts: a token passes through 4 of 16 experts," in said, said[:2000]
    spec = resolve_model(str(model))
    assert spec.experts is not None
    per_sample = SEQ * model_flops_per_token(spec, SEQ)
    trials = [t for t in optuna.load_study(study_name="moe", storage=storage).trials if t.user_attrs.get("result")]
    measured = [t for t in trials if t.user_attrs["result"]["status"] == "ok"]
    assert len(measured) == 2, [t.user_attrs["result"]["status"] for t in trials]
    for trial in measured:
        result = trial.user_attrs["result"]
        # The ranking metric counts a token's k of E experts (every expert counted would be 2.46x it here).
        assert result["model_tflops"] == pytest.approx(result["samples_per_s"] * per_sample / 1e12, rel=1e-3)
        predicted = trial.user_attrs[schema.TRIAL_PREDICTED_PEAK_BYTES]
        assert predicted == pytest.approx(result["peak_memory_bytes"], rel=0.15), (predicted, result)
