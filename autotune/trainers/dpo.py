"""``--trainer dpo``: TRL's ``DPOTrainer`` with ``DPOConfig`` (a ``TrainingArguments`` subclass), built as the
user builds it, on the user's preference rows (trl 1.16, trl/trainer/dpo_trainer.py; docs/facts.md, "DPO").

What a trial hands ``DPOTrainer(model=..., ref_model=..., args=DPOConfig(...), train_dataset=...,
processing_class=..., peft_config=...)``:

* the rows as they are (``prompt`` / ``chosen`` / ``rejected``, plain or conversational; a row without
  ``prompt`` has TRL extract it): TRL tokenizes them itself (``_prepare_dataset``, :1036-1142), drops a
  row whose prompt alone fills ``max_length``, and its collator (``DataCollatorForPreference``, :146-210)
  puts prompt + chosen and prompt + rejected in one batch of 2 x micro-batch rows, each truncated to
  ``max_length``, padded to the longest: one forward of the policy (and one of the reference) per micro-batch;
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

A sample is a preference pair (the global batch counts pairs, as ``per_device_train_batch_size`` does
under DPO). The real tokens of a step are the ones in the attention mask of the collated 2 x micro-batch
rows (transformers' ``include_num_input_tokens_seen="non_padding"``: trainer.py
``_track_num_input_tokens``, ``attention_mask.sum()``): the prompt twice, both answers, after truncation,
never the padding. ``precompute_ref_log_probs`` moves the reference's forward out of the steps into one
pass over the dataset before the first: the trial times that pass (:data:`SETUP_PASS`) and the result
counts it over the user's run (``autotune.result``: ``over_the_run``).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from autotune.errors import AutotuneError
from autotune.trainers._kind import CorpusForm, ToolConfig, ToolExport, TrialInputs, arguments_forms
from autotune.trainers._preference_corpus import PREFERENCE_FORMS
from autotune.trainers.sft import cycled, load_tokenizer

# The ``--dataset`` format DPOTrainer reads: a chosen and a rejected answer per row (the prompt beside
# them, or extracted by TRL from their shared start: trl/data_utils.py ``extract_prompt``).
PREFERENCE = "preference"
PREFERENCE_COLUMNS = ("prompt", "chosen", "rejected")
# Rows a preference pair puts in a micro-batch: prompt + chosen and prompt + rejected, one forward for both
# (trl/trainer/dpo_trainer.py, DataCollatorForPreference, :146-210; ``_compute_loss`` splits them, :1316).
ROWS_PER_PAIR = 2
# What the Trainer counts in ``state.num_input_tokens_seen`` under DPO: the collated batch's attention mask,
# chosen and rejected rows alike.
TOKENS_COUNTED = "non_padding"
# Where a trial's trainer says how long its pass before training took (``precompute_ref_log_probs``) and
# over how many samples: the runner reads it after the build.
SETUP_PASS = "_autotune_setup_pass"
# DPOConfig's default: DPOTrainer switches the model's dropout modules off unless the user's arguments say
# ``disable_dropout: false`` (trl/trainer/dpo_config.py:185-188).
DISABLE_DROPOUT_DEFAULT = True


def is_preference(columns: Sequence[str]) -> bool:
    """Whether rows with these columns are preference pairs (TRL's test: a ``chosen`` and a ``rejected``)."""
    return "chosen" in columns and "rejected" in columns


def _renamed(key: str) -> Callable[[Any, Mapping[str, Any]], tuple[dict[str, Any], list[str]]]:
    """The tool's key ``key`` takes the value as it is."""
    return lambda value, _args: ({key: value}, [])


# LLaMA-Factory's pref_loss values (llamafactory/hparams/finetuning_args.py:183-186) that are TRL's loss of
# the same name (its CustomDPOTrainer hands them to TRL's DPO loss; orpo, simpo and kto_pair are its own).
_LLAMA_FACTORY_TRL_LOSSES = ("sigmoid", "hinge", "ipo")


def _llama_factory_loss(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    losses = [value] if isinstance(value, str) else list(value)
    if len(losses) == 1 and losses[0] in _LLAMA_FACTORY_TRL_LOSSES:
        return {"pref_loss": losses[0]}, []
    return {}, [
        f"LLaMA-Factory's pref_loss is one of {', '.join(_LLAMA_FACTORY_TRL_LOSSES)} as TRL has them "
        "(finetuning_args.py:183-186), no combination of losses"
    ]


def _llama_factory_label_smoothing(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # LLaMA-Factory refuses dpo_label_smoothing beside any pref_loss but sigmoid (finetuning_args.py:589-590).
    if value and list(args.get("loss_type") or ["sigmoid"]) != ["sigmoid"]:
        return {}, ["LLaMA-Factory takes dpo_label_smoothing with the sigmoid loss only (finetuning_args.py:589-590)"]
    return {"dpo_label_smoothing": value}, []


# What the exports of the tools built on DPOTrainer say of it (docs/facts.md, "DPO" and "DPO export keys"): the
# trainer's keys in each tool, its loss (written even at TRL's defaults, which the tools need not share), and
# what each tool does otherwise; the fields of the levers (max_length from --seq-len, precompute_ref_log_probs,
# the batch, precision, checkpointing, ...) are the levers' own.
TOOL_EXPORT = ToolExport(
    trl_command="dpo",  # trl/cli/commands/__init__.py:25; trl/scripts/dpo.py:137-145
    written_fields=("beta", "loss_type"),
    model_init=(
        "DPOTrainer applies when it loads the model by name, and to the reference model it loads beside it "
        "(trl/trainer/dpo_trainer.py:560-574, 915-927; trl/trainer/utils.py:1311-1341: without a dtype it loads the "
        "weights in float32; a model you build yourself ignores them, dpo_trainer.py:575-581: build it, and its "
        "reference, so)"
    ),
    tools={
        "axolotl": ToolConfig(
            keys={"rl": "dpo"},
            fields={
                "beta": _renamed("rl_beta"),  # core/builders/rl.py:122-125
                "loss_type": lambda value, args: (
                    {"dpo_loss_type": [value] if isinstance(value, str) else list(value)},
                    [],
                ),
                "loss_weights": _renamed("dpo_loss_weights"),
                "label_smoothing": _renamed("dpo_label_smoothing"),
                "use_weighting": _renamed("dpo_use_weighting"),
            },
            source=(
                "DPO: axolotl/utils/schemas/config.py:264-269 (rl), 308-339 (dpo_*), 1334-1337 (rl_beta); "
                "core/trainers/dpo/__init__.py:20-46 (each to DPOConfig; sequence_len to max_length); "
                "core/builders/rl.py:122-125"
            ),
        ),
        "llama-factory": ToolConfig(
            keys={"stage": "dpo"},  # llamafactory/hparams/finetuning_args.py:460-463
            fields={
                "beta": _renamed("pref_beta"),
                "loss_type": _llama_factory_loss,
                "label_smoothing": _llama_factory_label_smoothing,
            },
            source="DPO: llamafactory/hparams/finetuning_args.py:168-234 (pref_*), 460-463 (stage); train/dpo/trainer.py:44-76",
            notes=(
                "LLaMA-Factory's cutoff_len caps the prompt plus the longer answer, cutting the prompt and the answers "
                "in proportion (data/processor/pairwise.py:58-60, processor_utils.py:76-88) where TRL keeps the start "
                "of prompt + answer and drops a pair whose prompt alone fills max_length: pairs longer than "
                "--seq-len are cut otherwise than the winner's",
                "LLaMA-Factory's DPO collator pads each batch to a multiple of 8 tokens (train/dpo/workflow.py:48-53), "
                "the winner's to its longest row: up to 7 padding tokens more per row",
            ),
        ),
    },
)


class DpoTrainer:
    """TRL's ``DPOTrainer`` (:class:`autotune.trainers.TrainerKind`)."""

    name = "dpo"
    words = "TRL's DPOTrainer"
    option_words = "TRL's DPOTrainer on your preference pairs"
    chosen_words = "prompt/chosen/rejected rows"
    default_arguments_words = "TRL's default DPOConfig"
    baseline_words = "TRL default"
    trainer_class = "trl:DPOTrainer"
    arguments_path = "trl:DPOConfig"
    arguments_named = "a DPOConfig"
    refused_fields: Mapping[str, str] = {
        "max_length": "autotune sets it from --seq-len",
        "model_init_kwargs": (
            "autotune builds the model itself, and DPOTrainer ignores model_init_kwargs for a built model "
            "(dpo_trainer.py:576-581): search attn_implementation and weight_dtype in the --space YAML"
        ),
        "precompute_ref_batch_size": "autotune measures the reference pass at the micro-batch, TRL's default",
        "sync_ref_model": "TRL refuses it beside precompute_ref_log_probs, a lever here (dpo_trainer.py:764-769)",
        "truncation_mode": (
            "autotune counts the pairs TRL drops under its default keep_start; keep_end is deprecated "
            "(dpo_config.py:372-375)"
        ),
    }
    chosen_for_formats: tuple[str, ...] = (PREFERENCE,)
    prepares_rows = True
    honours_use_cache = False  # DPOTrainer passes use_cache=False (dpo_trainer.py:1248, :1291)
    fuses_lm_head = True  # its log-probs go through TRL's fused LM head (dpo_trainer.py:955-962)
    chooses_loss = False  # the DPO loss is beta and loss_type's, in --base-args
    offloads_activations = True  # DPOConfig.activation_offloading (dpo_trainer.py:889-893)
    samples_counted_from_lengths = False  # a sample is a pair, and the global batch counts pairs
    arguments_subclass = True  # trl/trainer/base_config.py:54-75, :107-108
    rows_per_sample = ROWS_PER_PAIR
    holds_reference = True
    # DataCollatorForPreference: "dynamically padded to the maximum length of a batch" (dpo_trainer.py:86-88).
    pads_to_longest = True
    # TRL's batchings but padding to the longest (the packing lever): DPOTrainer 1.16 runs none.
    batchings_refused = (
        "DPOTrainer 1.16 pads each pair's rows to the batch's longest: DPOConfig has no packing, and its "
        'padding-free batches are disabled ("temporarily unavailable": it warns and pads, dpo_trainer.py:732-739)'
    )
    applies_adapters = True  # peft_config to DPOTrainer, as `trl dpo --use_peft` (trl/scripts/dpo.py:101-108)
    tool_forms: tuple[str, ...] = ("trl", "axolotl", "llama-factory")
    tool_export: ToolExport | None = TOOL_EXPORT
    exported_as: Mapping[str, str] = {
        **arguments_forms(arguments_named),
        "trl": "a `trl dpo` command line",
        "axolotl": "an axolotl config fragment (rl: dpo)",
        "llama-factory": "a LLaMA-Factory config fragment (stage: dpo)",
    }
    corpus_forms: Mapping[str, CorpusForm] = PREFERENCE_FORMS  # `chat-corpus --format preference`

    def check_rows(self, columns: Sequence[str] | None) -> None:
        if columns is None:
            raise AutotuneError(
                "--trainer dpo trains on your preference pairs: give --dataset "
                "(pairs: `autotune chat-corpus --format preference --out prefs.jsonl`)"
            )
        if not is_preference(columns):
            raise AutotuneError(
                f"--trainer dpo: the dataset has no chosen and rejected columns (columns: {', '.join(columns)}); "
                "DPOTrainer reads prompt/chosen/rejected rows"
            )

    def check_workload(self, task: str, packing_option: bool, text_column: str | None) -> None:
        """What ``--trainer dpo`` cannot train: TRL not installed, a model that is not a causal LM,
        autotune's own ``--packing`` and ``--text-column``."""
        if importlib.util.find_spec("trl") is None:
            raise AutotuneError("--trainer dpo trains through TRL's DPOTrainer: pip install 'autotune[sft]'")
        if task != "causal-lm":
            raise AutotuneError(f"--trainer dpo trains causal language models; the model trains as {task}")
        if packing_option:
            raise AutotuneError("--packing is the Trainer's packing; DPOTrainer pads each pair's rows: drop --packing")
        if text_column is not None:
            raise AutotuneError(
                "--text-column picks the Trainer's text column; DPOTrainer reads prompt/chosen/rejected"
            )

    def plan_note(self, chosen: bool, data: str | None) -> str | None:
        how = "--trainer dpo" if chosen else "the --dataset holds preference pairs"
        return (
            f"trainer: {self.words} on your preference pairs, TRL preparing them in every trial; a sample is a pair, "
            f"its chosen and rejected rows in one batch ({how})"
        )

    def trial_arguments(self, arguments: Mapping[str, Any], seq_len: int, loss_on: str) -> dict[str, Any]:
        """The ``DPOConfig`` keyword arguments of a trial: the levers' and the user's, and ``max_length``
        from ``--seq-len`` (each of the pair's rows, prompt + answer, truncated to it)."""
        return {**arguments, "max_length": seq_len}

    def work_counted(self, loss_on: str) -> str | None:
        return (
            "model TFLOPs count every real (non-padding) token of both rows of each pair, prompt twice, forward and "
            "backward of the policy; the reference's forward is not counted as model work, and a precomputed "
            "reference pass is counted in the time of the user's run"
        )

    def switches_dropout_off(self, base_args: Mapping[str, Any]) -> bool:
        """``DPOConfig.disable_dropout`` (default True): ``DPOTrainer`` sets every ``nn.Dropout`` of the policy and
        the reference to ``p = 0`` (trl/trainer/dpo_trainer.py:931-935, trl/trainer/utils.py
        ``disable_dropout_in_model``)."""
        return bool(base_args.get("disable_dropout", DISABLE_DROPOUT_DEFAULT))

    def build(self, inputs: TrialInputs) -> Any:
        """The trial's ``DPOTrainer``: TRL's own preparation, reference model and collator, its rows cycled to
        what the steps take after TRL's preparation and its reference pass (which stays one pass over the rows)."""
        import datasets

        assert inputs.prepared_dir is not None and inputs.tokenizer_dir is not None, "--trainer dpo needs rows"
        datasets.disable_progress_bars()
        arguments = self.trial_arguments(inputs.arguments, inputs.seq_len, inputs.loss_on)
        trainer = timed_setup_pass(inputs.trainer_class)(
            model=inputs.model,
            ref_model=reference_model(inputs.model, inputs.reference_copy),
            args=inputs.arguments_class(**arguments),
            train_dataset=datasets.load_from_disk(inputs.prepared_dir),
            processing_class=load_tokenizer(inputs.tokenizer_dir),
            callbacks=inputs.callbacks,
            peft_config=inputs.peft_config,
            **inputs.trainer_kwargs,
        )
        trainer.train_dataset = cycled(trainer.train_dataset, inputs.rows_wanted)
        return trainer

    def fullest_batch(self, trainer: Any, micro_batch: int) -> tuple[dict[str, Any], str] | None:
        """The fullest micro-batch the trial's prepared pairs can make, built by TRL's own collator: the
        ``micro_batch`` pairs with the most tokens (prompt + the longer answer), and its words."""
        rows = trainer.train_dataset
        prompts = [len(ids) for ids in rows["prompt_ids"]]
        answers = [max(len(c), len(r)) for c, r in zip(rows["chosen_ids"], rows["rejected_ids"], strict=True)]
        lengths = [p + a for p, a in zip(prompts, answers, strict=True)]
        longest = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:micro_batch]
        batch = trainer.data_collator([rows[i] for i in longest])
        shape = "x".join(str(n) for n in batch["input_ids"].shape)
        return batch, (
            f"worst-case batch: the {len(longest)} longest pairs as TRL's collator builds them (chosen and rejected "
            f"rows), {shape} tokens"
        )

    def padding_free_collator(self, pad_token_id: int) -> Callable[[list[dict[str, Any]]], Any] | None:
        return None  # no padding-free batching runs under DPOTrainer 1.16 (batchings_refused)

    def setup_pass(self, trainer: Any) -> tuple[float, int]:
        return getattr(trainer, SETUP_PASS, (0.0, 0))

    def rows_format(self, columns: Sequence[str]) -> str | None:
        return PREFERENCE if is_preference(columns) else None

    def columns_kept(self, data: str, columns: Sequence[str]) -> tuple[str, ...]:
        """The columns of the user's rows the trials hand DPOTrainer (and TRL's per-row extras it renders with)."""
        from autotune.spec.sft_rows import ROW_EXTRAS

        return tuple(c for c in (*PREFERENCE_COLUMNS, *ROW_EXTRAS) if c in columns)

    def dropped_rows(
        self,
        rows: Iterable[tuple[int, Mapping[str, Any]]],
        tokenizer: Any,
        data: str,
        seq_len: int,
        loss_on: str,
        path: str,
    ) -> int:
        """Check the rows as DPOTrainer will read them, and count those it drops (a prompt of ``seq_len``
        tokens or more: dpo_trainer.py:1136-1140).

        Raises:
            AutotuneError: The first row whose prompt or answers are missing, of another form, or that the
                tokenizer (its chat template, for conversational rows) fails on.
        """
        from autotune.spec.sft_rows import RowFault

        dropped = 0
        for index, row in rows:
            try:
                dropped += len(prompt_ids(row, tokenizer)) >= seq_len
            except (ValueError, TypeError, KeyError, RowFault) as fault:
                raise AutotuneError(f"--dataset {path}: row {index + 1}: {fault}") from None
        return dropped

    def row_lengths(self, rows: Iterable[Mapping[str, Any]], tokenizer: Any, data: str, loss_on: str) -> list[int]:
        """Each pair's two rows, prompt + chosen then prompt + rejected, as the collator batches them."""
        return [len(answer_ids(row, answer, tokenizer)) for row in rows for answer in ("chosen", "rejected")]

    def dropped_rows_note(self, dropped: int, total: int, seq_len: int, loss_on: str, path: str) -> str | None:
        """The note of the pairs TRL drops, ``None`` for none.

        Raises:
            AutotuneError: Every pair is dropped: a trial would have nothing to train on.
        """
        if dropped == total:
            raise AutotuneError(
                f"--dataset {path}: every prompt fills the first {seq_len} tokens (TRL drops a pair whose prompt alone "
                "reaches max_length): raise --seq-len, or shorten the prompts"
            )
        if not dropped:
            return None
        return (
            f"TRL drops {dropped} of the {total} pairs the trials train on: their prompt alone fills {seq_len} tokens "
            "(--seq-len is max_length; your run drops them too)"
        )


def answer_ids(row: Mapping[str, Any], answer: str, tokenizer: Any) -> list[int]:
    """The prompt + ``answer`` row's tokens as DPOTrainer makes them (dpo_trainer.py:1074-1100): the chat
    template over prompt + answer for messages; for text, the tokenizer over prompt + answer with TRL's
    end-of-sequence token added (:1050-1068)."""
    prompt, value = row.get("prompt"), row[answer]
    if isinstance(value, list):
        from autotune.spec.sft_rows import chat_tokens

        return chat_tokens(row, (prompt or []) + value, tokenizer)
    eos = tokenizer.eos_token or ""
    text = (prompt or "") + (value if value.endswith(eos) else value + eos)
    return list(tokenizer(text)["input_ids"])


def prompt_ids(row: Mapping[str, Any], tokenizer: Any) -> list[int]:
    """The prompt's tokens as DPOTrainer makes them (dpo_trainer.py:1074-1118): the chat template with the
    generation prompt for messages, the tokenizer for text; a row without a prompt has none here (TRL takes
    the answers' shared start, which is no longer than either)."""
    conversational = [isinstance(row.get(key), list) for key in PREFERENCE_COLUMNS if key in row]
    if len(set(conversational)) > 1:
        raise ValueError("prompt, chosen and rejected must all be text or all lists of messages")
    for key in ("chosen", "rejected"):
        value = row.get(key)
        if value is None or (isinstance(value, str) and not value):
            raise ValueError(f"{key} is empty")
        if not isinstance(value, str | list):
            raise TypeError(f"{key} is {type(value).__name__}: TRL reads a string or a list of messages")
    prompt = row.get("prompt")
    if prompt is None:
        return []
    if isinstance(prompt, list):
        for message in prompt + row["chosen"] + row["rejected"]:
            if not (isinstance(message, dict) and "role" in message and "content" in message):
                raise ValueError(f"a message is not a role/content dict: {json.dumps(message)[:80]}")
        from autotune.spec.sft_rows import chat_tokens

        # Bounded, with the row's tools and template keywords, as TRL renders it (tokenize_fn, :1075-1086).
        return chat_tokens(row, prompt, tokenizer, add_generation_prompt=True)
    if not isinstance(prompt, str):
        raise TypeError(f"prompt is {type(prompt).__name__}: TRL reads a string or a list of messages")
    return list(tokenizer(prompt)["input_ids"])


def reference_model(model: Any, reference_copy: bool) -> Any:
    """The reference model the trial hands ``DPOTrainer``: a copy of the built model where the user's run
    loads one (``ModelSpec.keeps_reference_copy``), else ``None``, as TRL has it."""
    if not reference_copy:
        return None
    reference = copy.deepcopy(model)
    reference.eval()
    return reference


def timed_setup_pass(trainer_class: type) -> type:
    """``trainer_class`` whose reference pass before training (``_precompute_ref_logps``, run in ``__init__``
    under ``precompute_ref_log_probs``: dpo_trainer.py:1013-1019) records its seconds and samples in
    :data:`SETUP_PASS`; the pass itself unchanged."""
    if not hasattr(trainer_class, "_precompute_ref_logps"):
        return trainer_class

    class Timed(trainer_class):
        def _precompute_ref_logps(self, dataset: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            done = super()._precompute_ref_logps(dataset, *args, **kwargs)
            seconds, samples = getattr(self, SETUP_PASS, (0.0, 0))
            setattr(self, SETUP_PASS, (seconds + time.perf_counter() - started, samples + len(dataset)))
            return done

    Timed.__name__ = Timed.__qualname__ = trainer_class.__name__
    return Timed


def batch_real_tokens(batch: Mapping[str, Any]) -> int:
    """The real tokens of a collated DPO batch (prompt + chosen and prompt + rejected rows): its attention
    mask's ones, as the Trainer counts them under :data:`TOKENS_COUNTED`."""
    return int(batch["attention_mask"].sum())


DPO = DpoTrainer()
