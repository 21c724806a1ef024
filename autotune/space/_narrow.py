"""Narrowing a space: what the device, the model, the data, a global batch, ``--base-args`` and the
memory prior allow.

Each lever says why one of its values cannot run, and its rules over a whole space
(``autotune.levers``); these functions apply them to a space, in the order search_spaces/README.md
lists, each removal one note. None names a lever.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel

from autotune.errors import AutotuneError
from autotune.estimate import (
    UNCALIBRATED_MARGIN,
    MemoryFit,
    largest_peak_bytes,
    smallest_peak_bytes,
    some_config_pads_to_longest,
)
from autotune.levers import (
    BATCH_LIMITS,
    COMBINATION_RULES,
    GLOBAL_BATCH_LEVERS,
    LEVERS,
    NARROWED_BY_MEMORY,
    Lever,
    SpaceMemory,
    lever_values_from_base_args,
)
from autotune.levers import constrain_global_batch as constrain_batch_levers
from autotune.levers import tensor_core_note as lever_tensor_core_note
from autotune.space._search_space import SearchSpace
from autotune.space._space_file import AUTO
from autotune.spec.ceiling import fits
from autotune.spec.devices import DeviceSpec
from autotune.spec.models import ModelSpec


def yaml_word(value: Any) -> str:
    """A choice as the YAML spells it: ``true``, ``8``, ``bf16``."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _keep(lever: Lever, values: list[Any], why_not: Callable[[Any], str], notes: list[str]) -> list[Any]:
    """The values with no reason against them; a note for each removed one; the lever's fallback
    where none is left and it has one."""
    kept = []
    for value in values:
        reason = why_not(value)
        if reason:
            notes.append(f"{lever.name} {yaml_word(value)} removed: {reason}")
        else:
            kept.append(value)
    return kept or ([lever.fallback] if lever.fallback is not None else [])


def filter_for_device(parsed: BaseModel, device: DeviceSpec, source: str = "") -> SearchSpace:
    """Remove choices the device cannot run (or on which they change nothing), with a note for each;
    fail if a lever is left empty.

    A value that is slow on the device (:attr:`Lever.slow_on`) is left out of ``auto`` and of a lever
    the space names in ``leave_out_slow``, and kept where the space lists it, with a note either way.
    """
    notes: list[str] = []
    choices: dict[str, list[Any]] = {}
    leave_out_slow = set(getattr(parsed, "leave_out_slow", ()))
    for name, values in parsed.model_dump(exclude={*BATCH_LIMITS, "leave_out_slow"}).items():
        if values is None:
            continue
        lever = LEVERS[name]
        auto = values == AUTO
        if auto:
            assert lever.auto_choices is not None  # the space file takes `auto` only for such a lever
            values = lever.auto_choices(device)
        leave_out = "auto" if auto else "leave_out_slow" if name in leave_out_slow else ""
        kept = _keep(lever, values, functools.partial(_not_on_device, lever, device, leave_out, notes), notes)
        if not kept:
            raise AutotuneError(
                f"search space {source}: no choice of {name} runs on {device.label} ({'; '.join(notes)}); add one that does"
            )
        choices[name] = kept
    return SearchSpace(choices=choices, notes=tuple(notes), source=source)


def filter_for_trainer(space: SearchSpace, trainer: str) -> SearchSpace:
    """Remove choices the study's trainer does not train (``--trainer``: TRL's packing under the
    Trainer, the Trainer's own collators under SFTTrainer), a note each; a lever left with no
    choice keeps its fallback, or is left out."""
    notes = list(space.notes)
    choices = dict(space.choices)
    for name, values in space.choices.items():
        lever = LEVERS.get(name)
        if lever is None:
            continue
        kept = _keep(lever, values, lambda v: lever.unavailable_with_trainer(v, trainer), notes)  # noqa: B023 - called by _keep in this iteration
        if kept:
            choices[name] = kept
        else:
            del choices[name]
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


def _not_on_device(lever: Lever, device: DeviceSpec, leave_out: str, notes: list[str], value: Any) -> str:
    """Why ``value`` is not searched on ``device``; ``""`` to keep it. A value that is slow on the
    device is left out where ``leave_out`` says why (``auto``, or the space's ``leave_out_slow``) and
    kept, with a note, where the space lists it."""
    reason = lever.unavailable_on(value, device) or lever.no_effect_on(value, device)
    slow = lever.slow_on(value, device)
    if reason or not slow:
        return reason
    if leave_out == "auto":
        return f"{slow}; list it in the space ({lever.name}: [...]) to search it anyway"
    if leave_out:
        return f"{slow}; this space leaves it out (leave_out_slow: [{lever.name}]): list it in a space of your own (--space) to search it anyway"
    notes.append(f"{lever.name} {yaml_word(value)} kept because the space lists it: {slow}")
    return ""


def filter_for_model(space: SearchSpace, model: ModelSpec, base_args: Mapping[str, Any] | None = None) -> SearchSpace:
    """Remove choices the model cannot use (attention kernels its architecture lacks, Liger for a
    model type it has no kernels for, flattened batches whose samples it would not keep apart with
    the space's kernels and the user's ``--base-args``), a note each."""
    notes = list(space.notes)
    choices = dict(space.choices)
    for lever in LEVERS.values():
        if lever.unavailable_for_model is None or lever.name not in choices:
            continue
        rule = lever.unavailable_for_model
        kept = _keep(lever, choices[lever.name], lambda v: rule(v, model, choices, base_args or {}), notes)  # noqa: B023 - called by _keep in this iteration
        if not kept:
            raise AutotuneError(
                f"search space {space.source}: {model.name} supports none of {lever.name} {choices[lever.name]} "
                f"({'; '.join(notes)}); add a choice it supports"
            )
        choices[lever.name] = kept
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


def filter_for_data(space: SearchSpace, real_data: bool, packing: bool) -> SearchSpace:
    """Remove the data levers' other values where every sample is full (synthetic tokens, ``--packing``).

    Padding and length grouping only change batches of samples of different lengths: without
    ``--dataset`` or with ``--packing`` every sample is ``--seq-len`` tokens, and such a trial would
    measure the default under another name.
    """
    if real_data and not packing:
        return space
    why = "--packing fills every sample" if packing else "synthetic tokens have no padding (use --dataset)"
    notes = list(space.notes)
    choices = dict(space.choices)
    for lever in LEVERS.values():
        if lever.needs_real_data and lever.name in choices:
            choices[lever.name] = _keep(lever, choices[lever.name], lambda v: why if v != lever.default else "", notes)  # noqa: B023 - called by _keep in this iteration
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


class PriorPredictions:
    """What the memory prior predicts of a space's configs (``autotune.levers.SpaceMemory``), before any
    trial: the estimate of its memory-distinct configs against the ceiling; ``lengths_differ``: the
    samples are the user's rows (``--dataset`` without ``--packing``), which differ in length."""

    def __init__(
        self, model: ModelSpec, seq_len: int, fit: MemoryFit, ceiling_bytes: int, lengths_differ: bool = False
    ) -> None:
        self.model, self.seq_len, self.fit, self.ceiling_bytes = model, seq_len, fit, ceiling_bytes
        self.lengths_differ = lengths_differ

    def largest_fits_well(self, choices: Mapping[str, list[Any]]) -> bool:
        """The largest predicted peak, times the prior's error margin :data:`UNCALIBRATED_MARGIN`, fits."""
        peak = largest_peak_bytes(self.model, dict(choices), self.seq_len, self.fit)
        return fits(peak * UNCALIBRATED_MARGIN, self.ceiling_bytes)

    def some_config_fits(self, choices: Mapping[str, list[Any]]) -> bool:
        return fits(smallest_peak_bytes(self.model, dict(choices), self.seq_len, self.fit), self.ceiling_bytes)

    def pads_to_longest(self, choices: Mapping[str, list[Any]]) -> bool:
        return self.lengths_differ and some_config_pads_to_longest(self.model, dict(choices), self.fit.device_kind)


def narrow_by_memory(space: SearchSpace, auto: set[str], memory: SpaceMemory | None) -> SearchSpace:
    """Narrow the levers the space leaves at ``auto`` by what the memory prior predicts (each lever's
    ``narrow_auto`` rule, in :data:`NARROWED_BY_MEMORY` order: ZeRO only where nothing fits without
    it, ``auto``'s small micro-batches only where a larger one may not fit or a batch is padded to its
    longest sample), a note each.

    Run after the base arguments and before the combination rules. The micro-batch rule judges the
    largest predicted peak of the space before the combination rules narrow it, which can only keep
    a small micro-batch the narrowed space would have dropped, never drop one it would keep.
    """
    choices, notes = dict(space.choices), list(space.notes)
    for lever in NARROWED_BY_MEMORY:
        if lever.name not in auto or lever.name not in choices or lever.narrow_auto is None:
            continue
        choices[lever.name], note = lever.narrow_auto(choices[lever.name], choices, memory)
        if note:
            notes.append(note)
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


def tensor_core_note(space: SearchSpace, seq_len: int, device: DeviceSpec) -> SearchSpace:
    """The space with a note where a micro-batch's tokens are not 8-aligned on CUDA
    (:func:`autotune.levers.tensor_core_note`)."""
    note = lever_tensor_core_note(space.choices, seq_len, device)
    if not note:
        return space
    return SearchSpace(choices=space.choices, notes=(*space.notes, note), source=space.source)


def filter_combinations(choices: dict[str, list[Any]], notes: list[str], source: str = "") -> dict[str, list[Any]]:
    """Remove a choice that cannot run with some choice of another lever (the levers' combination rules)."""
    for rule in COMBINATION_RULES:
        choices = rule(choices, notes, source)
    return choices


def constrain_global_batch(
    space: SearchSpace,
    global_batch: int | None = None,
    max_global_batch: int | None = None,
    base_args: dict[str, Any] | None = None,
    ranks: int = 1,
) -> SearchSpace:
    """Search only micro-batches whose accumulation a global-batch constraint can derive
    (:func:`autotune.levers.constrain_global_batch`, the batch levers' rule), a lever fixed by
    ``base_args`` the only one considered.

    With ``ranks`` N (``--devices-per-trial``), every rank takes 1/N of the global batch (the
    Trainer's global batch is micro_batch x grad_accum x N): the constraint is applied to each
    rank's share, ``global_batch / N`` (which N must divide) or ``max_global_batch // N``, and the
    stored entry is that share, as ``TrialConfig.global_batch`` counts one device's samples.

    Raises:
        AutotuneError: No micro-batch meets the constraint (the message says what would).
    """
    if global_batch is None and max_global_batch is None:
        return space
    if ranks > 1:
        return _per_rank_share(space, global_batch, max_global_batch, base_args, ranks)
    notes = list(space.notes)
    fixed = lever_values_from_base_args(base_args or {})
    choices = constrain_batch_levers(dict(space.choices), notes, global_batch, max_global_batch, fixed)
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


def _per_rank_share(
    space: SearchSpace,
    global_batch: int | None,
    max_global_batch: int | None,
    base_args: dict[str, Any] | None,
    ranks: int,
) -> SearchSpace:
    """:func:`constrain_global_batch` on each of ``ranks`` ranks' share of the global batch."""
    if global_batch is not None and global_batch % ranks:
        raise AutotuneError(
            f"global batch {global_batch} cannot be shared by {ranks} ranks (--devices-per-trial): give a multiple of {ranks}"
        )
    if max_global_batch is not None and max_global_batch < ranks:
        raise AutotuneError(f"max global batch {max_global_batch} is below one sample on each of {ranks} ranks")
    share = "global batch" if global_batch is not None else "max global batch"
    total = global_batch if global_batch is not None else max_global_batch
    assert total is not None  # called with one of the two (constrain_global_batch)
    per_rank = constrain_global_batch(
        SearchSpace(choices=space.choices, notes=(), source=space.source),
        global_batch // ranks if global_batch is not None else None,
        max_global_batch // ranks if max_global_batch is not None else None,
        base_args,
    )
    note = f"{share} {total} over {ranks} ranks: {total // ranks} per rank; " + "; ".join(per_rank.notes)
    return SearchSpace(choices=per_rank.choices, notes=(*space.notes, note), source=space.source)


def apply_base_args(
    space: SearchSpace, base_args: dict[str, Any], device: DeviceSpec, model: ModelSpec | None = None
) -> SearchSpace:
    """Fix every lever a ``--base-args`` field sets, to the value that reproduces that field.

    The user's TrainingArguments win over the search: such a lever keeps one choice (a note says so)
    for which ``training_arguments_kwargs`` writes exactly the user's value, so the trials measure it
    and the export keeps it. Under a global-batch constraint, :func:`constrain_global_batch` has
    already fixed the batch levers (micro-batch and accumulation).

    Raises:
        AutotuneError: The device cannot run a fixed value (bf16 on a GPU without it, ...), or the
            model cannot (TRL's packing for a model that would let the packed samples see each other).
    """
    notes = list(space.notes)
    choices = dict(space.choices)
    constrained = any(limit in choices for limit in BATCH_LIMITS)
    for name, value in lever_values_from_base_args(base_args).items():
        if name in GLOBAL_BATCH_LEVERS and constrained:
            continue
        lever = LEVERS[name]
        fields = ", ".join(f for f in lever.fields if f in base_args)
        reason = lever.unavailable_on(value, device)
        if reason:
            raise AutotuneError(
                f"--base-args {fields} asks for {name} {value!r}, which {device.label} cannot run: {reason}"
            )
        if model is not None and lever.unavailable_for_model is not None:
            reason = lever.unavailable_for_model(value, model, choices, base_args)
            if reason:
                raise AutotuneError(
                    f"--base-args {fields} asks for {name} {value!r}, which {model.name} cannot run: {reason}"
                )
        if choices.get(name) != [value]:
            searched = len(choices.get(name, [])) > 1
            notes.append(
                f"{name} fixed at {value!r} by --base-args {fields}" + ("; no longer searched" if searched else "")
            )
        choices[name] = [value]
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)
