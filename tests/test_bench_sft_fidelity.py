"""The SFT fidelity benchmark's plain run (``benchmarks/bench_sft_fidelity.py``) trains what the winner's
trial trained: a real ``--trainer sft`` search and export, then the plain ``SFTTrainer`` built from the
exported SFTConfig JSON (the catalog model saved and loaded by name, so ``model_init_kwargs`` apply)
beside the trial's own ``SFTTrainer`` (``autotune.runner``). What must be exact is asserted: the
resolved arguments, the attention kernel, the weights' dtype and the tokens of every step. How fast
each runs is the benchmark's (docs/benchmarks.md, "Fidelity"), never a test's."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_sft_fidelity import (
    PLAIN_HARNESS,
    plain_sft_trainer,
    save_model,
    study_workload,
    trial_rows,
)
from tests.support.cli import run_cli_in_process
from tests.support.sft_study import OPTIONS, SEQ_LEN

pytestmark = pytest.mark.slow
pytest.importorskip("trl")


@pytest.fixture(scope="module")
def exported(sft_study):
    """The run's SFT study of llama-tiny on the chat corpus (tests/support/sft_study.py, made once), its
    winner exported as SFTConfig JSON."""
    export = run_cli_in_process("export", "--storage", sft_study.storage, "--out", "best.json", cwd=sft_study.root)
    assert export.returncode == 0, export.stderr
    return sft_study.root, sft_study.storage


def trainers(root, storage):
    """The winner's trial trainer as autotune's runner builds it, and the plain one of the export."""
    import optuna
    import torch

    from autotune.levers import model_build_kwargs
    from autotune.levers._trial_config import trial_batching
    from autotune.runner import TrialJob
    from autotune.runner._trial import build_trainer
    from autotune.spec.models import build_model
    from autotune.views.ranking import study_ranking

    winner = study_ranking(optuna.load_study(study_name=None, storage=storage))[0]
    workload = study_workload(root, OPTIONS)
    job = TrialJob(workload=workload, config=winner.config, work_dir=str(root / "trial"))
    torch.manual_seed(0)
    model = build_model(workload.model.hf_config, workload.model.task, **model_build_kwargs(winner.config))
    trial = build_trainer(job, model, trial_batching(winner.config), [])
    save_model(workload, root / "model")
    plain = plain_sft_trainer(
        str(root / "best.json"),
        str(root / "model"),
        workload.dataset.prepared_dir,
        trial_rows(workload, winner.config),
        SEQ_LEN,
        workload.measure.total_steps_cap,
        [],
    )
    return winner, trial, plain


def assert_same_arguments_and_model(root, trial, plain) -> None:
    """The plain trainer of the export (``root``/best.json) resolves the trial's arguments, but for what only
    the harness sets (where each run writes, how long it runs, what it logs) and the model's build, which the
    trial does itself; and it loaded the model by name with ``model_init_kwargs``: the trial's attention and
    weight dtype. (SFTTrainer's and DPOTrainer's alike: tests/test_bench_dpo_fidelity.py.)"""
    exported_arguments = json.loads((root / "best.json").read_text())
    assert set(exported_arguments) - {"model_init_kwargs"} <= set(trial.args.to_dict())
    harness = {"output_dir", "logging_dir", "run_name", "max_steps", "include_num_input_tokens_seen"}
    harness |= set(PLAIN_HARNESS) | {"push_to_hub", "enable_jit_checkpoint", "load_best_model_at_end"}
    harness |= {"eval_strategy", "eval_on_start", "do_eval", "resume_from_checkpoint", "model_init_kwargs"}
    trial_args = {k: v for k, v in trial.args.to_dict().items() if k not in harness}
    plain_args = {k: v for k, v in plain.args.to_dict().items() if k not in harness}
    assert {
        k: (trial_args.get(k), plain_args.get(k))
        for k in trial_args | plain_args
        if trial_args.get(k) != plain_args.get(k)
    } == {}
    assert trial.args.seed == plain.args.seed  # the rows' order
    assert plain.model is not trial.model
    assert plain.model.config._attn_implementation == trial.model.config._attn_implementation
    assert {p.dtype for p in plain.model.parameters()} == {p.dtype for p in trial.model.parameters()}


def _same(trial_value, plain_value) -> bool:
    return trial_value.equal(plain_value) if hasattr(trial_value, "equal") else trial_value == plain_value


def steps_of(trainer, steps: int) -> list[list]:
    """The micro-batches of the first ``steps`` optimizer steps, as the trainer's dataloader yields them."""
    batches = iter(trainer.get_train_dataloader())
    accumulation = trainer.args.gradient_accumulation_steps
    return [[next(batches) for _ in range(accumulation)] for _ in range(steps)]


def test_the_plain_sfttrainer_of_the_export_trains_what_the_winners_trial_trained(exported):
    from autotune.runner._sample_lengths import count

    root, storage = exported
    winner, trial, plain = trainers(root, storage)
    assert_same_arguments_and_model(root, trial, plain)
    assert plain.model.config._attn_implementation == winner.config.attn_implementation

    # The same rows in the same batches: every step's samples and real tokens, token for token.
    steps = trial.args.max_steps
    trial_steps, plain_steps = steps_of(trial, steps), steps_of(plain, steps)
    for trial_step, plain_step in zip(trial_steps, plain_steps, strict=True):
        trial_samples_tokens = sum(count(batch)[:2] for batch in trial_step).tolist()
        assert trial_samples_tokens == sum(count(batch)[:2] for batch in plain_step).tolist()
        assert trial_samples_tokens[1] > 0
        for trial_batch, plain_batch in zip(trial_step, plain_step, strict=True):
            assert trial_batch.keys() == plain_batch.keys()
            # Tensors, and the ints a padding-free collator adds (the longest sequence: max_length_q/k).
            assert all(_same(trial_batch[k], plain_batch[k]) for k in trial_batch), trial_batch.keys()
