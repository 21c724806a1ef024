"""``--trainer trainer``: the transformers ``Trainer`` with ``TrainingArguments``, on synthetic tokens or
a ``text`` column autotune tokenizes and batches itself (``autotune.runner``, the ``padding`` lever's
collators). The trainer of a study that names none."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from autotune.trainers._kind import CorpusForm, ToolExport, TrialInputs, arguments_forms


class HfTrainer:
    """The transformers ``Trainer`` (:class:`autotune.trainers.TrainerKind`)."""

    name = "trainer"
    words = "the transformers Trainer"
    option_words = "transformers' Trainer"
    chosen_words = ""
    default_arguments_words = "HF default TrainingArguments"
    baseline_words = "HF default"
    trainer_class = "transformers:Trainer"
    arguments_path = "transformers:TrainingArguments"
    arguments_named = "a TrainingArguments"
    refused_fields: Mapping[str, str] = {}
    chosen_for_formats: tuple[str, ...] = ()
    prepares_rows = False
    # transformers/trainer.py: model.config.use_cache = args.use_cache, and the forward takes the config's.
    honours_use_cache = True
    fuses_lm_head = False
    chooses_loss = False
    offloads_activations = False
    samples_counted_from_lengths = False
    arguments_subclass = False
    rows_per_sample = 1
    holds_reference = False
    # autotune's loader pads every sample to --seq-len; the padding lever pads to the batch's longest.
    pads_to_longest = False
    # The packing lever is TRL's: the Trainer's own batching is the padding lever.
    batchings_refused = (
        "it is how TRL's SFTTrainer batches samples (--trainer sft); the Trainer's own is the padding lever"
    )
    applies_adapters = False
    tool_forms: tuple[str, ...] = ()
    tool_export: ToolExport | None = None
    exported_as: Mapping[str, str] = arguments_forms(arguments_named)
    corpus_forms: Mapping[str, CorpusForm] = {}  # the chat corpus's forms serve it

    def check_rows(self, columns: Sequence[str] | None) -> None:
        """Any rows (or none: synthetic tokens); ``--text-column`` and the dataset's checks say the rest."""

    def check_workload(self, task: str, packing_option: bool, text_column: str | None) -> None:
        """Every task and option of autotune's own data path."""

    def plan_note(self, chosen: bool, data: str | None) -> str | None:
        return None

    def trial_arguments(self, arguments: Mapping[str, Any], seq_len: int, loss_on: str) -> dict[str, Any]:
        return dict(arguments)

    def work_counted(self, loss_on: str) -> str | None:
        return None

    def switches_dropout_off(self, base_args: Mapping[str, Any]) -> bool:
        return False  # the model trains with its config's dropout

    def build(self, inputs: TrialInputs) -> Any:
        """The ``Trainer`` on autotune's dataset and collator, with exactly the levers' arguments and the harness's."""
        return inputs.trainer_class(
            model=inputs.model,
            args=inputs.arguments_class(**inputs.arguments),
            train_dataset=inputs.dataset(),
            data_collator=inputs.collator(),
            callbacks=inputs.callbacks,
            **inputs.trainer_kwargs,
        )

    def fullest_batch(self, trainer: Any, micro_batch: int) -> tuple[dict[str, Any], str] | None:
        return None

    def padding_free_collator(self, pad_token_id: int) -> Callable[[list[dict[str, Any]]], Any] | None:
        return None

    def setup_pass(self, trainer: Any) -> tuple[float, int]:
        return 0.0, 0

    def rows_format(self, columns: Sequence[str]) -> str | None:
        return None  # autotune reads a text column itself (spec/dataset.py)

    def columns_kept(self, data: str, columns: Sequence[str]) -> tuple[str, ...]:
        return ()

    def dropped_rows(
        self,
        rows: Iterable[tuple[int, Mapping[str, Any]]],
        tokenizer: Any,
        data: str,
        seq_len: int,
        loss_on: str,
        path: str,
    ) -> int:
        return 0

    def dropped_rows_note(self, dropped: int, total: int, seq_len: int, loss_on: str, path: str) -> str | None:
        return None

    def row_lengths(self, rows: Iterable[Mapping[str, Any]], tokenizer: Any, data: str, loss_on: str) -> list[int]:
        return []  # the Trainer's rows are prepared by autotune (spec.dataset.prepare_dataset), not read here


HF_TRAINER = HfTrainer()
