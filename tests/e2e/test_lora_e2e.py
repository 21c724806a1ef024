"""A LoRA study through the real CLI on the CPU: search -> best -> export -> report."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from tests.support.cli import FAST_SEARCH_ARGS, run_cli_in_process

pytestmark = pytest.mark.slow

ADAPTER = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["c_attn", "c_proj"]}


@pytest.fixture(scope="module")
def lora_study(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("lora")
    (workdir / "adapter.json").write_text(json.dumps(ADAPTER))
    (workdir / "space.yaml").write_text("micro_batch: [2, 4]\n")
    storage = f"sqlite:///{workdir / 'autotune.db'}"
    searched = run_cli_in_process(
        "search",
        "--model",
        "gpt2-tiny",
        "--device",
        "cpu",
        "--space",
        "space.yaml",
        "--peft",
        "adapter.json",
        "--storage",
        storage,
        "--trials",
        "2",
        "--callback",
        "tests.support.faults:RecordParameters",
        *FAST_SEARCH_ARGS,
        cwd=workdir,
    )
    assert searched.returncode == 0, searched.stderr
    return workdir, storage


def test_every_trial_trained_the_adapters_and_its_tflops_use_the_lora_formula(lora_study):
    workdir, storage = lora_study
    from autotune.spec.devices import cpu_device
    from autotune.spec.flops import attention_flops_per_token
    from autotune.spec.models import resolve_model
    from autotune.spec.peft import with_peft

    spec = resolve_model("gpt2-tiny")
    adapters = with_peft(spec, str(workdir / "adapter.json"), cpu_device(), []).peft.adapter_params
    recorded = [json.loads(p.read_text()) for p in Path(workdir, "autotune_runs").rglob("parameters.json")]
    assert recorded and all(r["trainable"] == adapters and r["frozen"] == spec.num_params for r in recorded)
    assert all(r["model_class"].startswith("PeftModel") for r in recorded)
    study = optuna.load_study(study_name="gpt2-tiny-cpu-s32", storage=storage)
    assert study.user_attrs["identity"]["peft"] == {"adapter_config": ADAPTER, "quantize": None}
    per_token = 4 * spec.num_non_embedding_params + 6 * adapters + attention_flops_per_token(spec, 32)
    ok = [t.user_attrs["result"] for t in study.trials if t.user_attrs["result"]["status"] == "ok"]
    assert ok
    for result in ok:
        assert result["model_tflops"] == pytest.approx(result["samples_per_s"] * per_token * 32 / 1e12, rel=1e-9)


def test_best_export_and_report_carry_the_adapters(lora_study, tmp_path):
    workdir, storage = lora_study
    # The study's readers, in this process as the search above.
    shown = run_cli_in_process("best", "--storage", storage, cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    exported = run_cli_in_process(
        "export", "--storage", storage, "--out", str(tmp_path / "best_args.json"), cwd=workdir
    )
    assert exported.returncode == 0, exported.stderr
    adapter_file = tmp_path / "best_args.adapter_config.json"
    assert json.loads(adapter_file.read_text()) == {**ADAPTER, "task_type": "CAUSAL_LM"}
    assert "peft.get_peft_model" in exported.stderr and "best_args.adapter_config.json" in exported.stderr
    from peft import LoraConfig
    from transformers import TrainingArguments

    LoraConfig(**json.loads(adapter_file.read_text()))  # what the note tells the user to run
    TrainingArguments(output_dir=str(tmp_path / "run"), **json.loads((tmp_path / "best_args.json").read_text()))
    report = run_cli_in_process("report", "--storage", storage, "--out", str(tmp_path / "report.html"), cwd=workdir)
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report.html").stat().st_size > 0
