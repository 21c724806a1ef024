"""Today's model shapes searched end to end on the CPU through the real Trainer: multimodal Gemma 3 and Mistral 3
(their vision tower built, never run by text) and a heterogeneous Gemma 4 text model (per-layer head sizes): each trial trains,
its model TFLOPs count the language model alone, and the memory prior's prediction at proposal lands near the
measured peak (tests/support/multimodal.py)."""

from __future__ import annotations

import optuna
import pytest

from autotune.spec.flops import model_flops_per_token
from autotune.spec.models import resolve_model
from autotune.storage import schema
from tests.support.cli import search_a_model_directory
from tests.support.multimodal import write_tiny_gemma3, write_tiny_gemma4_text, write_tiny_mistral3

pytestmark = pytest.mark.slow

SEQ = 32  # FAST_SEARCH_ARGS' --seq-len


@pytest.mark.parametrize(
    "write", [write_tiny_gemma3, write_tiny_mistral3, write_tiny_gemma4_text], ids=["gemma3", "mistral3", "gemma4_text"]
)
def test_a_multimodal_or_per_layer_model_trains_and_is_counted_as_its_language_model(tmp_path, write):
    model = write(tmp_path / "model")
    space = "micro_batch: [4]\ndtype: [fp32]\noptim: [adamw_torch_fused]\n"
    searched, storage = search_a_model_directory(tmp_path, model, space, trials=1, study="s")
    assert searched.returncode == 0, searched.stdout[-3000:] + searched.stderr[-3000:]
    said = " ".join(searched.stdout.split())
    multimodal = write is not write_tiny_gemma4_text
    assert ("is multimodal: its vision or audio tower (0.2 M params)" in said) == multimodal, said[:2000]
    spec = resolve_model(str(model))
    per_sample = SEQ * model_flops_per_token(spec, SEQ)
    trials = [t for t in optuna.load_study(study_name="s", storage=storage).trials if t.user_attrs.get("result")]
    assert [t.user_attrs["result"]["status"] for t in trials] == ["ok"]
    result = trials[0].user_attrs["result"]
    assert result["model_tflops"] == pytest.approx(result["samples_per_s"] * per_sample / 1e12, rel=1e-3)
    predicted = trials[0].user_attrs[schema.TRIAL_PREDICTED_PEAK_BYTES]
    assert predicted == pytest.approx(result["peak_memory_bytes"], rel=0.15), (predicted, result)
