"""Batch levers: the micro-batch and gradient accumulation (samples per optimizer step), and the
rules of the pair: the global-batch constraint, ``auto``'s small micro-batches, tensor-core alignment."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from autotune.errors import AutotuneError
from autotune.levers._exports import same, same_names
from autotune.levers._hooks import SpaceMemory
from autotune.levers._lever import Lever

if TYPE_CHECKING:
    from autotune.spec.devices import DeviceSpec

# Under a global-batch constraint the space holds one of these as a fixed (single-choice) entry, and
# accumulation is not searched but derived from it: ``limit // micro_batch``. Optuna samples params
# independently and cannot change a param's choices between trials, so deriving one of the pair is
# how every trial gets an allowed product (:func:`constrain_global_batch`, search_spaces/README.md).
BATCH_LIMITS = ("global_batch", "max_global_batch")
# The levers a global-batch constraint decides (a --base-args value of theirs is applied by it).
GLOBAL_BATCH_LEVERS = ("micro_batch", "grad_accum")


# ``auto``'s micro-batches below 8: what a decoder LLM at 1k-8k tokens trains at on one GPU, with
# accumulation. They are searched only where the estimate says the larger ones do not fit
# (:func:`keep_small_micro_batches_where_needed`). One sample is already ``seq_len`` rows of
# every projection's matmul, so the dimension tensor cores want aligned is tokens, not samples.
SMALL_AUTO_MICRO_BATCHES = (1, 2, 4)


def auto_micro_batches(device: DeviceSpec) -> list[int]:
    """``micro_batch: auto``: 1, 2 and 4 (kept only where needed, see :data:`SMALL_AUTO_MICRO_BATCHES`),
    then multiples of 8 (tensor cores want 8-aligned dims for fp16/bf16, per NVIDIA's deep learning
    performance guide); from 64 up, multiples of 64 on Ampere and newer, whose guide prefers 128-byte
    (64-element) alignment.
    """
    small = [*SMALL_AUTO_MICRO_BATCHES, 8, 16, 24, 32, 48]
    if device.kind == "cuda" and (device.compute_capability or (0, 0)) >= (8, 0):
        return small + [64, 128, 192, 256, 384, 512]
    return small + [64, 96, 128, 192, 256]


def keep_small_micro_batches_where_needed(
    values: list[int], choices: Mapping[str, list[Any]], memory: SpaceMemory | None
) -> tuple[list[int], str]:
    """``micro_batch: auto``: search its micro-batches below 8 (1, 2, 4) only where a larger one may not fit,
    or where a batch is padded to its longest sample.

    From the largest down, a small micro-batch stays while some memory-distinct config at the next
    larger micro-batch of the space may not fit: its predicted peak (the memory prior, before any
    trial) is over the ceiling divided by the prior's error margin (``SpaceMemory.largest_fits_well``).
    Where every config at the next larger one fits well, the smaller ones are removed with a note:
    they take as much memory per token and run fewer tokens per step. But where the user's samples
    differ in length and some config pads each micro-batch to its longest (TRL's collators, the padding
    lever's ``longest``: ``SpaceMemory.pads_to_longest``), they all stay, with a note: a smaller
    micro-batch computes less padding per real token (measured: TRL's default DPOConfig at micro-batch 1
    x accumulation 8 ran 1.71x its micro-batch 8's real tokens/s, docs/benchmarks.md "DPO on the CPU",
    run 10), and the throughput prior counts it from the rows. Without what the prior predicts (no
    model, sequence length, ceiling or prior) they all stay.
    """
    if memory is None:
        return values, ""
    small = [m for m in values if m in SMALL_AUTO_MICRO_BATCHES]
    if small and memory.pads_to_longest(choices):
        return values, (
            f"micro_batch {_list(small)} kept: your samples differ in length and a batch is padded to its longest, "
            "so a smaller micro-batch computes less padding (the throughput prior counts it from your rows)"
        )
    micro = sorted(values)
    removed: list[int] = []
    for value in sorted((m for m in micro if m in SMALL_AUTO_MICRO_BATCHES), reverse=True):
        larger = next((m for m in micro if m > value and m not in removed), None)
        if larger is not None and memory.largest_fits_well({**choices, "micro_batch": [larger]}):
            removed.append(value)
    if not removed:
        return values, ""
    kept = [m for m in values if m not in removed]
    note = (
        f"micro_batch {_list(sorted(removed))} removed: micro-batch {min(kept)} is predicted to fit with every setting "
        f"of the other levers (auto searches smaller ones only where it may not)"
    )
    return kept, note


def tensor_core_note(choices: Mapping[str, list[Any]], seq_len: int, device: DeviceSpec) -> str:
    """A note where a micro-batch's tokens (``micro_batch x seq_len``, the rows of every projection's
    matmul) are not a multiple of 8, which fp16/bf16 tensor cores want (NVIDIA's deep learning
    performance guide, "Matrix multiplication"); ``""`` otherwise. A micro-batch of 1 at seq len 2048
    is 2048 rows."""
    if device.kind != "cuda":
        return ""
    odd = [m for m in choices.get("micro_batch", []) if (m * seq_len) % 8]
    if not odd:
        return ""
    return f"micro_batch {_list(odd)} x seq len {seq_len} is not a multiple of 8 tokens: tensor cores may run it slower"


def largest_global_batch(choices: Mapping[str, list[Any]]) -> int:
    """The most samples one optimizer step of any config of a space takes (on one rank)."""
    micro = choices.get("micro_batch", [MICRO_BATCH.default])
    limits = [values[0] for name, values in choices.items() if name in BATCH_LIMITS]
    if limits:  # accumulation derived: limit // micro_batch (TrialConfig.from_params)
        return max(limits[0] // m * m for m in micro)
    return max(micro) * max(choices.get("grad_accum", [GRAD_ACCUM.default]))


def constrain_global_batch(
    choices: dict[str, list[Any]],
    notes: list[str],
    global_batch: int | None,
    max_global_batch: int | None,
    fixed: Mapping[str, Any],
) -> dict[str, list[Any]]:
    """The choices whose accumulation a global-batch constraint can derive (one rank's share).

    Optuna samples params independently and cannot change a param's choices between trials, so under
    a constraint accumulation is not searched: ``grad_accum`` leaves the space and the constraint
    enters it as a fixed entry, from which ``TrialConfig.from_params`` derives the accumulation,
    ``limit // micro_batch``. The constraint is then recorded with every trial and in the stored
    space (a study resumed with another one is refused), and no trial is spent on a forbidden pair.

    * ``global_batch`` N: the micro_batch choices that divide N; accumulation N / micro-batch.
    * ``max_global_batch`` M: the micro_batch choices up to M; accumulation the most that stays
      within M, ``M // micro_batch``, whatever the grad_accum choices were (more accumulation
      amortises the optimizer step over more samples and leaves activation memory alone, so the
      other pairs under the cap are not worth a trial). Where accumulation is not searched (one
      grad_accum choice) it stays, and the cap only removes micro-batches it would push over M.

    A micro-batch or accumulation ``fixed`` by ``--base-args`` is the only one considered. A note is
    appended to ``notes``.

    Raises:
        AutotuneError: No micro-batch meets the constraint (the message says what would).
    """
    micro = [fixed["micro_batch"]] if "micro_batch" in fixed else choices["micro_batch"]
    by_base = " (fixed by --base-args)" if set(GLOBAL_BATCH_LEVERS) & fixed.keys() else ""
    constrained = {k: v for k, v in choices.items() if k != "grad_accum"}
    if global_batch is not None:
        if "grad_accum" in fixed:
            micro = [global_batch // fixed["grad_accum"]] if global_batch % fixed["grad_accum"] == 0 else []
            micro = [m for m in micro if "micro_batch" not in fixed or m == fixed["micro_batch"]]
        kept = [m for m in micro if global_batch % m == 0]
        if not kept:
            divisors = [d for d in range(1, global_batch + 1) if global_batch % d == 0][:16]
            raise AutotuneError(
                f"global batch {global_batch}: no micro_batch{by_base} {_list(micro)} divides it into whole "
                f"accumulation steps; use micro-batches among its divisors {_list(divisors)}"
            )
        note = f"global batch {global_batch}: grad_accum = {global_batch} / micro_batch, not searched"
        dropped = [m for m in micro if m not in kept]
        if dropped:
            note += f"; micro_batch {_list(dropped)} removed (they do not divide {global_batch})"
        notes.append(note + by_base)
        constrained.update(micro_batch=kept, global_batch=[global_batch])
        return constrained
    assert max_global_batch is not None
    accum = [fixed["grad_accum"]] if "grad_accum" in fixed else choices["grad_accum"]
    # A searched accumulation is derived (at least 1); a fixed one stays, so it counts.
    least_accum = accum[0] if len(accum) == 1 else 1
    kept = [m for m in micro if m * least_accum <= max_global_batch]
    if not kept:
        raise AutotuneError(
            f"max global batch {max_global_batch}: even micro_batch {min(micro)} x grad_accum {least_accum}{by_base} "
            "is over it; add smaller micro_batch choices or raise the cap"
        )
    dropped = [m for m in micro if m not in kept]
    removed = f"; micro_batch {_list(dropped)} removed" if dropped else ""
    if len(accum) == 1:
        notes.append(f"max global batch {max_global_batch}: grad_accum stays {accum[0]}{by_base}{removed}")
        constrained.update(micro_batch=kept, grad_accum=accum)
    else:
        notes.append(
            f"max global batch {max_global_batch}: grad_accum = {max_global_batch} // micro_batch (the most "
            f"that fits), not searched{by_base}{removed}"
        )
        constrained.update(micro_batch=kept, max_global_batch=[max_global_batch])
    return constrained


def _list(values: Sequence[int]) -> str:
    return ", ".join(map(str, values))


def _smallest(_device: DeviceSpec, choices: Sequence[int]) -> list[int]:
    return [min(choices)]


MICRO_BATCH = Lever(
    name="micro_batch",
    value_type=int,
    default=8,
    doc="per_device_train_batch_size (a list, or auto)",
    least=1,
    auto_choices=auto_micro_batches,
    fields=("per_device_train_batch_size",),
    tool_keys={
        "axolotl": {"per_device_train_batch_size": same("micro_batch_size")},
        "llama-factory": same_names("per_device_train_batch_size"),
    },
    to_training_args=lambda value: {"per_device_train_batch_size": value},
    from_training_args=lambda args: int(args["per_device_train_batch_size"]),
    label=lambda value: f"mb={value}",
    memory_parts=("activations", "logits"),
    memory=lambda value, traits: dataclasses.replace(traits, rows=value),
    grows_memory=True,
    narrow_auto=keep_small_micro_batches_where_needed,
    # The best-practice seed starts from the smallest and takes the largest that fits (grows_memory).
    best_practice=_smallest,
)

GRAD_ACCUM = Lever(
    name="grad_accum",
    value_type=int,
    default=1,
    doc="gradient_accumulation_steps",
    least=1,
    fields=("gradient_accumulation_steps",),
    tool_keys={
        "axolotl": same_names("gradient_accumulation_steps"),
        "llama-factory": same_names("gradient_accumulation_steps"),
    },
    to_training_args=lambda value: {"gradient_accumulation_steps": value},
    from_training_args=lambda args: int(args["gradient_accumulation_steps"]),
    label=lambda value: f"ga={value}",
    best_practice=_smallest,
    speed=lambda value, traits: dataclasses.replace(traits, micro_batches=value),
)
