"""The spine, through the real CLI: search -> study -> best -> export -> a plain Trainer trains with it."""

from __future__ import annotations

import json
import shutil

import optuna
import pytest

from tests.support.cli import FAST_SEARCH_ARGS, run_cli, run_cli_in_process
from tests.support.searched_study import CEILING, SEARCH_TRIALS, SPACE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def searched(searched_study, tmp_path_factory):
    """The run's searched study (one `autotune search` of 5 trials, then one real OOM:
    tests/support/searched_study.py, made once for the whole run), and a copy of it that a second
    `autotune search` of 1 more trial resumes, run as a user runs it: `python -m autotune`."""
    workdir = tmp_path_factory.mktemp("search")
    shutil.copy(searched_study.workdir / "autotune.db", workdir / "autotune.db")
    storage = f"sqlite:///{workdir / 'autotune.db'}"
    resumed = run_cli(
        "search",
        "--model",
        "bert-tiny",
        "--device",
        "cpu",
        "--space",
        SPACE,
        "--storage",
        storage,
        "--memory-ceiling",
        CEILING,
        *FAST_SEARCH_ARGS,
        "--trials",
        "1",
        cwd=workdir,
    )
    return workdir, storage, searched_study, resumed


def _finished(storage: str) -> list[optuna.trial.FrozenTrial]:
    return [
        t for t in optuna.load_study(study_name="bert-tiny-cpu-s32", storage=storage).trials if t.state.is_finished()
    ]


def _ran(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    """The trials that ran: what ``--trials`` counts (autotune.study._loop), screened proposals left out."""
    return [t for t in trials if t.user_attrs["result"]["status"] != "screened"]


def test_search_records_every_trial_with_its_result(searched):
    _, storage, first, second = searched
    assert first.search.returncode == 0, first.search.stderr
    assert second.returncode == 0, second.stderr
    assert len(_ran(_finished(first.storage))) == SEARCH_TRIALS + 1  # the search's 5 and the OOM trial
    finished = _finished(storage)
    # then 1 more that ran in the same study; a proposal screened on the way (inferred from the OOM
    # trial: a config larger than one that ran out of memory) is recorded but costs no trial of --trials
    assert len(_ran(finished)) == SEARCH_TRIALS + 2
    for trial in finished:
        if trial.user_attrs["result"]["status"] == "screened":
            assert trial.number > first.oom_trial_number and trial.user_attrs["result"]["peak_memory_bytes"] == 0
    for trial in finished:
        result = trial.user_attrs["result"]
        assert result["status"] in {"ok", "over_ceiling", "oom", "pruned", "screened"}, result
        if result["status"] == "ok":
            assert result["samples_per_s"] > 0 and result["model_tflops"] > 0
            assert result["memory_source"] == "peak_rss_tree_bytes" and result["peak_memory_bytes"] > 0
            assert result["measured_steps"] >= 1
            assert trial.system_attrs["constraints"][0] <= 0


def test_live_table_names_its_numbers(searched):
    _, _, first, second = searched
    for out in (first.search.stdout, second.stdout):  # the entry point in a test process, and python -m autotune
        for label in ("samples/s", "model TFLOPs", "peak mem", "CV", "peak RSS of the trial's process tree"):
            assert label in out


def test_best_ranks_feasible_trials_fastest_first(searched):
    workdir, storage, _, _ = searched
    shown = run_cli_in_process("best", "--storage", storage, cwd=workdir)  # a reader: in this process
    assert shown.returncode == 0, shown.stderr
    assert "fastest first" in shown.stdout
    study = optuna.load_study(study_name="bert-tiny-cpu-s32", storage=storage)
    from autotune.views.ranking import feasible_ranking

    ranking = feasible_ranking(study.trials)
    speeds = [r.samples_per_s for r in ranking]
    assert speeds == sorted(speeds, reverse=True) and speeds


@pytest.fixture(scope="module")
def exported(searched):
    """One `autotune export` of the searched study, read by the two tests below."""
    workdir, storage, _, _ = searched
    out = workdir / "best_args.json"
    completed = run_cli("export", "--storage", storage, "--out", str(out), cwd=workdir)
    assert completed.returncode == 0, completed.stderr
    return out


def test_export_round_trips_through_the_real_training_arguments(searched, exported, tmp_path):
    _, storage, _, _ = searched
    out = exported
    arguments = json.loads(out.read_text())

    from transformers import HfArgumentParser, TrainingArguments

    from autotune.views.export import winner

    study = optuna.load_study(study_name="bert-tiny-cpu-s32", storage=storage)
    best = winner(study)
    args = TrainingArguments(output_dir=str(tmp_path / "run"), **arguments)
    assert args.per_device_train_batch_size == best.config.micro_batch
    assert args.gradient_accumulation_steps == best.config.grad_accum
    assert args.optim == best.config.optim
    (parsed,) = HfArgumentParser(TrainingArguments).parse_json_file(str(out))
    assert parsed.per_device_train_batch_size == best.config.micro_batch
    assert parsed.bf16 == (best.config.dtype == "bf16")


def test_a_plain_trainer_trains_with_the_export(exported, tmp_path):
    out = exported
    import torch
    from transformers import Trainer, TrainingArguments

    from autotune.spec.models import build_model, resolve_model

    spec = resolve_model("bert-tiny")
    model = build_model(spec.hf_config, spec.task)
    ids = torch.randint(0, spec.vocab_size, (64, 32))
    data = [
        {"input_ids": ids[i], "attention_mask": torch.ones(32, dtype=torch.long), "labels": torch.tensor(i % 2)}
        for i in range(64)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        report_to="none",
        save_strategy="no",
        **json.loads(out.read_text()),
    )
    state = Trainer(model=model, args=args, train_dataset=data).train()
    assert state.global_step == 3
