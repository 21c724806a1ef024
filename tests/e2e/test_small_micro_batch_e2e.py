"""A decoder that fits only below micro-batch 8: ``micro_batch: auto`` searches 1-4 there and finds a winner."""

from __future__ import annotations

import optuna
import pytest

from autotune.estimate import UNCALIBRATED_MARGIN, estimate_peak
from autotune.levers import TrialConfig
from autotune.runner import trial_memory_prior
from tests.support.cli import run_cli_in_process

pytestmark = pytest.mark.slow

MiB = 1024**2


def ceiling_between_2_and_8(cpu, gpt2_tiny) -> str:
    """gpt2-tiny at seq len 256 on the CPU, fp32 AdamW: a ceiling that micro-batch 2 fits with the prior's
    margin to spare (so 1 is not searched) and that micro-batch 8 exceeds beyond it (screened, never run).

    The memory prior puts micro-batch 8 at 1.82 GiB, 4 at 1.20 GiB, 2 at 0.89 GiB with a 0.47 GiB process
    baseline (a long-lived venv): 1.28 GiB. The baseline is this installation's
    (estimate.cpu_process_baseline_bytes: 0.56-0.57 GiB in a venv pip has just written, where the trials'
    peaks are higher too), so the ceiling follows it, half-way between the two bounds.
    """
    prior = trial_memory_prior(cpu, {}, 1)
    two, eight = (
        estimate_peak(gpt2_tiny, TrialConfig(micro_batch=mb, pin_memory=False), 256, prior).total_bytes for mb in (2, 8)
    )
    return f"{(two * UNCALIBRATED_MARGIN + eight / UNCALIBRATED_MARGIN) / 2 // MiB:.0f}MiB"


def test_auto_searches_small_micro_batches_where_8_does_not_fit(tmp_path, cpu, gpt2_tiny):
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch: auto\ndtype: [fp32]\noptim: [adamw_torch]\npin_memory: [false]\n")
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    searched = run_cli_in_process(
        "search",
        "--model",
        "gpt2-tiny",
        "--device",
        "cpu",
        "--seq-len",
        "256",
        "--memory-ceiling",
        ceiling_between_2_and_8(cpu, gpt2_tiny),
        "--space",
        str(space),
        "--storage",
        storage,
        "--trials",
        "3",
        "--warmup-steps",
        "1",
        "--max-measure-steps",
        "3",
        "--confirm-top",
        "0",
        cwd=tmp_path,
    )
    assert searched.returncode == 0, searched.stderr
    # 1 is not searched: 2 is predicted to fit with every setting.
    assert "micro_batch 1 removed: micro-batch 2 is predicted to fit" in searched.stdout.replace("\n", " ")
    study = optuna.load_study(study_name="gpt2-tiny-cpu-s256", storage=storage)
    assert 2 in study.user_attrs["space"]["micro_batch"] and 1 not in study.user_attrs["space"]["micro_batch"]
    fitting = [t for t in study.trials if t.user_attrs.get("result", {}).get("status") == "ok"]
    assert fitting, [t.user_attrs.get("result", {}).get("status") for t in study.trials]
    assert all(t.params["micro_batch"] < 8 for t in fitting)
    best = run_cli_in_process("best", "--storage", storage, cwd=tmp_path)  # the study's reader, in this process
    assert best.returncode == 0, best.stderr
    assert "mb=2" in best.stdout or "mb=4" in best.stdout
