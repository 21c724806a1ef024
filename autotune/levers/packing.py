"""The ``packing`` lever: how TRL's ``SFTTrainer`` batches a trial's samples (``--trainer sft`` only).

Under ``--trainer sft`` TRL prepares and batches the data itself (trl/trainer/sft_trainer.py,
``_prepare_dataset`` and ``DataCollatorForLanguageModeling``); the Trainer path's ``padding``
lever (its own collators) does not apply there. TRL has three ``SFTConfig`` fields for it,
``packing``, ``packing_strategy`` and ``padding_free``, which are not independent: bfd packing
forces ``padding_free`` on (sft_trainer.py:914-916). They are one lever here, so no trial is spent
on two names of the same run:

* ``off``: each sample its own row, the micro-batch padded to its longest sample (TRL's default);
* ``padding_free``: the micro-batch's samples flattened into one row, no padding, position ids
  restarting at each sample (``SFTConfig(padding_free=True)``). TRL trains it only with
  ``max_length=None`` (sft_trainer.py:999-1004, "provide already truncated inputs"): the trial
  truncates the tokenized samples to ``--seq-len`` as TRL's own truncation does, and the export
  says so (``autotune.spec.sft``);
* ``bfd``: samples packed best-fit-decreasing into rows of at most ``--seq-len`` tokens, each
  micro-batch flattened into one row with position ids restarting at each sample
  (``SFTConfig(packing=True, packing_strategy="bfd")``; trl/data_utils.py ``_pack_bfd``).

Samples stay apart in both flattened forms only where the model keeps them apart: transformers
builds the causal mask block-diagonal from the restarting position ids (transformers/masking_utils.py
``_preprocess_mask_arguments`` -> ``find_packed_sequence_indices``) for the models that build it
through ``create_causal_mask`` with them, and the flash kernels read the boundaries TRL passes
(``cu_seq_lens_q/k``) where the model passes them on; BLOOM and MPT (ALiBi) do neither. Both values
are refused for a model that would let its samples see each other, asked of the installed transformers
(:mod:`autotune.levers._samples_apart`, under SFTTrainer's ``use_cache=False``);
tests/levers/test_flattened_rows_apart.py checks the rule per model family, and
tests/levers/test_samples_stay_apart.py per attention implementation, per-sample losses of a packed row
against the same samples padded.

``wrapped`` packing is refused: it concatenates samples and cuts rows of exactly ``max_length``
mid-sample, with no sequence boundary (an all-ones mask, no position ids: trl/data_utils.py
``_pack_wrapped``), so every sample attends to the one before it in its row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.levers._exports import NOTE, Mapper
from autotune.levers._hooks import Batching, MemoryTraits, MicroBatchShape
from autotune.levers._lever import Lever
from autotune.levers.batching import Flattened, padding_free_unsupported
from autotune.trainers import get as trainer_named
from autotune.trainers.sft import SFT

if TYPE_CHECKING:
    from autotune.spec.models import ModelSpec

PACKINGS = ("off", "padding_free", "bfd")
# Values a space or --base-args may name and autotune never searches, each with its reason.
REFUSED_PACKINGS = {
    "wrapped": (
        "TRL's wrapped packing cuts samples mid-way and lets each attend to the one before it in its row "
        "(no sequence boundary: trl/data_utils.py _pack_wrapped; tests/levers/test_samples_stay_apart.py); "
        "search bfd, which keeps samples apart"
    ),
}
_LABELS = {"padding_free": "padding-free", "bfd": "pack=bfd"}


class TrlFlattened(Flattened):
    """``packing: padding_free``: TRL's collator (``DataCollatorForLanguageModeling`` with
    ``padding_free``, trl/trainer/sft_trainer.py:168-227) puts a micro-batch's samples in one row, position
    ids restarting at each sample, no attention mask. SFTTrainer builds that collator itself (the trial
    hands it none); its fullest micro-batch is the Trainer path's flattened one, the ``b`` longest samples."""

    words = "flattened into one row by TRL's collator"

    def collator(self, pad_token_id: int, model_type: str) -> Any:
        return None


class TrlPacked(TrlFlattened):
    """``packing: bfd``: samples packed best-fit-decreasing into rows of at most ``--seq-len`` tokens
    (trl/data_utils.py ``_pack_bfd``), each micro-batch of ``b`` packed rows flattened into one row by
    TRL's collator. Its fullest micro-batch is ``b`` full rows, ``b x seq_len`` tokens in one row: the bound
    (rows fill only where short samples fill them; the throughput prior's typical rows are TRL's,
    ``estimate._packing.bfd_rows``)."""

    words = "packed (bfd) into rows of --seq-len, flattened into one row by TRL's collator"
    packs = True

    def fullest(self, rows: int, seq_len: int, lengths: Sequence[int]) -> MicroBatchShape:
        return MicroBatchShape(rows=1, row_tokens=rows * seq_len)


_BATCHINGS: dict[str, Batching] = {"padding_free": TrlFlattened(), "bfd": TrlPacked()}


def _memory(value: str, traits: MemoryTraits) -> MemoryTraits:
    return dataclasses.replace(traits, batching=_BATCHINGS[value]) if value in _BATCHINGS else traits


def _to_training_args(value: str) -> dict[str, Any]:
    if value == "bfd":
        return {"packing": True, "packing_strategy": "bfd"}
    if value == "padding_free":
        # TRL refuses padding_free without packing unless max_length is None (sft_trainer.py:999-1004).
        return {"padding_free": True, "max_length": None}
    return {}


def _from_training_args(args: Mapping[str, Any]) -> str:
    if args.get("packing"):
        return str(args.get("packing_strategy") or "bfd")
    return "padding_free" if args.get("padding_free") else "off"


def _unavailable_with_trainer(value: str, trainer: str) -> str:
    return trainer_named(trainer).batchings_refused if value != PACKINGS[0] else ""


def _unavailable_for_model(
    value: str, model: ModelSpec, choices: Mapping[str, list[Any]], base_args: Mapping[str, Any]
) -> str:
    batching = _BATCHINGS.get(value)
    if batching is None or not batching.flattened:
        return ""
    if model.task != "causal-lm":
        # A classification head takes one label per row; SFTTrainer trains causal LMs.
        return f"only a causal LM keeps flattened samples apart ({model.name} trains as {model.task})"
    attention = list(choices.get("attn_implementation") or [None])
    return padding_free_unsupported(model, attention, SFT.name, base_args, [False])


def _export_note(value: str) -> str:
    if value != "padding_free":
        return ""
    return (
        "padding_free without packing: TRL trains it only with max_length=None (trl/trainer/sft_trainer.py:999-1004), "
        "so the trials truncated each tokenized sample to --seq-len first, as TRL's own truncation does: "
        "give SFTTrainer samples already truncated to that many tokens"
    )


def _axolotl_max_length(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if value is None:
        return {}, ["axolotl has no untruncated length: give it samples already truncated to --seq-len"]
    return {"sequence_len": value}, []


# The attention kernels autotune searches that axolotl 0.19 runs on flattened (varlen) rows
# (utils/schemas/enums.py:142-155, ATTN_IMPLS_SUPPORTING_PACKING).
_AXOLOTL_VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3", "flex_attention")


def _axolotl_padding_free(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # axolotl's padding-free batches without packing: batch_flattening (schemas/config.py:748-753; the
    # collator DataCollatorWithFlattening, core/builders/causal.py:595-599), which it refuses beside
    # sample_packing or without a varlen attention kernel (schemas/validation.py:1076-1089).
    if not value or args.get("packing"):
        return {}, []
    attention = (args.get("model_init_kwargs") or {}).get("attn_implementation")
    if attention in _AXOLOTL_VARLEN_ATTENTION:
        return {"batch_flattening": True}, []
    return {}, [
        f"axolotl's padding-free batches (batch_flattening) need a varlen attention kernel "
        f"({', '.join(_AXOLOTL_VARLEN_ATTENTION)}: schemas/validation.py:1076-1086), and the winner's attention is "
        f"{attention or 'the model default'}: axolotl pads its batches then"
    ]


def _lf_packing(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    # neat_packing: block-diagonal attention, samples kept apart as TRL's bfd keeps them (data_args.py:108-115).
    return ({"packing": True, "neat_packing": True}, []) if value else ({"packing": False}, [])


def _lf_cutoff_len(value: Any, args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if value is None:
        return {}, ["LLaMA-Factory always truncates at cutoff_len: set it to the study's --seq-len"]
    if not args.get("packing"):
        return {"cutoff_len": value}, []
    # Under packing LLaMA-Factory takes one token off cutoff_len (hparams/data_args.py:188-189), truncates each
    # sample to the rest and packs rows of up to that many tokens (data/processor/supervised.py:73-77, :186),
    # then pads each row to the cutoff_len given (:218-232). One more keeps the winner's samples and rows.
    return {"cutoff_len": value + 1}, [
        f"{NOTE}cutoff_len is {value} + 1: under packing LLaMA-Factory subtracts one token from cutoff_len "
        "(hparams/data_args.py:188-189), truncates samples and fills packed rows to what is left "
        f"(data/processor/supervised.py:73-77, 186), then pads each row to the cutoff_len given (:218-232): so "
        f"samples are cut at {value} tokens and rows hold up to {value} of them, as the winner's did (padded to {value + 1})"
    ]


# How axolotl and LLaMA-Factory say TRL's packing fields (docs/facts.md, "SFT export keys"): max_length is
# also the SFT trainer's own field (from --seq-len), said the same way.
_TOOL_KEYS: dict[str, dict[str, Mapper]] = {
    "axolotl": {
        "max_length": _axolotl_max_length,
        "packing": lambda value, args: ({"sample_packing": bool(value)}, []),
        "packing_strategy": lambda value, args: (
            ({}, []) if value == "bfd" else ({}, [f"axolotl packs its own way (multipack), not {value!r}"])
        ),
        "padding_free": _axolotl_padding_free,
    },
    "llama-factory": {
        "max_length": _lf_cutoff_len,
        "packing": _lf_packing,
        "packing_strategy": lambda value, args: (
            ({}, []) if value == "bfd" else ({}, [f"LLaMA-Factory has no packing strategy {value!r}"])
        ),
        "padding_free": lambda value, args: (
            ({}, [])
            if not value or args.get("packing")
            else ({}, ["LLaMA-Factory has no padding-free batches without packing (neat_packing is the nearest)"])
        ),
    },
}


PACKING = Lever(
    name="packing",
    value_type=str,
    default="off",
    doc="--trainer sft: off (padded to the batch's longest), padding_free, or bfd packing (SFTConfig)",
    choices=PACKINGS,
    refused=REFUSED_PACKINGS,
    in_every_space=False,
    fields=("packing", "packing_strategy", "padding_free", "max_length"),
    tool_keys=_TOOL_KEYS,
    to_training_args=_to_training_args,
    from_training_args=_from_training_args,
    label=lambda value: _LABELS.get(value, ""),
    export_note=_export_note,
    unavailable_with_trainer=_unavailable_with_trainer,
    unavailable_for_model=_unavailable_for_model,
    fallback="off",
    # The child counts tokens and measures the fullest batch by its Batching; TRL prepares and
    # collates the rows itself (autotune.trainers.sft).
    to_batching=lambda value: _BATCHINGS.get(value),
    # It sets the fullest micro-batch: one flattened row (Batching.fullest), whose tokens (padding-free:
    # the samples' own) the loss's tensors follow, and its T x T mask under a mask-based attention.
    memory_parts=("activations", "logits"),
    memory=_memory,
)
