"""``--trainer sft``: TRL's ``SFTTrainer`` with ``SFTConfig`` (a ``TrainingArguments`` subclass), built as
the user builds it, on the user's rows.

A trial hands ``SFTTrainer(model=..., args=SFTConfig(...), train_dataset=..., processing_class=...)``
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

The rows' formats, the loss (``--loss-on``) and the chat template's checks are the workload's
(``autotune.spec.sft``); this module is the trainer's seam.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from autotune.errors import AutotuneError
from autotune.spec.models import NO_MODEL_CODE
from autotune.spec.sft import data_format, sft_arguments, trains_untruncated, work_counted
from autotune.trainers._kind import CorpusForm, ToolConfig, ToolExport, TrialInputs, arguments_forms


def _loss_on_axolotl(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # train_on_inputs: false masks the prompt; chat_template datasets train the assistant's turns by default
    # (roles_to_train: ["assistant"], axolotl/utils/schemas/datasets.py:163-175).
    on_all = not args.get("completion_only_loss") and not args.get("assistant_only_loss")
    return {"train_on_inputs": on_all}, []


def _loss_on_llama_factory(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # train_on_prompt: false (the default) trains the responses only (llamafactory/hparams/data_args.py:50-57).
    on_all = not args.get("completion_only_loss") and not args.get("assistant_only_loss")
    return {"train_on_prompt": on_all}, []


def _said_beside(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Said by the other loss field's mapper (the loss is one choice in two fields)."""
    return {}, []


# What the exports of the tools built on SFTTrainer say of it (docs/facts.md, "SFT export keys"): the loss's
# two fields, one choice, as each tool's key; the rows are batched as the packing lever's fields say, written
# even at TRL's default (sft_config.py:222-258).
TOOL_EXPORT = ToolExport(
    trl_command="sft",
    written_fields=("packing", "padding_free"),
    model_init=(
        "SFTTrainer applies when it loads the model by name (trl/trainer/utils.py:1311-1341: without a dtype it "
        "loads the weights in float32; a model you build yourself ignores them, sft_trainer.py:697-708: build it so)"
    ),
    tools={
        "axolotl": ToolConfig(
            keys={},  # axolotl trains SFT unless `rl` names another trainer
            fields={"completion_only_loss": _loss_on_axolotl, "assistant_only_loss": _said_beside},
        ),
        "llama-factory": ToolConfig(
            keys={"stage": "sft"},  # llamafactory/hparams/finetuning_args.py:460-463 (its default)
            fields={"completion_only_loss": _loss_on_llama_factory, "assistant_only_loss": _said_beside},
        ),
    },
)


class SftTrainer:
    """TRL's ``SFTTrainer`` (:class:`autotune.trainers.TrainerKind`)."""

    name = "sft"
    words = "TRL's SFTTrainer"
    option_words = "TRL's SFTTrainer on your rows"
    chosen_words = "messages or prompt/completion rows"
    default_arguments_words = "TRL's default SFTConfig"
    baseline_words = "TRL default"
    trainer_class = "trl:SFTTrainer"
    arguments_path = "trl:SFTConfig"
    arguments_named = "an SFTConfig"
    # SFTConfig fields autotune sets itself under sft: a --base-args file may not.
    refused_fields: Mapping[str, str] = {
        "max_length": "autotune sets it from --seq-len",
        "model_init_kwargs": (
            "autotune builds the model itself, and SFTTrainer ignores model_init_kwargs for a built model "
            "(sft_trainer.py:697-708): search attn_implementation and weight_dtype in the --space YAML"
        ),
        "dataset_kwargs": "autotune hands SFTTrainer the rows as they are, for TRL to prepare",
    }
    # Chat and prompt/completion rows are what SFTTrainer is for; a text column trains under either.
    chosen_for_formats: tuple[str, ...] = ("messages", "prompt-completion")
    prepares_rows = True
    honours_use_cache = False  # SFTTrainer.compute_loss passes use_cache=False
    fuses_lm_head = True  # trl/trainer/sft_trainer.py:1142-1147
    chooses_loss = True
    offloads_activations = True  # SFTConfig.activation_offloading
    samples_counted_from_lengths = True  # TRL's packing puts several samples in a row
    arguments_subclass = True  # trl/trainer/base_config.py:54-75, :107-108
    rows_per_sample = 1
    holds_reference = False
    # packing off: DataCollatorForLanguageModeling, "dynamically padded to the maximum length of a batch"
    # (trl/trainer/sft_trainer.py:87-89).
    pads_to_longest = True
    batchings_refused = ""
    applies_adapters = False  # the trial wraps the model (get_peft_model), as `SFTTrainer(model=peft_model)` takes it
    tool_forms: tuple[str, ...] = ("trl", "axolotl", "llama-factory")
    tool_export: ToolExport | None = TOOL_EXPORT
    exported_as: Mapping[str, str] = {
        **arguments_forms(arguments_named),
        "trl": "a `trl sft` command line",
        "axolotl": "an axolotl config fragment",
        "llama-factory": "a LLaMA-Factory config fragment",
    }
    corpus_forms: Mapping[str, CorpusForm] = {}  # the chat corpus's forms serve it

    def check_rows(self, columns: Sequence[str] | None) -> None:
        if columns is None:
            raise AutotuneError(
                "--trainer sft trains on your rows: give --dataset (chat rows: `autotune chat-corpus --out chat.jsonl`)"
            )
        if data_format(columns) is None:
            raise AutotuneError(
                f"--trainer sft: the dataset has no messages, prompt and completion, or text column "
                f"(columns: {', '.join(columns)}); SFTTrainer reads one of those"
            )

    def check_workload(self, task: str, packing_option: bool, text_column: str | None) -> None:
        """What ``--trainer sft`` cannot train: TRL not installed, a model that is not a causal LM,
        autotune's own ``--packing``, the Trainer's ``--text-column``."""
        if importlib.util.find_spec("trl") is None:
            raise AutotuneError("--trainer sft trains through TRL's SFTTrainer: pip install 'autotune[sft]'")
        if task != "causal-lm":
            raise AutotuneError(
                f"--trainer sft trains causal language models; the model trains as {task} (use --trainer trainer)"
            )
        if packing_option:
            raise AutotuneError(
                "--packing is the Trainer's packing; under --trainer sft TRL packs: search `packing: [off, bfd]` in the --space YAML"
            )
        if text_column is not None:
            raise AutotuneError(
                "--text-column picks the Trainer's text column; under --trainer sft SFTTrainer reads messages, "
                "prompt/completion or text: rename the column, or set dataset_text_field in --base-args"
            )

    def plan_note(self, chosen: bool, data: str | None) -> str | None:
        how = "--trainer sft" if chosen else f"the --dataset holds {data} rows; --trainer trainer for the Trainer"
        return f"trainer: {self.words} on your rows, TRL preparing them in every trial ({how})"

    def trial_arguments(self, arguments: Mapping[str, Any], seq_len: int, loss_on: str) -> dict[str, Any]:
        return sft_arguments(arguments, seq_len, loss_on)

    def work_counted(self, loss_on: str) -> str | None:
        return work_counted(loss_on)

    def switches_dropout_off(self, base_args: Mapping[str, Any]) -> bool:
        return False  # SFTConfig 1.16 has no disable_dropout: the model trains with its config's dropout

    def build(self, inputs: TrialInputs) -> Any:
        """The trial's ``SFTTrainer``, its data prepared by TRL and cycled to what the steps take."""
        import datasets

        assert inputs.prepared_dir is not None and inputs.tokenizer_dir is not None, (
            "--trainer sft needs rows and a tokenizer"
        )
        datasets.disable_progress_bars()
        kwargs = self.trial_arguments(inputs.arguments, inputs.seq_len, inputs.loss_on)
        trainer = inputs.trainer_class(
            model=inputs.model,
            args=inputs.arguments_class(**kwargs),
            train_dataset=datasets.load_from_disk(inputs.prepared_dir),
            processing_class=load_tokenizer(inputs.tokenizer_dir),
            callbacks=inputs.callbacks,
            **inputs.trainer_kwargs,
        )
        rows = trainer.train_dataset
        if trains_untruncated(kwargs):
            rows = truncated(rows, inputs.seq_len)
        trainer.train_dataset = cycled(rows, inputs.rows_wanted)
        return trainer

    def fullest_batch(self, trainer: Any, micro_batch: int) -> tuple[dict[str, Any], str] | None:
        """The fullest micro-batch the trial's prepared rows can make, built by TRL's own collator: the
        ``micro_batch`` longest rows (a packed row's length is its samples' together), and its words."""
        rows = trainer.train_dataset
        lengths = [len(ids) for ids in rows["input_ids"]]
        longest = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:micro_batch]
        batch = trainer.data_collator([rows[i] for i in longest])
        shape = "x".join(str(n) for n in batch["input_ids"].shape)
        return batch, f"worst-case batch: the {len(longest)} longest rows as TRL's collator builds them, {shape} tokens"

    def padding_free_collator(self, pad_token_id: int) -> Callable[[list[dict[str, Any]]], Any] | None:
        """The collator SFTTrainer builds for ``padding_free`` and ``bfd`` (trl/trainer/sft_trainer.py:
        ``DataCollatorForLanguageModeling(padding_free=True)``)."""
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        return DataCollatorForLanguageModeling(pad_token_id=pad_token_id, padding_free=True)

    def setup_pass(self, trainer: Any) -> tuple[float, int]:
        return 0.0, 0

    def rows_format(self, columns: Sequence[str]) -> str | None:
        return data_format(columns)

    def columns_kept(self, data: str, columns: Sequence[str]) -> tuple[str, ...]:
        from autotune.spec.sft import FORMAT_COLUMNS
        from autotune.spec.sft_rows import ROW_EXTRAS

        return (*FORMAT_COLUMNS[data], *(c for c in ROW_EXTRAS if c in columns))

    def dropped_rows(
        self,
        rows: Iterable[tuple[int, Mapping[str, Any]]],
        tokenizer: Any,
        data: str,
        seq_len: int,
        loss_on: str,
        path: str,
    ) -> int:
        """The rows as TRL reads them (``autotune.spec.sft_rows.check_rows``): those left without a label;
        first the chat template, which must render them (and mark the assistant's tokens under that loss)."""
        from autotune.spec.sft import check_chat_template
        from autotune.spec.sft_rows import check_rows

        check_chat_template(tokenizer, loss_on, data)  # fits the vocabulary too
        return check_rows(rows, tokenizer, data, loss_on, seq_len, path)

    def dropped_rows_note(self, dropped: int, total: int, seq_len: int, loss_on: str, path: str) -> str | None:
        from autotune.spec.sft_rows import dropped_rows_note

        return dropped_rows_note(dropped, total, seq_len, loss_on, path)

    def row_lengths(self, rows: Iterable[Mapping[str, Any]], tokenizer: Any, data: str, loss_on: str) -> list[int]:
        from autotune.spec.sft_rows import sft_row_lengths

        return sft_row_lengths(rows, tokenizer, data, loss_on)


def load_tokenizer(directory: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(directory, local_files_only=True, **NO_MODEL_CODE)


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
        raise RuntimeError("TRL's preparation left no row to train on (every sample masked or too long?)")
    if len(rows) >= wanted:
        return rows
    return rows.select([index % len(rows) for index in range(wanted)])


SFT = SftTrainer()
