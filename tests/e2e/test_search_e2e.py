"""The spine, through the real CLI: search -> study -> best -> export -> a plain Trainer trains with it."""

from __future__ import annotations

import json

import optuna
import pytest

from tests.support.cli import FAST_SEARCH_ARGS, REPO, run_cli

pytestmark = pytest.mark.slow

SPACE = str(REPO / "search_spaces" / "tiny-test.yaml")


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """One real search of 4 trials, then 2 more in a second invocation (resume)."""
    workdir = tmp_path_factory.mktemp("search")
    storage = f"sqlite:///{workdir / 'autotune.db'}"
    common = ["--model", "bert-tiny", "--device", "cpu", "--space", SPACE, "--storage", storage, *FAST_SEARCH_ARGS]
    first = run_cli("search", *common, "--trials", "4", cwd=workdir)
    second = run_cli("search", *common, "--trials", "2", cwd=workdir)
    return workdir, storage, first, second


def test_search_records_every_trial_with_its_result(searched):
    _, storage, first, second = searched
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr
    study = optuna.load_study(study_name="bert-tiny-cpu-s32", storage=storage)
    finished = [t for t in study.trials if t.state.is_finished()]
    assert len(finished) == 6  # 4, then 2 more in the same study
    for trial in finished:
        result = trial.user_attrs["result"]
        assert result["status"] in {"ok", "over_ceiling", "oom", "pruned", "screened"}, result
        if result["status"] == "ok":
            assert result["samples_per_s"] > 0 and result["model_tflops"] > 0
            assert result["memory_source"] == "peak_rss_tree_bytes" and result["peak_memory_bytes"] > 0
            assert result["measured_steps"] >= 1
            assert trial.system_attrs["constraints"][0] <= 0


def test_live_table_names_its_numbers(searched):
    _, _, first, _ = searched
    out = first.stdout
    for label in ("samples/s", "model TFLOPs", "peak mem", "CV", "peak RSS of the trial's process tree"):
        assert label in out


def test_best_ranks_feasible_trials_fastest_first(searched):
    workdir, storage, _, _ = searched
    shown = run_cli("best", "--storage", storage, cwd=workdir)
    assert shown.returncode == 0, shown.stderr
    assert "fastest first" in shown.stdout
    study = optuna.load_study(study_name="bert-tiny-cpu-s32", storage=storage)
    from autotune.ranking import feasible_ranking

    ranking = feasible_ranking(study.trials)
    speeds = [r.samples_per_s for r in ranking]
    assert speeds == sorted(speeds, reverse=True) and speeds


def test_export_round_trips_through_the_real_training_arguments(searched, tmp_path):
    workdir, storage, _, _ = searched
    out = tmp_path / "best_args.json"
    exported = run_cli("export", "--storage", storage, "--out", str(out), cwd=workdir)
    assert exported.returncode == 0, exported.stderr
    arguments = json.loads(out.read_text())

    from transformers import HfArgumentParser, TrainingArguments

    from autotune.export import winner

    study = optuna.load_study(study_name="bert-tiny-cpu-s32", storage=storage)
    best = winner(study)
    args = TrainingArguments(output_dir=str(tmp_path / "run"), **arguments)
    assert args.per_device_train_batch_size == best.config.micro_batch
    assert args.gradient_accumulation_steps == best.config.grad_accum
    assert args.optim == best.config.optim
    (parsed,) = HfArgumentParser(TrainingArguments).parse_json_file(str(out))
    assert parsed.per_device_train_batch_size == best.config.micro_batch
    assert parsed.bf16 == (best.config.dtype == "bf16")


def test_a_plain_trainer_trains_with_the_export(searched, tmp_path):
    workdir, storage, _, _ = searched
    out = tmp_path / "best_args.json"
    assert run_cli("export", "--storage", storage, "--out", str(out), cwd=workdir).returncode == 0
    import torch
    from transformers import Trainer, TrainingArguments

    from autotune.models import build_model, resolve_model

    spec = resolve_model("bert-tiny")
    model = build_model(spec.config, spec.task)
    ids = torch.randint(0, spec.vocab_size, (64, 32))
    data = [{"input_ids": ids[i], "attention_mask": torch.ones(32, dtype=torch.long), "labels": torch.tensor(i % 2)}
            for i in range(64)]
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=3, report_to="none", save_strategy="no",
                             **json.loads(out.read_text()))
    state = Trainer(model=model, args=args, train_dataset=data).train()
    assert state.global_step == 3
