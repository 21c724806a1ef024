"""What a real trial child reads back about how it ran (issue 14): the autocast dtype from inside the
forward, the allocator settings of its environment; the export names the allocator settings; the
space offers flash_attention_2 only where it can run and never beside fp32/tf32."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.levers import TrialConfig
from autotune.levers.attention import flash_attention_2_unavailable
from autotune.result import TrialResult
from autotune.runner import TrialJob, run_isolated
from autotune.spec.devices import known_gpu
from autotune.views.export import allocator_note, export_notes
from autotune.views.ranking import RankedTrial


@pytest.mark.slow
def test_a_bf16_trial_records_the_autocast_it_ran_in_and_its_allocator_settings(tmp_path, tiny_workload, monkeypatch):
    # The workload takes the parent's allocator settings when it is made, and the child trains under
    # them (the forkserver may have started before they were set).
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.8")
    job = TrialJob(
        workload=tiny_workload(),
        config=TrialConfig(micro_batch=8, dtype="bf16", pin_memory=False),
        work_dir=str(tmp_path / "trial"),
    )
    result = run_isolated(job, timeout_s=180)
    assert result.status == "ok", result.error
    assert result.runtime["autocast_dtype"] == "bf16"
    assert result.runtime["autocast_read_from"] == "forward hook"  # read inside the forward, not assumed
    assert result.runtime["matmul_precision"] == "ieee"
    assert result.peak_dtype == "bf16"
    assert result.runtime.get("PYTORCH_ALLOC_CONF") == "garbage_collection_threshold:0.8"
    assert result.defects == []


def ranked(runtime: dict[str, str]) -> RankedTrial:
    return RankedTrial(
        number=4, state="COMPLETE", config=TrialConfig(), result=TrialResult(status="ok", runtime=runtime)
    )


def test_the_export_names_the_allocator_settings_the_winner_was_measured_under():
    assert allocator_note(ranked({"matmul_precision": "ieee"})) is None
    note = allocator_note(ranked({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}))
    assert note is not None and "PYTORCH_ALLOC_CONF=expandable_segments:True" in note
    assert export_notes(ranked({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}))


def test_flash_attention_2_needs_cuda_ampere_and_an_importable_flash_attn(cpu):
    assert flash_attention_2_unavailable(cpu) == "it needs a CUDA device"
    v100 = known_gpu("v100-16gb").device()
    assert "Ampere" in (flash_attention_2_unavailable(v100) or "")
    a100 = known_gpu("a100-80gb").device()
    reason = flash_attention_2_unavailable(a100)  # this machine has no flash-attn
    assert reason is not None and "flash" in reason


def test_export_writes_tf32_where_the_winner_ran_tf32_without_asking():
    from autotune.views.export import with_precision_that_ran

    result = TrialResult(status="ok", peak_dtype="tf32")
    assert with_precision_that_ran({"torch_compile": True}, result)["tf32"] is True
    assert "tf32" not in with_precision_that_ran(
        {"torch_compile": True}, dataclasses.replace(result, peak_dtype="fp32")
    )
    assert with_precision_that_ran({"tf32": False}, result) == {"tf32": False}  # the user's choice stands
