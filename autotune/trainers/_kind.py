"""What every trainer answers (:class:`TrainerKind`), and what a trial hands its trainer's build.

The rest of autotune asks a trainer object these questions and never compares a trainer's name: each
attribute says *what* differs between trainers (``prepares_rows``, ``fuses_lm_head``, ...), so a new
trainer answers them once, in its own module (docs/architecture.md, "Adding a trainer").
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from autotune.spec.models import ModelSpec


def class_named(name: str) -> type:
    """The class ``module:Class`` names (imported where it is asked for: the trial child, a check)."""
    module, _, attribute = name.partition(":")
    return getattr(importlib.import_module(module), attribute)


# How a tool says one of the arguments' fields: (its value, every argument) -> (the tool's keys, comment lines),
# a comment line being what the tool cannot express, or, starting with ``note: ``, what a reader of the keys
# must know (the levers' ``Mapper``, autotune/levers/_exports.py, which the trainers cannot import).
FieldMapper = Callable[[Any, Mapping[str, Any]], tuple[dict[str, Any], list[str]]]


@dataclasses.dataclass(frozen=True)
class ToolConfig:
    """How a YAML tool built on a trainer (axolotl, LLaMA-Factory) says that trainer's run.

    Attributes:
        keys: The keys that choose the trainer in the tool's config (axolotl's ``rl: dpo``).
        fields: The trainer's own arguments' fields (those no lever writes) as the tool's keys.
        source: Where those keys are read, for the fragment's header (docs/facts.md has the lines).
        notes: What the tool does otherwise under this trainer that no key says.
    """

    keys: Mapping[str, Any]
    fields: Mapping[str, FieldMapper]
    source: str = ""
    notes: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ToolExport:
    """What the export forms of the tools built on a trainer (:attr:`TrainerKind.tool_forms`) say of it.

    Attributes:
        trl_command: TRL's command line of the trainer, ``trl <it>`` (its parser: ``trl/scripts/<it>.py``,
            ``make_parser``).
        written_fields: The arguments' fields its exports write even at the class's default: what decides
            the batching (SFT's packing) or the loss (DPO's beta), which the tools default otherwise.
        model_init: How the trainer applies the arguments' ``model_init_kwargs`` (the model's build), with
            sources: the export's note.
        tools: Each YAML tool's :class:`ToolConfig`, by export form.
    """

    trl_command: str
    written_fields: tuple[str, ...]
    model_init: str
    tools: Mapping[str, ToolConfig]


@dataclasses.dataclass(frozen=True)
class CorpusForm:
    """One ``autotune chat-corpus --format`` a trainer adds: generated rows of its own (nothing downloaded),
    beyond the chat corpus's forms (``autotune.spec.chat_corpus.FORMATS``).

    Attributes:
        words: The form in ``--format``'s help.
        rows_words: What its rows are, in the command's line (``preference pairs``).
        write: Writes ``samples`` rows of the corpus ``seed`` at ``length_scale`` to ``out`` (a path or an
            ``autotune.spec.files.Destination``) as ``autotune.spec.chat_corpus.write_rows`` writes them,
            and returns their tokens under the synthetic tokenizer: ``write(out, samples, seed, length_scale)``.
    """

    words: str
    rows_words: str
    write: Callable[[Any, int, int, float], int]


@dataclasses.dataclass(frozen=True)
class TrialInputs:
    """What a trial hands its trainer's :meth:`TrainerKind.build`, from the trial child (``autotune.runner``).

    Attributes:
        trainer_class: The trainer class (the trainer's own, or the one a lever chose over it).
        arguments_class: Its arguments class.
        trainer_kwargs: Every lever's keyword arguments of the trainer's constructor.
        arguments: The arguments' keyword arguments: the levers' (every lever field the class resolves
            otherwise already explicit) and the harness's.
        model: The model autotune built.
        callbacks: The trial's callbacks (the loss recorder, the step timer, ...).
        seq_len: The study's ``--seq-len``.
        loss_on: The study's ``--loss-on`` (``all`` where the trainer takes no such choice).
        rows_wanted: The rows the trial's steps take (global batch x (steps + 1)).
        dataset: autotune's dataset of the trial's batching (synthetic tokens, or the rows tokenized).
        collator: The data collator of the trial's batching (``None``: the Trainer's default).
        prepared_dir: Where the parent saved the user's rows as they are, for a trainer that prepares them.
        tokenizer_dir: The tokenizer's directory of those rows.
        peft_config: ``--peft``'s adapters for a trainer that applies them itself
            (:attr:`TrainerKind.applies_adapters`); ``None`` otherwise (the model comes wrapped).
        reference_copy: A preference trainer keeps a second copy of the model as its reference
            (``ModelSpec.keeps_reference_copy``: not under PEFT, nor with the reference's log-probabilities
            precomputed), the rule the memory estimate reads too.
    """

    trainer_class: type
    arguments_class: type
    trainer_kwargs: Mapping[str, Any]
    arguments: Mapping[str, Any]
    model: Any
    callbacks: list[Any]
    seq_len: int
    loss_on: str
    rows_wanted: int
    dataset: Callable[[], Any]
    collator: Callable[[], Any]
    prepared_dir: str | None = None
    tokenizer_dir: str | None = None
    peft_config: Any = None
    reference_copy: bool = False


class TrainerKind(Protocol):
    """One trainer a study's trials can train through (``--trainer``): one module of ``autotune.trainers`` each.

    Attributes:
        name: The ``--trainer`` value, and what a study's identity keeps.
        words: The trainer in words (``the transformers Trainer``).
        option_words: The trainer in the ``--trainer`` option's help (``transformers' Trainer``).
        chosen_words: The rows it is chosen for, in that help (``messages or prompt/completion rows``;
            ``""`` where :attr:`chosen_for_formats` is empty).
        default_arguments_words: Its arguments class at its defaults, the first seed's baseline, in words.
        baseline_words: The same, short (tables, the loss comparison).
        trainer_class: The trainer class, ``module:Class``.
        arguments_path: Its arguments class, ``module:Class``.
        arguments_named: The arguments class with its article, as a sentence names it (``a TrainingArguments``).
        refused_fields: The arguments' fields autotune sets itself under this trainer (inside every trial),
            each with why: a ``--base-args`` file may not set them.
        chosen_for_formats: The ``--dataset`` formats (``autotune.spec.sft.FORMATS``) for which this
            trainer is chosen when ``--trainer`` is not given.
        prepares_rows: The trainer prepares, tokenizes and batches the user's rows itself in each trial
            (TRL's): autotune's dataset and collators (the ``padding`` lever) do not apply, its own
            batching levers do, and a trial meets its fullest batch through its collator.
        honours_use_cache: The arguments' ``use_cache`` reaches the model's forward in training.
        fuses_lm_head: Its loss runs through a fused language-model head, whose chunks replace the
            logits in the memory estimate (``ModelSpec.fused_lm_head``).
        chooses_loss: ``--loss-on`` chooses its loss.
        offloads_activations: Its arguments have TRL's ``activation_offloading``.
        samples_counted_from_lengths: A step's samples are counted from the samples its batches held
            (packing puts several in a row), not from the global batch.
        arguments_subclass: Its arguments class is a ``TrainingArguments`` subclass whose defaults differ:
            its exports write each differing default as the winner trained, and the model's build in the
            arguments (``model_init_kwargs``).
        rows_per_sample: Rows one sample puts in a micro-batch (DPO: the chosen and the rejected), which the
            memory estimate's activations and LM head see (``ModelSpec.rows_per_sample``).
        holds_reference: It keeps a frozen reference copy of the model beside the policy, but under PEFT
            (the adapters disabled) or a precomputed reference pass (``ModelSpec.holds_reference``).
        pads_to_longest: Its own collator pads each micro-batch to the batch's longest row where no batching
            lever shapes the batch (``ModelSpec.pads_to_longest``): a smaller micro-batch then carries less
            padding, which the throughput prior counts from the user's rows.
        batchings_refused: Why it runs none of TRL's batchings but padding to the batch's longest (the
            packing lever's other values); ``""``: it runs them.
        applies_adapters: It applies ``--peft``'s adapters itself (``peft_config``), as its command line does:
            the trial hands it the base model and :attr:`TrialInputs.peft_config`.
        tool_forms: The export forms of the tools built on this trainer (``trl``, axolotl, ...), beyond
            the arguments' ``json``, ``cli`` and ``python``.
        tool_export: What those forms say of it (``None``: it has none).
        exported_as: What each of its export forms holds, in words.
        corpus_forms: The ``chat-corpus --format`` forms of generated rows it adds, by name (``{}``: none;
            the chat corpus's own forms serve every trainer).
    """

    name: str
    words: str
    option_words: str
    chosen_words: str
    default_arguments_words: str
    baseline_words: str
    trainer_class: str
    arguments_path: str
    arguments_named: str
    refused_fields: Mapping[str, str]
    chosen_for_formats: tuple[str, ...]
    prepares_rows: bool
    honours_use_cache: bool
    fuses_lm_head: bool
    chooses_loss: bool
    offloads_activations: bool
    samples_counted_from_lengths: bool
    arguments_subclass: bool
    rows_per_sample: int
    holds_reference: bool
    pads_to_longest: bool
    batchings_refused: str
    applies_adapters: bool
    tool_forms: tuple[str, ...]
    tool_export: ToolExport | None
    exported_as: Mapping[str, str]
    corpus_forms: Mapping[str, CorpusForm]

    def check_rows(self, columns: Sequence[str] | None) -> None:
        """Refuse (``AutotuneError``, one line) a ``--dataset`` this trainer cannot read (``None``: none given)."""
        ...

    def check_workload(self, task: str, packing_option: bool, text_column: str | None) -> None:
        """Refuse (``AutotuneError``, one line) what this trainer cannot train: the model's task, options it ignores."""
        ...

    def plan_note(self, chosen: bool, data: str | None) -> str | None:
        """The plan's line saying which trainer trains (``chosen``: by ``--trainer``); ``None``: nothing to say."""
        ...

    def trial_arguments(self, arguments: Mapping[str, Any], seq_len: int, loss_on: str) -> dict[str, Any]:
        """The arguments of a trial with the fields this trainer forces in every trial (the loss, the length)."""
        ...

    def work_counted(self, loss_on: str) -> str | None:
        """What the ranking's model TFLOPs count, in one sentence where it needs saying (``None``: nothing to add)."""
        ...

    def switches_dropout_off(self, base_args: Mapping[str, Any]) -> bool:
        """Whether it sets every ``nn.Dropout`` module of the model to ``p = 0`` before training under these
        ``--base-args`` (``ModelSpec.dropout_modules_off``: the throughput prior then counts no draws for them)."""
        ...

    def build(self, inputs: TrialInputs) -> Any:
        """The trial's trainer object, its data and collator (in the trial child)."""
        ...

    def fullest_batch(self, trainer: Any, micro_batch: int) -> tuple[dict[str, Any], str] | None:
        """The fullest micro-batch its collator can make of the trial's rows, and its words; ``None``:
        autotune's batching says it (``autotune.runner._loader.worst_case_batch``)."""
        ...

    def padding_free_collator(self, pad_token_id: int) -> Callable[[list[dict[str, Any]]], Any] | None:
        """The collator that flattens samples into one row under this trainer; ``None``: the ``padding``
        lever's (transformers' ``DataCollatorWithFlattening``)."""
        ...

    def setup_pass(self, trainer: Any) -> tuple[float, int]:
        """Seconds and samples of the pass the built trainer ran over its rows before training, once per run
        (DPO's ``precompute_ref_log_probs``); ``(0.0, 0)``: none."""
        ...

    def rows_format(self, columns: Sequence[str]) -> str | None:
        """The format of rows with these columns this trainer reads (``None``: none it reads)."""
        ...

    def columns_kept(self, data: str, columns: Sequence[str]) -> tuple[str, ...]:
        """The columns of the user's rows (of format ``data``) the trials hand the trainer as they are."""
        ...

    def dropped_rows(
        self,
        rows: Iterable[tuple[int, Mapping[str, Any]]],
        tokenizer: Any,
        data: str,
        seq_len: int,
        loss_on: str,
        path: str,
    ) -> int:
        """Check (index, row) pairs as the trainer will read them, and count those it drops within ``seq_len``.

        Raises:
            AutotuneError: The first row the trainer or the tokenizer fails on, named, with the fault.
        """
        ...

    def dropped_rows_note(self, dropped: int, total: int, seq_len: int, loss_on: str, path: str) -> str | None:
        """The note of the rows the trainer drops (``None``: none).

        Raises:
            AutotuneError: Every row is dropped.
        """
        ...

    def row_lengths(self, rows: Iterable[Mapping[str, Any]], tokenizer: Any, data: str, loss_on: str) -> list[int]:
        """Each row's tokens as the trainer tokenizes it, before truncation, one length per row a micro-batch
        holds (DPO: a pair's prompt + chosen, then its prompt + rejected): the throughput prior's typical
        batch (``autotune.estimate.typical_micro_batch``). Rows :meth:`dropped_rows` has checked."""
        ...


def arguments_forms(arguments_named: str) -> dict[str, str]:
    """What the arguments' own export forms hold, in words, for the class ``arguments_named`` names."""
    cls = arguments_named.split(" ", 1)[1]
    return {
        "json": f"{cls}(**json) keyword arguments",
        "cli": f"{cls} flags for HfArgumentParser",
        "python": f"{arguments_named}(...) snippet",
        "accelerate": "an accelerate launch config",
    }


def with_model(model: ModelSpec, kind: TrainerKind, base_args: Mapping[str, Any] | None = None) -> ModelSpec:
    """The model as ``kind`` trains it under ``base_args`` (the ``--base-args``; ``None``: none): with its fused
    language-model head where it has one, the rows a sample puts in a micro-batch, its reference copy where it
    keeps one, how its collator pads, and whether it switches the model's dropout modules off."""
    return dataclasses.replace(
        model,
        fused_lm_head=model.fused_lm_head or kind.fuses_lm_head,
        rows_per_sample=kind.rows_per_sample,
        holds_reference=kind.holds_reference,
        pads_to_longest=kind.pads_to_longest,
        dropout_modules_off=kind.switches_dropout_off(base_args or {}),
    )
