"""Bring your own: a local model directory with its tokenizer, a JSONL dataset, fixed training
arguments and a fixed global batch, tuned end to end on the CPU through the real command line."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import FAST_SEARCH_ARGS, run_cli_in_process
from tests.support.local_model import corpus, make_local_model, write_jsonl

pytestmark = pytest.mark.slow

BASE = {"learning_rate": 3e-4, "warmup_steps": 7, "weight_decay": 0.01, "lr_scheduler_type": "cosine"}
SPACE = """\
micro_batch: [4, 8, 16]
grad_accum: [1, 2]
dtype: [fp32, bf16]
dataloader_workers: [0, 1]
attn_implementation: [eager, sdpa]
"""


@pytest.fixture(scope="module")
def byo_run(tmp_path_factory):
    """One search of 3 trials with --dataset, --base-args and --global-batch 16, then an export."""
    root = tmp_path_factory.mktemp("byo")
    texts = corpus(200)
    model_dir = make_local_model(root / "my-model", texts, "bert")
    write_jsonl(root / "train.jsonl", texts)
    (root / "base.json").write_text(json.dumps(BASE))
    (root / "space.yaml").write_text(SPACE)
    storage = f"sqlite:///{root / 'study.db'}"
    search = run_cli_in_process(
        "search",
        "--model",
        str(model_dir),
        "--dataset",
        "train.jsonl",
        "--base-args",
        "base.json",
        "--global-batch",
        "16",
        "--space",
        "space.yaml",
        "--trials",
        "3",
        "--storage",
        storage,
        "--work-dir",
        "runs",
        "--confirm-top",
        "0",
        *FAST_SEARCH_ARGS,
        "--prune-ratio",
        "0",
        cwd=root,
    )
    export = run_cli_in_process("export", "--storage", storage, "--out", "best.json", cwd=root)
    return root, storage, search, export


def test_the_search_runs_on_the_users_model_and_data(byo_run):
    root, storage, search, _ = byo_run
    assert search.returncode == 0, search.stderr[-3000:]
    assert f"dataset {root / 'train.jsonl'} ('text' truncated/padded to 32 tokens): 200 samples" in search.stdout
    assert "note: global batch 16: grad_accum = 16 / micro_batch, not searched" in search.stdout
    assert list((root / "runs" / "datasets").glob("dataset-*"))  # the prepared copy the trials read


def test_every_trial_has_the_global_batch_and_the_base_args(byo_run):
    import optuna

    from autotune.levers import TrialConfig
    from autotune.result import TrialResult

    _, storage, search, _ = byo_run
    assert search.returncode == 0, search.stderr[-3000:]
    study = optuna.load_study(study_name=None, storage=storage)
    assert study.user_attrs["base_args"] == BASE
    assert study.user_attrs["identity"]["dataset"].endswith("('text' truncated/padded to 32 tokens)")
    trials = study.get_trials(deepcopy=False)
    assert len(trials) == 3
    for trial in trials:
        config = TrialConfig.from_params(trial.params)
        assert config.micro_batch * config.grad_accum == 16
        assert TrialResult.from_trial(trial).status == "ok", TrialResult.from_trial(trial).error


def test_the_export_keeps_the_global_batch_and_the_base_args(byo_run):
    from transformers import TrainingArguments

    root, storage, _, export = byo_run
    assert export.returncode == 0, export.stderr[-3000:]
    exported = json.loads((root / "best.json").read_text())
    assert exported["per_device_train_batch_size"] * exported["gradient_accumulation_steps"] == 16
    assert {k: exported[k] for k in BASE} == BASE
    args = TrainingArguments(output_dir=str(root / "out"), **exported)
    assert args.learning_rate == BASE["learning_rate"] and args.warmup_steps == BASE["warmup_steps"]
    # The attention kernel was searched: a model argument, so the export says how to carry it.
    assert "attn_implementation" not in exported
    assert "note: the winner's model was built with attn_implementation=" in export.stderr
    python_format = run_cli_in_process("export", "--storage", storage, "--format", "python", "--out", "-", cwd=root)
    assert "# note: the winner's model was built with attn_implementation=" in python_format.stdout
