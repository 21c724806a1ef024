"""How the user's samples become batches (``--dataset``): padding and length grouping."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.levers._lever import Lever
from autotune.levers.attention import FLASH_ATTENTIONS

if TYPE_CHECKING:
    from autotune.spec.models import ModelSpec

# ``max_length``: each sample padded to --seq-len; ``longest``: to the longest of its batch;
# ``padding_free``: the batch flattened into one row (DataCollatorWithFlattening). The Trainer's
# ``data_collator``, not a TrainingArguments field (autotune/runner/_loader.py: training_collator).
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


def padding_free_unsupported(model: ModelSpec, attention: list[str | None]) -> str:
    """Why the model cannot train on flattened batches with every one of these attention choices; '' if it can.

    ``DataCollatorWithFlattening`` (transformers/data/data_collator.py) puts a batch's samples in one
    row with ``position_ids`` restarting at each sample, and no attention mask. Two things keep the
    samples apart: the flash kernels (varlen, from the position ids), or the causal mask, which
    transformers/masking_utils.py builds block-diagonal from the position ids
    (``_preprocess_mask_arguments`` -> ``find_packed_sequence_indices``) for every implementation.
    The bidirectional mask of encoders (``create_bidirectional_mask``) ignores them: a BERT would
    attend across samples. Classification heads take one label per sample, which the flattened
    row no longer has.
    """
    if model.task == "sequence-classification":
        return "a classification head needs one row per sample"
    if model.task == "causal-lm":
        return ""
    others = sorted({a or "the model's default" for a in attention if a not in FLASH_ATTENTIONS})
    if others:
        return (
            f"{model.name} is an encoder: under {', '.join(others)} attention its samples would attend to each "
            "other in a flattened row (only flash attention keeps them apart)"
        )
    return ""


def _padding_unavailable_for_model(value: str, model: ModelSpec, choices: Mapping[str, list[Any]]) -> str:
    if value != "padding_free":
        return ""
    return padding_free_unsupported(model, list(choices.get("attn_implementation") or [None]))


def _padding_unavailable_with_trainer(value: str, trainer: str) -> str:
    if trainer == "sft":
        return "under --trainer sft TRL's collator batches the samples (its levers: packing off, padding_free, bfd)"
    return ""


PADDING = Lever(
    name="padding",
    value_type=str,
    default="max_length",
    doc="max_length, longest or padding_free (the Trainer's data_collator)",
    choices=PADDINGS,
    in_every_space=False,
    acts_on="collator",
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
    # It sets the tokens of the fullest micro-batch (autotune.estimate: micro_batch_shape).
    memory_parts=("activations", "logits"),
)

SAMPLING = Lever(
    name="sampling",
    value_type=str,
    default="random",
    doc="train_sampling_strategy: random, or group_by_length (batches of similar lengths)",
    choices=SAMPLINGS,
    in_every_space=False,
    fields=("train_sampling_strategy",),
    # transformers/trainer.py: Trainer._get_train_sampler -> trainer_pt_utils.LengthGroupedSampler.
    to_training_args=lambda value: {"train_sampling_strategy": value} if value != "random" else {},
    from_training_args=lambda args: str(args["train_sampling_strategy"]),
    label=lambda value: value if value != "random" else "",
    fallback="random",
    needs_real_data=True,
    # It changes the tokens of a typical step (speed), not of the fullest one, which sets the peak.
)
