"""The trainers a study's trials train through (``--trainer``): one module each, behind one Protocol.

* ``trainer`` (:mod:`autotune.trainers.hf_trainer`): the transformers ``Trainer`` with
  ``TrainingArguments``, on synthetic tokens or a ``text`` column autotune tokenizes.
* ``sft`` (:mod:`autotune.trainers.sft`): TRL's ``SFTTrainer`` with ``SFTConfig``, on the user's rows
  as they are, which TRL prepares, packs and batches itself in each trial.
* ``dpo`` (:mod:`autotune.trainers.dpo`): TRL's ``DPOTrainer`` with ``DPOConfig``, on the user's preference
  pairs as they are, with the reference model the user's run keeps.

The trainer is the workload's, like ``--peft``: fixed for a study (its identity holds it), never
searched. Each trainer owns its arguments class and its default (the first seed), how a trial builds
its trainer, data and collator, how it counts samples, the fields it refuses or forces inside trials,
its export forms and its words (:class:`TrainerKind`). The rest of autotune asks the trainer object
(:func:`get`) and never compares a trainer's name; ``tests/trainers/test_trainer_home.py`` checks it.

A foundation, after ``spec``: it imports ``spec`` only (and the libraries, inside the functions that
need them), and ``levers``, the runner, the study and the views ask it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import AutotuneError
from autotune.trainers._kind import (
    CorpusForm,
    FieldMapper,
    ToolConfig,
    ToolExport,
    TrainerKind,
    TrialInputs,
    class_named,
    with_model,
)
from autotune.trainers.dpo import DPO
from autotune.trainers.hf_trainer import HF_TRAINER
from autotune.trainers.sft import SFT

# Every trainer, in the order ``--trainer`` lists them. Adding a trainer: its module and one entry here.
REGISTERED: tuple[TrainerKind, ...] = (HF_TRAINER, SFT, DPO)
NAMES = tuple(kind.name for kind in REGISTERED)
# The trainer of a study that names none (studies written before --trainer existed train the Trainer).
DEFAULT: TrainerKind = HF_TRAINER

__all__ = [
    "DEFAULT",
    "NAMES",
    "REGISTERED",
    "CorpusForm",
    "FieldMapper",
    "ToolConfig",
    "ToolExport",
    "TrainerKind",
    "TrialInputs",
    "arguments_class",
    "choose",
    "class_named",
    "corpus_forms",
    "corpus_rows_words",
    "get",
    "identity_entries",
    "of_identity",
    "option_help",
    "owner_of_field",
    "tool_form_owner",
    "with_model",
    "write_corpus",
]


def option_help() -> str:
    """The ``--trainer`` option's help: each trainer, and which the rows choose when it is not given."""
    chosen = "; ".join(
        f"{kind.name} for a --dataset of {kind.chosen_words}" for kind in REGISTERED if kind.chosen_words
    )
    listed = " or ".join(f"{kind.name} ({kind.option_words})" for kind in REGISTERED)
    return f"{listed}; default: {chosen}, else {DEFAULT.name}."


def arguments_class(name: str) -> type:
    """The arguments class of the trainer ``name`` (``TrainingArguments``, or TRL's ``SFTConfig`` under
    ``--trainer sft``), imported."""
    return class_named(get(name).arguments_path)


def get(name: str) -> TrainerKind:
    """The trainer ``--trainer name`` names.

    Raises:
        AutotuneError: A name no trainer has.
    """
    for kind in REGISTERED:
        if kind.name == name:
            return kind
    raise AutotuneError(f"--trainer {name}: choose one of {', '.join(NAMES)}")


def choose(requested: str | None, columns: Sequence[str] | None) -> TrainerKind:
    """The study's trainer: ``--trainer`` if given, else the one chosen for the ``--dataset`` rows'
    format (:attr:`TrainerKind.chosen_for_formats`: ``sft`` for chat or prompt/completion rows, ``dpo``
    for preference pairs), else :data:`DEFAULT`.

    Raises:
        AutotuneError: An unknown trainer; one that cannot read the rows (or needs rows and has none).
    """
    if requested is not None:
        kind = get(requested)
    else:
        chosen = (k for k in REGISTERED if columns is not None and k.rows_format(columns) in k.chosen_for_formats)
        kind = next(chosen, DEFAULT)
    kind.check_rows(columns)
    return kind


def of_identity(identity: Mapping[str, Any]) -> TrainerKind:
    """The trainer of a study from its identity (``trainer``, kept where it is not :data:`DEFAULT`)."""
    return get(str(identity.get("trainer", DEFAULT.name)))


def identity_entries(name: str, loss_on: str) -> dict[str, Any]:
    """What a study's identity keeps of its trainer: nothing under :data:`DEFAULT`, so studies of the
    Trainer written before ``--trainer`` existed resume unchanged; else the trainer and its loss."""
    kind = get(name)
    return {} if kind is DEFAULT else {"trainer": kind.name, "loss_on": loss_on}


def owner_of_field(field: str, trainer: str) -> TrainerKind | None:
    """Another trainer whose arguments class adds ``field`` to ``TrainingArguments`` (``None``: none, or
    no other trainer's library installed): what a ``--base-args`` key meant for it is said so."""
    import dataclasses
    import importlib.util

    plain = {f.name for f in dataclasses.fields(class_named(HF_TRAINER.arguments_path))}
    for kind in REGISTERED:
        if kind.name == trainer or importlib.util.find_spec(kind.arguments_path.partition(":")[0]) is None:
            continue
        if field in {f.name for f in dataclasses.fields(class_named(kind.arguments_path))} - plain:
            return kind
    return None


def tool_form_owner(fmt: str) -> TrainerKind | None:
    """The first trainer with the tools' export form ``fmt`` (``trl``: TRL's SFTTrainer, then DPOTrainer);
    ``None`` for none."""
    return next((kind for kind in REGISTERED if fmt in kind.tool_forms), None)


def corpus_forms() -> dict[str, CorpusForm]:
    """The ``autotune chat-corpus --format`` forms the trainers add to the chat corpus's
    (``autotune.spec.chat_corpus.FORMATS``): each trainer's :attr:`TrainerKind.corpus_forms`."""
    return {fmt: form for kind in REGISTERED for fmt, form in kind.corpus_forms.items()}


def corpus_rows_words(fmt: str) -> str:
    """What the rows of ``chat-corpus --format fmt`` are, in its line: a trainer's (``preference pairs``),
    else the chat corpus's ``conversations``."""
    added = corpus_forms().get(fmt)
    return added.rows_words if added else "conversations"


def write_corpus(out: Any, samples: int, seed: int = 0, fmt: str = "messages", length_scale: float = 1.0) -> int:
    """Write generated rows in any ``chat-corpus --format`` to ``out`` (a path or an
    ``autotune.spec.files.Destination``): the chat corpus's forms (``chat_corpus.write_jsonl``), else a
    trainer's (:func:`corpus_forms`); return their tokens under the synthetic tokenizer.

    Raises:
        AutotuneError: A format none has, or what ``chat_corpus.write_rows`` refuses.
    """
    from autotune.spec.chat_corpus import FORMATS, write_jsonl

    added = corpus_forms()
    if fmt in added:
        return added[fmt].write(out, samples, seed, length_scale)
    if fmt not in FORMATS:
        raise AutotuneError(f"--format {fmt!r} is not known: choose one of {', '.join((*FORMATS, *added))}")
    return write_jsonl(out, samples, seed, fmt, length_scale)
