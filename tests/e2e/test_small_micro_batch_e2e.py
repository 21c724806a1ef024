"""A decoder that fits only below micro-batch 8: ``micro_batch: auto`` searches 1-4 there and finds a winner."""

from __future__ import annotations

import optuna
import pytest

from tests.support.cli import REPO, run_cli

pytestmark = pytest.mark.slow

# gpt2-tiny at seq len 256 on the CPU: the memory prior puts micro-batch 8 at 1.85 GiB, 4 at 1.23 GiB,
# 2 at 0.92 GiB (autotune estimate --json): under a 1.2 GiB ceiling no micro-batch >= 8 fits.
CEILING = "1.2GiB"


def test_auto_searches_small_micro_batches_where_8_does_not_fit(tmp_path):
    space = tmp_path / "space.yaml"
    space.write_text("micro_batch: auto\ndtype: [fp32]\noptim: [adamw_torch]\npin_memory: [false]\n")
    storage = f"sqlite:///{tmp_path / 'autotune.db'}"
    searched = run_cli(
        "search", "--model", "gpt2-tiny", "--device", "cpu", "--seq-len", "256", "--memory-ceiling", CEILING,
        "--space", str(space), "--storage", storage, "--trials", "3", "--warmup-steps", "1",
        "--max-measure-steps", "3", "--confirm-top", "0", cwd=tmp_path,
    )
    assert searched.returncode == 0, searched.stderr
    # 1 is not searched: 2 is predicted to fit with every setting.
    assert "micro_batch 1 removed: micro-batch 2 is predicted to fit" in searched.stdout.replace("\n", " ")
    study = optuna.load_study(study_name="gpt2-tiny-cpu-s256", storage=storage)
    assert 2 in study.user_attrs["space"]["micro_batch"] and 1 not in study.user_attrs["space"]["micro_batch"]
    fitting = [t for t in study.trials if t.user_attrs.get("result", {}).get("status") == "ok"]
    assert fitting, [t.user_attrs.get("result", {}).get("status") for t in study.trials]
    assert all(t.params["micro_batch"] < 8 for t in fitting)
    best = run_cli("best", "--storage", storage, cwd=tmp_path)
    assert best.returncode == 0, best.stderr
    assert "mb=2" in best.stdout or "mb=4" in best.stdout
