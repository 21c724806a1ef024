"""How the user's samples become batches (``--dataset``): padding and length grouping."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import same_names
from autotune.levers._hooks import PADDED, Batching, MemoryTraits, MicroBatchShape
from autotune.levers._lever import Lever
from autotune.levers._samples_apart import flattened_rows_leak, flattening_collator
from autotune.trainers import get as trainer_named
from autotune.trainers.hf_trainer import HF_TRAINER

if TYPE_CHECKING:
    import torch

    from autotune.spec.models import ModelSpec

# ``max_length``: each sample padded to --seq-len; ``longest``: to the longest of its batch;
# ``padding_free``: the batch flattened into one row (DataCollatorWithFlattening). The Trainer's
# ``data_collator``, not a TrainingArguments field (:class:`PaddedToLongest`, :class:`Flattened`).
PADDINGS = ("max_length", "longest", "padding_free")
# What each ``padding`` choice other than the default means for the user's training script.
_COLLATOR_NOTES = {
    "longest": "padded to their longest sample: tokenize without padding and pass DataCollatorWithPadding(tokenizer)",
    "padding_free": (
        "flattened without padding: tokenize without padding and pass DataCollatorWithFlattening() "
        "(transformers.data.data_collator)"
    ),
}
SAMPLINGS = ("random", "group_by_length")


def padding_free_unsupported(
    model: ModelSpec, attention: list[str | None], trainer: str, base_args: Mapping[str, Any], checkpointing: list[bool]
) -> str:
    """Why the model cannot train on flattened batches with every one of these attention choices; '' if it can.

    A flattened row holds several samples, ``position_ids`` restarting at each and no attention mask
    (``DataCollatorWithFlattening``, transformers/data/data_collator.py; TRL's padding-free collator).
    Whether they stay apart depends on the architecture, the kernel and the trial's cache together
    (:mod:`autotune.levers._samples_apart`, which asks the installed transformers: BLOOM and MPT build
    their own masks and ignore the position ids; a cache turns the packed-sequence mask off; an
    encoder's bidirectional mask ignores them), so each attention choice is checked with the user's
    ``use_cache`` (the Trainer's only: SFTTrainer passes ``use_cache=False``) and every checkpointing
    choice (checkpointing turns a cache off in training). Classification heads take one label per
    sample, which the flattened row no longer has.
    """
    if model.task == "sequence-classification":
        return "a classification head needs one row per sample"
    use_cache = trainer_named(trainer).honours_use_cache and bool(base_args.get("use_cache", False))
    for kernel in attention:
        for recomputes in checkpointing if use_cache else [False]:
            reason = flattened_rows_leak(model, kernel, trainer, use_cache, recomputes)
            if reason and use_cache and not flattened_rows_leak(model, kernel, trainer):
                return (
                    f"{reason}; --base-args use_cache true gives the model a cache in training, and with one transformers "
                    "builds no packed-sequence mask (masking_utils.py _preprocess_mask_arguments): drop use_cache "
                    "(training needs no cache), or fix gradient_checkpointing true, which turns it off"
                )
            if reason:
                return reason
    return ""


def checkpointing_values(choices: Mapping[str, list[Any]], base_args: Mapping[str, Any]) -> list[bool]:
    """The checkpointing a trial of the space may run with: the one ``--base-args`` fixes, else the
    space's choices (the lever's default where the space has none)."""
    from autotune.levers.memory_savers import CHECKPOINTING

    assert CHECKPOINTING.from_training_args is not None
    if any(field in base_args for field in CHECKPOINTING.fields):
        return [bool(CHECKPOINTING.from_training_args(base_args))]
    return [bool(v) for v in choices.get(CHECKPOINTING.name, [CHECKPOINTING.default])]


def _longest_first(seq_len: int, lengths: Sequence[int]) -> list[int]:
    return sorted((min(int(n), seq_len) for n in lengths), reverse=True)


class PaddedToLongest(Batching):
    """``padding: longest``: each micro-batch padded to its longest sample (:class:`PadToLongest`).

    Its fullest micro-batch is ``b`` rows of the longest sample (truncated to ``--seq-len``): some
    batch holds it, and transformers' ``LengthGroupedSampler`` (trainer_pt_utils.py) even puts it
    first. So ``sampling: group_by_length`` changes the tokens of a typical step (speed), not the peak.
    """

    pads_samples = False
    varies = True
    words = "padded to the longest"

    def collator(self, pad_token_id: int, model_type: str) -> Any:
        return PadToLongest(pad_token_id)

    def fullest(self, rows: int, seq_len: int, lengths: Sequence[int]) -> MicroBatchShape:
        return MicroBatchShape(rows=rows, row_tokens=_longest_first(seq_len, lengths)[0])


class Flattened(Batching):
    """``padding: padding_free``: each micro-batch flattened into one row by transformers'
    ``DataCollatorWithFlattening`` (transformers/data/data_collator.py): ``position_ids`` restarting at
    each sample, the first label of each sample -100, no padding and no attention mask. RoBERTa-like
    models number positions from ``pad_token_id + 1`` (that class's docstring), so their position ids
    start there. Its fullest micro-batch is one row of the ``b`` longest samples' tokens (at most
    ``b x seq_len``); the Trainer counts all of its tokens (none is padding).
    """

    pads_samples = False
    varies = True
    flattened = True
    counts_tokens = "all"
    words = "flattened into one row"

    def collator(self, pad_token_id: int, model_type: str) -> Any:
        return flattening_collator(pad_token_id, model_type)

    def fullest(self, rows: int, seq_len: int, lengths: Sequence[int]) -> MicroBatchShape:
        return MicroBatchShape(rows=1, row_tokens=sum(_longest_first(seq_len, lengths)[:rows]))


class PadToLongest:
    """Pads a batch of samples of different lengths to its longest one (pads ignored by the loss and the attention).

    A class (not a closure) so dataloader workers can pickle it.
    """

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        import torch
        from torch.nn.utils.rnn import pad_sequence

        def padded(key: str, value: int) -> torch.Tensor:
            return pad_sequence([f[key] for f in features], batch_first=True, padding_value=value)

        batch = {"input_ids": padded("input_ids", self.pad_token_id), "attention_mask": padded("attention_mask", 0)}
        labels = [f["labels"] for f in features]
        batch["labels"] = torch.stack(labels) if labels[0].dim() == 0 else padded("labels", -100)
        return batch


_BATCHINGS: dict[str, Batching] = {"max_length": PADDED, "longest": PaddedToLongest(), "padding_free": Flattened()}


def _padding_memory(value: str, traits: MemoryTraits) -> MemoryTraits:
    return dataclasses.replace(traits, batching=_BATCHINGS[value])


def _padding_unavailable_for_model(
    value: str, model: ModelSpec, choices: Mapping[str, list[Any]], base_args: Mapping[str, Any]
) -> str:
    if not _BATCHINGS[value].flattened:
        return ""
    attention = list(choices.get("attn_implementation") or [None])
    return padding_free_unsupported(
        model, attention, HF_TRAINER.name, base_args, checkpointing_values(choices, base_args)
    )


def _padding_unavailable_with_trainer(value: str, trainer: str) -> str:
    if trainer_named(trainer).prepares_rows:
        return (
            f"under --trainer {trainer} TRL's collator batches the samples (its levers: packing off, padding_free, bfd)"
        )
    return ""


PADDING = Lever(
    name="padding",
    value_type=str,
    default="max_length",
    doc="max_length, longest or padding_free (the Trainer's data_collator)",
    choices=PADDINGS,
    in_every_space=False,
    acts_on="collator",
    to_batching=lambda value: _BATCHINGS[value] if value != "max_length" else None,
    label=lambda value: f"pad={value}" if value != "max_length" else "",
    export_note=lambda value: (
        (
            f"the winner's batches were {_COLLATOR_NOTES[value]} (Trainer(data_collator=...); TrainingArguments has no field for it)"
        )
        if value in _COLLATOR_NOTES
        else ""
    ),
    unavailable_for_model=_padding_unavailable_for_model,
    unavailable_with_trainer=_padding_unavailable_with_trainer,
    fallback="max_length",
    needs_real_data=True,
    # It sets the tokens of the fullest micro-batch (Batching.fullest).
    memory_parts=("activations", "logits"),
    memory=_padding_memory,
)

SAMPLING = Lever(
    name="sampling",
    value_type=str,
    default="random",
    doc="train_sampling_strategy: random, or group_by_length (batches of similar lengths)",
    choices=SAMPLINGS,
    in_every_space=False,
    fields=("train_sampling_strategy",),
    tool_keys={
        "axolotl": {
            "train_sampling_strategy": lambda value, args: (
                ({"group_by_length": True}, [])
                if value == "group_by_length"
                else ({}, [f"axolotl has no train_sampling_strategy {value!r}"])
            )
        },
        "llama-factory": same_names("train_sampling_strategy"),
    },
    # transformers/trainer.py: Trainer._get_train_sampler -> trainer_pt_utils.LengthGroupedSampler.
    to_training_args=lambda value: {"train_sampling_strategy": value} if value != "random" else {},
    from_training_args=lambda args: str(args["train_sampling_strategy"]),
    label=lambda value: value if value != "random" else "",
    fallback="random",
    needs_real_data=True,
    # It changes the tokens of a typical step (speed), not of the fullest one, which sets the peak.
)
