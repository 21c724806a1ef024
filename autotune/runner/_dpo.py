"""A trial under ``--trainer dpo``: TRL's ``DPOTrainer`` built as the user builds it, on preference rows.

Standalone for now: the trainer seam (one module per trainer) plugs it in. What a trial hands
``DPOTrainer(model=..., ref_model=..., args=DPOConfig(...), train_dataset=..., processing_class=...,
peft_config=...)`` (trl 1.16, trl/trainer/dpo_trainer.py; docs/facts.md, "DPO"):

* the rows as they are (``prompt`` / ``chosen`` / ``rejected``, plain or conversational): TRL
  tokenizes them itself (``_prepare_dataset``, :1036-1142), drops a row whose prompt alone fills
  ``max_length``, and its collator (``DataCollatorForPreference``, :146-210) puts prompt + chosen and
  prompt + rejected in one batch of 2 x micro-batch rows, each truncated to ``max_length``, padded to the
  longest: one forward of the policy (and one of the reference) per micro-batch;
* the reference model as the user's run has it. TRL builds one itself only from a path
  (``create_model_from_path(get_config_model_id(model.config))``, :915-927), which a model built from
  its config has not; the user's run loads the same weights twice, so the trial hands TRL a copy of the
  built model (same weights, dtype and attention kernel, what TRL's load sets: :924-925). There is no
  copy where TRL keeps none (:908-914): under ``peft_config`` (the base model is the reference, the
  adapters disabled: ``use_adapter(..., None)``, :1326-1336) and under ``precompute_ref_log_probs``
  (the policy itself, before training, computes every row's reference log-probabilities in
  ``__init__``: :1013-1019, 1168-1241; then no reference forward in a step);
* ``peft_config`` to ``DPOTrainer``, as ``trl dpo --use_peft`` does (trl/scripts/dpo.py:101-108), not
  a model wrapped beforehand: TRL would then train against a copy of the adapter (a "ref" adapter,
  :666-695), not against the base model.

The real tokens of a step are the ones in the attention mask of the collated 2 x micro-batch rows
(transformers' ``include_num_input_tokens_seen="non_padding"``: trainer.py ``_track_num_input_tokens``,
``attention_mask.sum()``): the prompt twice, both answers, after truncation, never the padding.
"""

from __future__ import annotations

import copy
from typing import Any

from autotune.spec.dpo import keeps_reference_copy

# What the Trainer counts in ``state.num_input_tokens_seen`` under DPO (the step timer's ``_tokens_seen``):
# the collated batch's attention mask, chosen and rejected rows alike.
TOKENS_COUNTED = "non_padding"


def reference_model(model: Any, arguments: dict[str, Any], peft: bool) -> Any:
    """The reference model the trial hands ``DPOTrainer``: a copy of the built model where the user's run
    loads one (:func:`keeps_reference_copy`), else ``None``, as TRL has it."""
    if not keeps_reference_copy(arguments, peft):
        return None
    reference = copy.deepcopy(model)
    reference.eval()
    return reference


def build_dpo_trainer(
    model: Any,
    tokenizer: Any,
    rows: Any,
    arguments: dict[str, Any],
    callbacks: list[Any] | None = None,
    peft_config: Any = None,
    rows_wanted: int = 0,
) -> Any:
    """The trial's ``DPOTrainer``: TRL's own preparation, reference model and collator.

    Args:
        model: The model autotune built (``build_model``, random weights), not wrapped in adapters.
        tokenizer: The model's tokenizer (or the synthetic one), with a chat template for conversational rows.
        rows: The preference rows: a ``datasets.Dataset`` or a list of dicts.
        arguments: ``DPOConfig`` keyword arguments (the levers' and the harness's).
        callbacks: The trial's callbacks (the step timer, ...).
        peft_config: A ``peft.PeftConfig`` (``--peft``), which ``DPOTrainer`` applies itself.
        rows_wanted: Cycle the prepared rows up to this many (what the trial's steps take), after TRL's
            preparation and its precomputed reference log-probabilities, which stay one pass over ``rows``.
    """
    import datasets
    from trl import DPOConfig, DPOTrainer

    from autotune.trainers.sft import cycled

    datasets.disable_progress_bars()
    if isinstance(rows, list):
        rows = datasets.Dataset.from_list(rows)
    trainer = DPOTrainer(
        model=model,
        ref_model=reference_model(model, arguments, peft_config is not None),
        args=DPOConfig(**arguments),
        train_dataset=rows,
        processing_class=tokenizer,
        callbacks=callbacks,
        peft_config=peft_config,
    )
    if rows_wanted:
        trainer.train_dataset = cycled(trainer.train_dataset, rows_wanted)
    return trainer


def batch_real_tokens(batch: dict[str, Any]) -> int:
    """The real tokens of a collated DPO batch (prompt + chosen and prompt + rejected rows): its attention
    mask's ones, as the Trainer counts them under :data:`TOKENS_COUNTED`."""
    return int(batch["attention_mask"].sum())
