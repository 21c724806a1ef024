"""A trial under ``--trainer sft``: TRL's ``SFTTrainer`` built as the user builds it, on the user's rows.

The trial hands ``SFTTrainer(model=..., args=SFTConfig(...), train_dataset=..., processing_class=...)``
exactly the levers' arguments and the harness's (``runner._trial.harness_arguments``), the rows as the
parent sampled them (``autotune.spec.dataset``: ``messages``, ``prompt``/``completion`` or ``text``,
untouched) and the tokenizer of the ``--model`` directory (or the synthetic one). TRL then prepares
them itself, in each trial: it renders and tokenizes, builds the labels of the study's loss,
truncates to ``max_length`` and packs as the trial's levers say (trl/trainer/sft_trainer.py,
``_prepare_dataset``, :1228-1485), so what is measured is what the user's run does. Preparing in the
trial, not once in the parent, is what lets packing be a lever (the rows differ per packing), and it
costs a trial well under a second for the few hundred rows its steps take, before its first step
(outside the measured steps).

Two things the trial adds, both after TRL's preparation and neither inside a measured step:

* rows cycled up to what the trial's steps take (``global batch x (steps + 1)``), as the Trainer
  path's data is: a packed dataset holds fewer rows than samples;
* under ``max_length=None`` (padding-free batches without packing, which TRL requires so:
  sft_trainer.py:999-1004) the tokenized samples truncated to ``--seq-len`` with TRL's own rule
  (keep the start, drop a sample left without a label: sft_trainer.py:1436-1463); the export says
  the user must do the same.
"""

from __future__ import annotations

import importlib
from typing import Any

from autotune.runner._job import TrialJob
from autotune.spec.models import NO_MODEL_CODE
from autotune.spec.sft import sft_arguments, trains_untruncated


def class_named(name: str) -> type:
    """The class ``module:Class`` names."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


def load_tokenizer(directory: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True, **NO_MODEL_CODE)


def build_sft_trainer(
    job: TrialJob,
    model: Any,
    classes: tuple[type, type, dict[str, Any]],
    arguments: dict[str, Any],
    callbacks: list[Any],
) -> Any:
    """The trial's ``SFTTrainer``, its data prepared by TRL and cycled to what the steps take.

    Args:
        job: The trial (its workload holds the prepared rows and the tokenizer's directory).
        model: The model autotune built (``SFTTrainer`` takes it as built).
        classes: The trainer class, its arguments class and the trainer's keyword arguments
            (``runner._trial.trainer_of``: TRL's ``SFTTrainer`` and ``SFTConfig``).
        arguments: ``SFTConfig`` keyword arguments: the levers' (every lever field SFTConfig resolves
            otherwise already explicit: ``autotune.levers.with_levers_off_explicit``) and the harness's.
        callbacks: The trial's callbacks (the loss recorder, the step timer, ...).
    """
    import datasets

    workload = job.workload
    prepared = workload.dataset
    assert prepared is not None and prepared.tokenizer_dir is not None, "--trainer sft needs rows and a tokenizer"
    datasets.disable_progress_bars()
    trainer_class, arguments_class, trainer_kwargs = classes
    kwargs = sft_arguments(arguments, workload.seq_len, workload.loss_on)
    trainer = trainer_class(
        model=model,
        args=arguments_class(**kwargs),
        train_dataset=datasets.load_from_disk(prepared.prepared_dir),
        processing_class=load_tokenizer(prepared.tokenizer_dir),
        callbacks=callbacks,
        **trainer_kwargs,
    )
    rows = trainer.train_dataset
    if trains_untruncated(kwargs):
        rows = truncated(rows, workload.seq_len)
    trainer.train_dataset = cycled(rows, job.config.global_batch * (workload.measure.total_steps_cap + 1))
    return trainer


def truncated(rows: Any, seq_len: int) -> Any:
    """TRL's truncation of tokenized rows (sft_trainer.py:1436-1463, ``truncation_mode="keep_start"``):
    the first ``seq_len`` tokens and labels, and a row left with no label to train on dropped."""

    def keep_start(row: dict[str, Any]) -> dict[str, Any]:
        return {"input_ids": row["input_ids"][:seq_len], "labels": row["labels"][:seq_len]}

    kept = rows.map(keep_start)
    return kept.filter(lambda row: any(label != -100 for label in row["labels"]))


def cycled(rows: Any, wanted: int) -> Any:
    """``rows`` repeated in order up to ``wanted`` rows (unchanged where it holds that many)."""
    if len(rows) == 0:
        raise RuntimeError("SFTTrainer's preparation left no row to train on (every sample masked or too long?)")
    if len(rows) >= wanted:
        return rows
    return rows.select([index % len(rows) for index in range(wanted)])


def fullest_batch(trainer: Any, micro_batch: int) -> tuple[dict[str, Any], str]:
    """The fullest micro-batch the trial's prepared rows can make, built by TRL's own collator: the
    ``micro_batch`` longest rows (a packed row's length is its samples' together), and its words."""
    rows = trainer.train_dataset
    lengths = [len(ids) for ids in rows["input_ids"]]
    longest = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:micro_batch]
    batch = trainer.data_collator([rows[i] for i in longest])
    shape = "x".join(str(n) for n in batch["input_ids"].shape)
    return batch, f"worst-case batch: the {len(longest)} longest rows as TRL's collator builds them, {shape} tokens"
