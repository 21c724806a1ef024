"""The ``weight_dtype`` lever: the model built in bf16, its bytes, its pairing with ``dtype``, a real trial."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autotune.estimate._parts import model_state_bytes, optimizer_state_bytes
from autotune.levers import TrialConfig, memory_traits
from autotune.result import judge_against_default
from autotune.runner import TrialJob, Workload, run_isolated


def test_bf16_weights_with_adamw_cost_8_bytes_per_parameter_instead_of_16(gpt2_tiny):
    n = gpt2_tiny.num_params
    full = TrialConfig(dtype="fp32", optim="adamw_torch")
    weights, gradients, optimizer = model_state_bytes(gpt2_tiny, memory_traits(full, "cuda"))
    assert (weights, gradients, optimizer) == (4 * n, 4 * n, 8 * n)
    bf16 = TrialConfig(dtype="bf16", weight_dtype="bf16", optim="adamw_torch")
    assert model_state_bytes(gpt2_tiny, memory_traits(bf16, "cuda")) == (
        2 * n,
        2 * n,
        4 * n,
    )  # no autocast copies either
    mixed = TrialConfig(dtype="bf16", optim="adamw_torch")
    assert (
        model_state_bytes(gpt2_tiny, memory_traits(mixed, "cuda"))[0] == 4 * n + 2 * gpt2_tiny.num_non_embedding_params
    )


def test_8_bit_and_adafactor_states_do_not_shrink_with_bf16_weights(gpt2_tiny):
    for optim in ("adamw_bnb_8bit", "adafactor"):
        assert optimizer_state_bytes(gpt2_tiny, optim, 2) == optimizer_state_bytes(gpt2_tiny, optim, 4)
    assert optimizer_state_bytes(gpt2_tiny, "adagrad", 2) == 2 * gpt2_tiny.num_params  # bf16 weights: 2 bytes


def test_the_model_is_built_in_the_weight_dtype_whatever_its_config_says():
    """smollm2's published config says bfloat16: from_config alone would build it in bf16."""
    import torch

    from autotune.spec.model_catalog import catalog_entry
    from autotune.spec.models import build_model, resolve_model

    assert catalog_entry("smollm2-135m")["torch_dtype"] == "bfloat16"
    spec = resolve_model("smollm2-135m")
    published = {**spec.hf_config, "dtype": "bfloat16"}
    with torch.device("meta"):
        assert next(build_model(published, spec.task).parameters()).dtype == torch.float32
        assert next(build_model(published, spec.task, dtype="bfloat16").parameters()).dtype == torch.bfloat16


@pytest.mark.slow
def test_a_bf16_weight_trial_trains_in_bf16_on_the_cpu_and_is_not_judged_diverged(
    tmp_path, gpt2_tiny, cpu, fast_measure
):
    measure = dataclasses.replace(fast_measure, min_steps=6, max_steps=8)
    workload = Workload.for_model(
        gpt2_tiny,
        device=cpu,
        seq_len=64,
        ceiling_bytes=8 * 1024**3,
        measure=measure,
        callbacks=("tests.support.faults:RecordParameters",),
    )
    default = run_isolated(
        TrialJob(workload, TrialConfig(micro_batch=4, pin_memory=False), str(tmp_path / "default")), timeout_s=180
    )
    job = TrialJob(
        workload,
        TrialConfig(micro_batch=4, pin_memory=False, dtype="bf16", weight_dtype="bf16"),
        str(tmp_path / "bf16"),
    )
    result = run_isolated(job, timeout_s=180)
    assert default.status == "ok" and result.status == "ok", (default.error, result.error)
    recorded = json.loads(Path(job.work_dir, "parameters.json").read_text())
    assert recorded["parameter_dtypes"] == ["torch.bfloat16"] and recorded["state_dtypes"] == ["torch.bfloat16"]
    assert judge_against_default(result, default).status == "ok"
