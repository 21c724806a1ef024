"""Narrowing a space: what the device, the model, the data, a global batch and ``--base-args`` allow.

Each lever says why one of its values cannot run (``autotune.levers``); these functions apply those
rules to a whole space, in the order search_spaces/README.md lists, each removal one note.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from autotune.errors import AutotuneError
from autotune.estimate import UNCALIBRATED_MARGIN, MemoryFit, largest_peak_bytes, smallest_peak_bytes
from autotune.levers import (
    BATCH_LIMIT_KNOBS,
    COMBINATION_RULES,
    LEVERS,
    SMALL_AUTO_MICRO_BATCHES,
    Lever,
    knob_values_from_base_args,
)
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
    fail if a lever is left empty."""
    notes: list[str] = []
    choices: dict[str, list[Any]] = {}
    for name, values in parsed.model_dump(exclude=set(BATCH_LIMIT_KNOBS)).items():
        if values is None:
            continue
        lever = LEVERS[name]
        if values == AUTO:
            values = lever.auto_choices(device)
        kept = _keep(lever, values, lambda v: lever.unavailable_on(v, device) or lever.no_effect_on(v, device), notes)  # noqa: B023 - called by _keep in this iteration
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


def filter_for_model(space: SearchSpace, model: ModelSpec) -> SearchSpace:
    """Remove choices the model cannot use (attention kernels its architecture lacks, Liger for a
    model type it has no kernels for, padding-free batches it cannot keep apart), a note each."""
    notes = list(space.notes)
    choices = dict(space.choices)
    for lever in LEVERS.values():
        if lever.unavailable_for_model is None or lever.name not in choices:
            continue
        rule = lever.unavailable_for_model
        kept = _keep(lever, choices[lever.name], lambda v: rule(v, model, choices), notes)  # noqa: B023 - called by _keep in this iteration
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


def drop_unneeded_small_micro_batches(
    space: SearchSpace, model: ModelSpec, seq_len: int, fit: MemoryFit, ceiling_bytes: int
) -> SearchSpace:
    """Search ``auto``'s micro-batches below 8 (1, 2, 4) only where a larger one may not fit.

    From the largest down, a small micro-batch stays while some memory-distinct config at the next
    larger micro-batch of the space may not fit: its predicted peak (the memory prior, before any
    trial) is over the ceiling divided by :data:`UNCALIBRATED_MARGIN`, the prior's error band. Where
    every config at the next larger one fits well, the smaller ones are removed with a note: they
    take as much memory per token and run fewer tokens per step. Call it only for ``auto`` (a space
    that lists its micro-batches measures them), after the global-batch constraint and the base
    arguments.
    """
    micro = sorted(space.choices["micro_batch"])
    removed = []
    for value in sorted((m for m in micro if m in SMALL_AUTO_MICRO_BATCHES), reverse=True):
        larger = next((m for m in micro if m > value and m not in removed), None)
        if larger is None:
            continue
        peak = largest_peak_bytes(model, {**space.choices, "micro_batch": [larger]}, seq_len, fit)
        if fits(peak * UNCALIBRATED_MARGIN, ceiling_bytes):
            removed.append(value)
    if not removed:
        return space
    kept = [m for m in space.choices["micro_batch"] if m not in removed]
    note = (
        f"micro_batch {_list(sorted(removed))} removed: micro-batch {min(kept)} is predicted to fit with every setting "
        f"of the other levers (auto searches smaller ones only where it may not)"
    )
    return SearchSpace(choices={**space.choices, "micro_batch": kept}, notes=(*space.notes, note), source=space.source)


def keep_zero_where_needed(
    space: SearchSpace, model: ModelSpec | None, seq_len: int | None, fit: MemoryFit | None, ceiling_bytes: int | None
) -> SearchSpace:
    """``zero: auto``: ZeRO is searched only where no config of the space is predicted to fit without it.

    With the memory prior (before any trial): where some config with ``zero: off`` fits the ceiling,
    ``zero`` is ``off``; where none does, ``zero`` keeps its values with which some config fits
    (over the fit's ``ranks``: with one rank, partitioning saves nothing and only offload is left), or all of
    them where none does (the search then stops with what would fit). Without a model, a sequence
    length, a ceiling and the prior nothing is known to need it: ``off``. Call it only for ``auto``,
    before the combination rules (which then narrow the levers ZeRO does not run with).
    """
    values = space.choices.get("zero", ["off"])
    if values == ["off"]:
        return space
    if model is None or seq_len is None or fit is None or ceiling_bytes is None:
        return SearchSpace(choices={**space.choices, "zero": ["off"]}, notes=space.notes, source=space.source)

    def some_config_fits(value: str) -> bool:
        return fits(smallest_peak_bytes(model, {**space.choices, "zero": [value]}, seq_len, fit), ceiling_bytes)

    if some_config_fits("off"):
        return SearchSpace(choices={**space.choices, "zero": ["off"]}, notes=space.notes, source=space.source)
    needed = [v for v in values if v != "off" and some_config_fits(v)] or [v for v in values if v != "off"]
    note = f"zero {', '.join(needed)} searched: no config of the space is predicted to fit without DeepSpeed ZeRO"
    return SearchSpace(choices={**space.choices, "zero": needed}, notes=(*space.notes, note), source=space.source)


def tensor_core_note(space: SearchSpace, seq_len: int, device: DeviceSpec) -> SearchSpace:
    """A note where a micro-batch's tokens (``micro_batch x seq_len``, the rows of every projection's
    matmul) are not a multiple of 8, which fp16/bf16 tensor cores want (NVIDIA's deep learning
    performance guide, "Matrix multiplication"). A micro-batch of 1 at seq len 2048 is 2048 rows."""
    if device.kind != "cuda":
        return space
    odd = [m for m in space.choices["micro_batch"] if (m * seq_len) % 8]
    if not odd:
        return space
    note = f"micro_batch {_list(odd)} x seq len {seq_len} is not a multiple of 8 tokens: tensor cores may run it slower"
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
    """Search only micro-batches whose accumulation a global-batch constraint can derive.

    Optuna samples knobs independently and cannot change a knob's choices between trials, so under
    a constraint accumulation is not searched: ``grad_accum`` leaves the space and the constraint
    enters it as a fixed knob, from which :meth:`TrialConfig.from_params` derives the accumulation,
    ``limit // micro_batch``. The constraint is then recorded with every trial and in the stored
    space (a study resumed with another one is refused), and no trial is spent on a forbidden pair.

    * ``global_batch`` N: the micro_batch choices that divide N; accumulation N / micro-batch.
    * ``max_global_batch`` M: the micro_batch choices up to M; accumulation the most that stays
      within M, ``M // micro_batch``, whatever the grad_accum choices were (more accumulation
      amortises the optimizer step over more samples and leaves activation memory alone, so the
      other pairs under the cap are not worth a trial). Where accumulation is not searched (one
      grad_accum choice) it stays, and the cap only removes micro-batches it would push over M.

    A micro-batch or accumulation fixed in ``base_args`` is the only one considered.

    With ``ranks`` N (``--devices-per-trial``), every rank takes 1/N of the global batch (the
    Trainer's global batch is micro_batch x grad_accum x N): the constraint is applied to each
    rank's share, ``global_batch / N`` (which N must divide) or ``max_global_batch // N``, and the
    stored knob is that share, as :attr:`TrialConfig.global_batch` counts one device's samples.

    Raises:
        AutotuneError: No micro-batch meets the constraint (the message says what would).
    """
    if global_batch is None and max_global_batch is None:
        return space
    if ranks > 1:
        return _per_rank_share(space, global_batch, max_global_batch, base_args, ranks)
    fixed = knob_values_from_base_args(base_args or {})
    micro = [fixed["micro_batch"]] if "micro_batch" in fixed else space.choices["micro_batch"]
    by_base = " (fixed by --base-args)" if {"micro_batch", "grad_accum"} & fixed.keys() else ""
    choices = {k: v for k, v in space.choices.items() if k != "grad_accum"}
    notes = list(space.notes)
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
        choices.update(micro_batch=kept, global_batch=[global_batch])
    else:
        assert max_global_batch is not None
        accum = [fixed["grad_accum"]] if "grad_accum" in fixed else space.choices["grad_accum"]
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
            choices.update(micro_batch=kept, grad_accum=accum)
        else:
            notes.append(
                f"max global batch {max_global_batch}: grad_accum = {max_global_batch} // micro_batch (the most "
                f"that fits), not searched{by_base}{removed}"
            )
            choices.update(micro_batch=kept, max_global_batch=[max_global_batch])
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
    per_rank = constrain_global_batch(
        SearchSpace(choices=space.choices, notes=(), source=space.source),
        global_batch // ranks if global_batch is not None else None,
        max_global_batch // ranks if max_global_batch is not None else None,
        base_args,
    )
    note = f"{share} {total} over {ranks} ranks: {total // ranks} per rank; " + "; ".join(per_rank.notes)
    return SearchSpace(choices=per_rank.choices, notes=(*space.notes, note), source=space.source)


def apply_base_args(space: SearchSpace, base_args: dict[str, Any], device: DeviceSpec) -> SearchSpace:
    """Fix every lever a ``--base-args`` field sets, to the value that reproduces that field.

    The user's TrainingArguments win over the search: such a lever keeps one choice (a note says so)
    for which ``training_arguments_kwargs`` writes exactly the user's value, so the trials measure it
    and the export keeps it. Under a global-batch constraint, :func:`constrain_global_batch` has
    already fixed micro-batch and accumulation.

    Raises:
        AutotuneError: The device cannot run a fixed value (bf16 on a GPU without it, ...).
    """
    notes = list(space.notes)
    choices = dict(space.choices)
    constrained = any(limit in choices for limit in BATCH_LIMIT_KNOBS)
    for knob, value in knob_values_from_base_args(base_args).items():
        if knob in ("micro_batch", "grad_accum") and constrained:
            continue
        lever = LEVERS[knob]
        fields = ", ".join(f for f in lever.fields if f in base_args)
        reason = lever.unavailable_on(value, device)
        if reason:
            raise AutotuneError(
                f"--base-args {fields} asks for {knob} {value!r}, which {device.label} cannot run: {reason}"
            )
        if choices.get(knob) != [value]:
            searched = len(choices.get(knob, [])) > 1
            notes.append(
                f"{knob} fixed at {value!r} by --base-args {fields}" + ("; no longer searched" if searched else "")
            )
        choices[knob] = [value]
    return SearchSpace(choices=choices, notes=tuple(notes), source=space.source)


def _list(values: list[int]) -> str:
    return ", ".join(map(str, values))
