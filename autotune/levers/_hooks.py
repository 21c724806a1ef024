"""What a lever's hooks return: a value's meaning in the words of the part that acts on it.

A lever (:class:`~autotune.levers._lever.Lever`) never lets another part read its value by name.
Instead it answers, through its hooks, in that part's own words:

* the estimator's: :class:`MemoryTraits`, which every lever that moves memory sets its share of
  (``Lever.memory``), and from which ``autotune.estimate`` computes every part;
* the trial child's data: :class:`Batching`, how samples become micro-batches (``Lever.to_batching``);
* the trial child's trainer: :class:`TrainerParts`, the trainer and its arguments' classes and any
  keyword argument of the trainer (``Lever.to_trainer``);
* the throughput prior's: :class:`SpeedTraits`, which every lever that changes a step's time beyond
  what its :class:`MemoryTraits` already say sets its share of (``Lever.speed``).

The model build's words are keyword arguments of ``from_config`` (``Lever.to_model_build``), and the
Trainer's are ``TrainingArguments`` fields (``Lever.to_training_args``): plain dicts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from autotune.trainers.hf_trainer import HF_TRAINER

if TYPE_CHECKING:
    from autotune.spec.models import ModelSpec


@dataclasses.dataclass(frozen=True)
class MicroBatchShape:
    """The tensor shape of one micro-batch: ``rows`` sequences of ``row_tokens`` positions."""

    rows: int
    row_tokens: int

    @property
    def tokens(self) -> int:
        return self.rows * self.row_tokens


class Batching:
    """How a trial's samples become micro-batches: each sample padded to ``--seq-len`` (the default).

    The trial child shapes its batches with it (``autotune.runner``), and the estimator takes its
    fullest micro-batch from the same object (``MemoryTraits.batching``), so both agree by construction.
    A lever that shapes batches otherwise (padding, TRL's packing) returns a subclass from its
    ``to_batching`` hook.

    Attributes:
        pads_samples: The dataset pads every sample to ``--seq-len`` (else samples keep their length and
            :meth:`collator` shapes the batch).
        varies: Micro-batches differ in tokens: the trial's throughput is the mean over its steps and the
            child measures the fullest batch once more after them.
        flattened: A micro-batch is one row of its samples side by side (kept apart by position ids).
        packs: Samples are packed into rows of at most ``--seq-len`` tokens, so a micro-batch of ``b`` rows holds
            up to ``b x seq_len`` tokens of however many samples fit (the throughput prior packs the user's rows
            as TRL does: ``estimate._packing.bfd_rows``).
        counts_tokens: What the Trainer counts as input tokens (``include_num_input_tokens_seen``).
        words: How the fullest batch is built, for the trial's result.
    """

    pads_samples = True
    varies = False
    flattened = False
    packs = False
    counts_tokens = "non_padding"
    words = "padded to --seq-len"

    def prepare(self, samples: Any) -> Any:
        """The trial's dataset made of the loaded samples (packing would join them into blocks here);
        the samples themselves by default."""
        return samples

    def collator(self, pad_token_id: int, model_type: str) -> Any:
        """The Trainer's ``data_collator`` (``None``: the Trainer's default, which stacks padded samples)."""
        return None

    def fullest(self, rows: int, seq_len: int, lengths: Sequence[int]) -> MicroBatchShape:
        """The fullest micro-batch of ``rows`` samples the data's ``lengths`` can produce, which sets the peak."""
        return MicroBatchShape(rows=rows, row_tokens=seq_len)


PADDED = Batching()

# The estimator's words for the attention kernel: ``default``, the model's own (SDPA where supported:
# fused on CUDA, the math kernel on the CPU where it trains with dropout); ``materialized``, the
# ``a x s x s`` scores kept for the backward (eager); ``tiled``, no scores kept (flash, flex).
ATTENTION_KINDS = ("default", "materialized", "tiled")


@dataclasses.dataclass(frozen=True)
class MemoryTraits:
    """What a trial's lever values mean for its memory, in the estimator's words.

    Each lever that moves memory sets its share through its ``memory`` hook, on the device kinds where
    it moves memory (``Lever.memory_device_kinds``); ``autotune.estimate`` computes every part of a
    peak from these traits alone and names no lever. A trait's default is what a trial without the
    lever does. docs/estimator.md explains the arithmetic.

    Attributes:
        rows: Sequences per micro-batch.
        batching: How samples become micro-batches (its fullest one sets the peak).
        recompute: Full (per-layer) activation checkpointing.
        activations_offloaded: Every saved activation moves to host memory as the forward makes it
            and comes back for its layer's backward (TRL's activation offloading, CUDA): the device
            holds about the working layers of the backward.
        half_autocast: Matmul inputs in 16 bits over fp32 master weights (autocast, fp16/bf16).
        weight_bytes: Bytes per weight, and per gradient and parameter-dtype optimizer state.
        optimizer: The optimizer by its ``transformers`` name (its states: ``autotune.levers.optimizer``).
        attention: One of :data:`ATTENTION_KINDS`.
        reads_boundaries: The attention kernel keeps flattened samples apart from their position ids,
            without a ``T x T`` mask (the flash kernels).
        logits: Bytes of the loss's tensors for ``(model, tokens)`` where a fused loss replaces the
            ``b x s x V`` logits; ``None``: the plain loss.
        fused_block_kernels: The block's RMSNorm and gated activation run as fused kernels that keep the
            norm's input alone and recompute the activation (Liger's): fewer saved tensors than
            transformers' Python modules (``autotune.estimate``'s layout count).
        forked_workers: Processes forked from the trial process (CPU dataloader workers).
        zero_stage: DeepSpeed ZeRO's stage (0: none).
        zero_offload: ZeRO keeps the optimizer states (and at stage 3 the parameters) in host memory.
        fsdp_reshards: FSDP: ``True`` frees each block's gathered parameters after its forward
            (full shard), ``False`` keeps them to the backward; ``None``: no FSDP.
        reference_precomputed: A preference trainer's reference ran once before training: no reference
            weights or forward in the steps (``ModelSpec.holds_reference``).
    """

    rows: int = 1
    batching: Batching = PADDED
    recompute: bool = False
    activations_offloaded: bool = False
    half_autocast: bool = False
    weight_bytes: int = 4
    optimizer: str = "adamw_torch"
    attention: str = "default"
    reads_boundaries: bool = False
    logits: Callable[[ModelSpec, int], int] | None = None
    fused_block_kernels: bool = False
    forked_workers: int = 0
    zero_stage: int = 0
    zero_offload: bool = False
    fsdp_reshards: bool | None = None
    reference_precomputed: bool = False


@dataclasses.dataclass(frozen=True)
class SpeedTraits:
    """What a trial's lever values mean for its step time, in the throughput prior's words, beyond
    what their :class:`MemoryTraits` say already (micro-batch, batching, recomputation, offloading,
    weight bytes, attention kernel, fused loss, ZeRO: ``autotune.estimate`` reads those there).

    Each lever that changes time otherwise sets its share through its ``speed`` hook; the prior
    (``autotune.estimate``, docs/estimator.md "The throughput prior") names no lever.

    Attributes:
        micro_batches: Micro-batches per optimizer step (gradient accumulation): the optimizer's step
            and the per-step overhead are shared by this many.
        optimizer_step_bytes: Bytes the optimizer's step reads and writes per trainable parameter, for
            fp32 parameters (memory-bound work, over the memory bandwidth).
        optimizer_states_in_param_dtype: The optimizer's states (and so its traffic) are in the
            parameters' dtype: half the bytes under bf16 weights.
        optimizer_kernels_per_tensor: Kernels (CPU: ops) the optimizer runs per parameter tensor: a
            for-loop optimizer (Adafactor) pays a launch per op per tensor, a foreach or fused one once
            per op for all of them (counted as 0 here: its launches are few).
        fuses_elementwise: The model's elementwise work is fused into fewer kernels (``torch.compile``'s
            inductor): less memory traffic and fewer launches.
        graphs: Launches replayed as CUDA graphs (compile's ``reduce-overhead`` modes): no per-kernel
            launch cost.
    """

    micro_batches: int = 1
    optimizer_step_bytes: float = 28.0
    optimizer_states_in_param_dtype: bool = True
    optimizer_kernels_per_tensor: int = 0
    fuses_elementwise: bool = False
    graphs: bool = False


@dataclasses.dataclass(frozen=True)
class TrainerParts:
    """The trainer a trial trains through, and what it is handed besides its arguments.

    Attributes:
        trainer: The trainer class, ``module:Class`` (a ``transformers.Trainer`` or a subclass).
        arguments: Its arguments class, ``module:Class`` (``TrainingArguments`` or a subclass, such
            as TRL's ``SFTConfig``), which receives every lever's ``to_training_args``.
        kwargs: Keyword arguments of the trainer's constructor (``compute_loss_func``, ...).
    """

    trainer: str = HF_TRAINER.trainer_class
    arguments: str = HF_TRAINER.arguments_path
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


TRANSFORMERS_TRAINER = TrainerParts()


class SpaceMemory(Protocol):
    """What the memory prior predicts of a space's configs, for a lever's ``narrow_auto`` rule
    (``autotune.space`` answers it with ``autotune.estimate``, before any trial)."""

    def largest_fits_well(self, choices: Mapping[str, list[Any]]) -> bool:
        """Whether every config of ``choices`` is predicted to fit, with the prior's error margin to spare."""
        ...

    def some_config_fits(self, choices: Mapping[str, list[Any]]) -> bool:
        """Whether some config of ``choices`` is predicted to fit."""
        ...

    def pads_to_longest(self, choices: Mapping[str, list[Any]]) -> bool:
        """Whether the user's samples differ in length and some config of ``choices`` pads each micro-batch
        to its longest: there a smaller micro-batch computes less padding, which the throughput prior counts."""
        ...
