"""The DPO fidelity benchmark's plain run (``benchmarks/bench_dpo_fidelity.py``) trains what the winner's trial
trained: a real DPO search and export, then the plain ``DPOTrainer`` built from the exported DPOConfig JSON as
``trl dpo`` builds it (the catalog model saved and loaded by name, so ``model_init_kwargs`` apply to it and to
the reference TRL loads beside it) next to the trial's own ``DPOTrainer`` (``autotune.runner``). What must be
exact is asserted: the resolved arguments, the attention kernel, the weights' dtype, the reference model held
(or none), and the tokens of every step. How fast each runs, and in how much memory, is the benchmark's
(docs/benchmarks.md, "DPO fidelity"), never a test's."""

from __future__ import annotations

import argparse

import pytest

from autotune.trainers.dpo import DPO
from benchmarks.bench_dpo_fidelity import ROWS, plain_dpo_trainer
from benchmarks.bench_sft_fidelity import save_model, study_workload, trial_rows
from tests.support.cli import run_cli_in_process
from tests.support.dpo_study import MODEL_DIR, SEQ_LEN
from tests.test_bench_sft_fidelity import assert_same_arguments_and_model, steps_of

pytestmark = pytest.mark.slow
pytest.importorskip("trl")


def search_options(root) -> argparse.Namespace:
    """The search's options (tests/support/dpo_study.py) as the benchmark's study_workload reads them."""
    return argparse.Namespace(model=str(root / MODEL_DIR), seq_len=SEQ_LEN, warmup_steps=1, max_measure_steps=2)


@pytest.fixture(scope="module")
def exported(dpo_study):
    """The run's DPO study of a local 2-layer decoder on generated pairs (tests/support/dpo_study.py, made once), its winner
    exported as DPOConfig JSON."""
    export = run_cli_in_process("export", "--storage", dpo_study.storage, "--out", "best.json", cwd=dpo_study.root)
    assert export.returncode == 0, export.stderr
    return dpo_study.root, dpo_study.storage


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
    workload = study_workload(root, search_options(root), ROWS)
    job = TrialJob(workload=workload, config=winner.config, work_dir=str(root / "trial"))
    torch.manual_seed(0)
    model = build_model(workload.model.hf_config, workload.model.task, **model_build_kwargs(winner.config))
    trial = build_trainer(job, model, trial_batching(winner.config), [])
    save_model(workload, root / "model")
    plain = plain_dpo_trainer(
        str(root / "best.json"),
        str(root / "model"),
        workload.dataset.prepared_dir,
        trial_rows(workload, winner.config),
        workload.measure.total_steps_cap,
        [],
    )
    return winner, trial, plain


def test_the_plain_dpotrainer_of_the_export_trains_what_the_winners_trial_trained(exported):
    root, storage = exported
    winner, trial, plain = trainers(root, storage)
    assert_same_arguments_and_model(root, trial, plain)

    # The reference DPOTrainer keeps beside the model it loaded by name, loaded the same way, where the trial
    # keeps its copy (none under precompute_ref_log_probs, whose pass both ran over the same pairs).
    held = not winner.config.precompute_ref_log_probs
    assert (plain.ref_model is not None, trial.ref_model is not None) == (held, held)
    if plain.ref_model is not None:
        assert {p.dtype for p in plain.ref_model.parameters()} == {p.dtype for p in trial.ref_model.parameters()}
        assert plain.ref_model.config._attn_implementation == trial.ref_model.config._attn_implementation
    # One reference pass over the same pairs before training (under precompute_ref_log_probs), else none.
    assert plain.reference_pass[1] == DPO.setup_pass(trial)[1]
    assert (plain.reference_pass[1] > 0) is winner.config.precompute_ref_log_probs

    # The same pairs in the same batches: every step's chosen and rejected rows, token for token (the
    # reference's log-probabilities aside: computed by each run's own copy of the weights).
    steps = trial.args.max_steps
    for trial_step, plain_step in zip(steps_of(trial, steps), steps_of(plain, steps), strict=True):
        for trial_batch, plain_batch in zip(trial_step, plain_step, strict=True):
            assert trial_batch.keys() == plain_batch.keys()
            for key in ("input_ids", "attention_mask", "completion_mask"):
                assert trial_batch[key].equal(plain_batch[key]), key
            assert int(trial_batch["attention_mask"].sum()) > 0
