"""The precision a trial ran in (autotune.runner._precision), read back from torch rather than assumed
from the knob's name: TF32 matmuls, the autocast dtype inside the forward, and the labels, MFU and
export that follow what ran."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap

import pytest

from autotune.levers import TrialConfig
from autotune.result import TrialResult, precision_note
from autotune.runner._precision import (
    AutocastRecorder,
    predicted_tf32,
    ran_dtype,
    utilisation_defect,
)

_READ_PRECISION = textwrap.dedent(
    """
    import json, sys
    import torch
    import transformers.training_args as training_args
    from transformers import TrainingArguments
    from autotune.runner._precision import cuda_matmul_precision
    found = {"fresh": cuda_matmul_precision(torch)}
    # FakeAmpereGpu: transformers asks whether TF32 exists before switching it on; say yes, as an
    # Ampere GPU would, and let TrainingArguments run its own rule (training_args.py, "9. TF32").
    training_args.is_torch_tf32_available = lambda: True
    TrainingArguments(output_dir=sys.argv[1], use_cpu=True, torch_compile=True, report_to="none")
    found["fp32_compile"] = cuda_matmul_precision(torch)
    try:
        torch.backends.cuda.matmul.allow_tf32
        found["legacy_getter"] = "reads"
    except RuntimeError:
        found["legacy_getter"] = "raises"
    print(json.dumps(found))
    """
)


@pytest.mark.slow
def test_transformers_switches_tf32_on_for_fp32_with_compile_and_the_reading_says_so(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-c", _READ_PRECISION, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    import json

    found = json.loads(completed.stdout.strip().splitlines()[-1])
    assert found["fresh"] == "ieee"
    assert found["fp32_compile"] == "tf32"  # an "fp32 + inductor" trial runs TF32 matmuls
    assert found["legacy_getter"] == "raises"  # why the reading uses fp32_precision, not allow_tf32
    assert ran_dtype("cuda", None, found["fp32_compile"]) == "tf32"
    assert predicted_tf32("fp32", "inductor", "cuda", {})  # the prediction before the trial agrees
    assert not predicted_tf32("fp32", "inductor", "cuda", {"tf32": False})
    assert not predicted_tf32("fp16", "inductor", "cuda", {})
    assert not predicted_tf32("fp32", "inductor", "cpu", {})


def test_the_autocast_dtype_is_read_inside_the_forward():
    import torch

    class AutocastInsideForward(torch.nn.Module):
        """As accelerate's prepare_model leaves a model: autocast entered inside forward."""

        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 4)

        def forward(self, x):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return self.layer(x)

    model = AutocastInsideForward()
    recorder = AutocastRecorder(torch, "cpu")
    recorder.attach(model)
    model(torch.ones(2, 4))
    assert recorder.seen and recorder.dtype == "bf16"
    assert not model.layer._forward_pre_hooks  # removed after the first call: later steps run unhooked
    plain = AutocastRecorder(torch, "cpu")
    other = torch.nn.Sequential(torch.nn.Linear(4, 4))
    plain.attach(other)
    other(torch.ones(2, 4))
    assert plain.seen and plain.dtype is None
    # bf16 weights and no autocast (DeepSpeed's bf16 casts the module): the matmuls ran in bf16.
    cast = AutocastRecorder(torch, "cpu")
    half = torch.nn.Sequential(torch.nn.Linear(4, 4)).bfloat16()
    cast.attach(half)
    half(torch.ones(2, 4, dtype=torch.bfloat16))
    assert cast.seen and cast.dtype == "bf16"


def test_mfu_above_100_percent_is_a_defect_and_the_label_says_what_ran():
    assert utilisation_defect("MFU", 0.45, "tf32") is None
    defect = utilisation_defect("MFU", 2.4, "fp32")
    assert defect is not None and "240%" in defect and "impossible" in defect
    result = TrialResult(status="ok", peak_dtype="tf32", samples_per_s=10.0, defects=[defect])
    assert precision_note("fp32", result) == "ran tf32 matmuls"
    assert precision_note("bf16", dataclasses.replace(result, peak_dtype="bf16")) is None
    from autotune.views.trial_table import trial_cells

    cells = trial_cells(3, TrialConfig(dtype="fp32", compile="inductor"), result)
    assert "ran tf32 matmuls" in cells[-1] and "impossible" in cells[-1]
