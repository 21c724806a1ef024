"""The planner's table (``autotune estimate``): every memory-distinct config of a space against the
ceiling with its predicted speed (the throughput prior, :mod:`autotune.estimate._speed`), ordered by it
among the configs that fit, and what would fit when none does (:func:`what_would_fit`, also the search's
answer before its first trial)."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from typing import Any

from autotune.errors import AutotuneError
from autotune.estimate._parts import MemoryEstimate, estimate_peak
from autotune.estimate._prior import MemoryFit
from autotune.estimate._speed import pads_each_batch_to_longest
from autotune.estimate._speed_time import SpeedEstimate, SpeedModel
from autotune.levers import COMBINATION_RULES, LEVERS, Lever, TrialConfig, config_conflict, memory_traits
from autotune.levers.batch import GLOBAL_BATCH_LEVERS
from autotune.spec.ceiling import fits
from autotune.spec.devices import DeviceSpec
from autotune.spec.models import ModelSpec
from autotune.units import format_bytes


def memory_distinct_configs(choices: dict[str, list[Any]], device_kind: str) -> list[TrialConfig]:
    """One config per combination of the levers the estimate depends on on this device kind (each
    lever's ``memory_parts``); other levers at their first choice.

    The levers whose memory grows with their value (the micro-batch) vary fastest, so the rows of one
    setting read as a growing batch.
    """
    memory = [lever for lever in LEVERS.values() if lever.name in choices and lever.changes_memory_on(device_kind)]
    names = [lever.name for lever in memory if not lever.grows_memory]
    names += [lever.name for lever in memory if lever.grows_memory]
    base = {name: values[0] for name, values in choices.items()}
    combinations = [{**base, **dict(zip(names, c))} for c in itertools.product(*(choices[name] for name in names))]
    # A pair the search leaves out (bf16 weights with fp32 autocast) is no row; a space with no config that
    # trains keeps them all here: the memory prior judges it before the pair rules refuse it in one line.
    runnable = [params for params in combinations if not config_conflict(params)] or combinations
    return [TrialConfig.from_params(params) for params in runnable]


def setting_of(config: TrialConfig) -> tuple[Any, ...]:
    """The values of the levers that move memory, but for those whose memory grows with their value:
    the setting a growing micro-batch is judged in (accumulation moves no byte, and a fixed global
    batch ties it to the micro-batch)."""
    return tuple(
        getattr(config, lever.name) for lever in LEVERS.values() if lever.memory_parts and not lever.grows_memory
    )


def size_of(config: TrialConfig) -> tuple[Any, ...]:
    """The values of the levers whose memory grows with their value (the micro-batch)."""
    return tuple(getattr(config, lever.name) for lever in LEVERS.values() if lever.grows_memory)


def some_config_pads_to_longest(model: ModelSpec, choices: dict[str, list[Any]], device_kind: str) -> bool:
    """Whether some config of the space pads each micro-batch to its longest sample
    (:func:`~autotune.estimate._speed.pads_each_batch_to_longest`): on samples that differ in length a
    smaller micro-batch of it computes less padding, which the throughput prior counts."""
    configs = memory_distinct_configs(choices, device_kind)
    return any(
        pads_each_batch_to_longest(memory_traits(c, device_kind).batching, model.pads_to_longest) for c in configs
    )


def smallest_peak_bytes(model: ModelSpec, choices: dict[str, list[Any]], seq_len: int, fit: MemoryFit) -> int:
    """The estimate of the space's least memory-hungry config: what any trial needs at least."""
    configs = memory_distinct_configs(choices, fit.device_kind)
    return min(estimate_peak(model, config, seq_len, fit).total_bytes for config in configs)


def largest_peak_bytes(model: ModelSpec, choices: dict[str, list[Any]], seq_len: int, fit: MemoryFit) -> int:
    """The estimate of the space's most memory-hungry config."""
    configs = memory_distinct_configs(choices, fit.device_kind)
    return max(estimate_peak(model, config, seq_len, fit).total_bytes for config in configs)


def plan_rows(
    model: ModelSpec,
    choices: dict[str, list[Any]],
    seq_len: int,
    fit: MemoryFit,
    ceiling_bytes: int,
    speed: SpeedModel | None = None,
    host_ceiling_bytes: int | None = None,
) -> list[EstimateRow]:
    """The planner (``autotune estimate``): every memory-distinct config of a space, predicted and judged,
    the configs that fit first, fastest first by the throughput prior (``speed``), the others after; each at the
    values of the levers that change only its speed (``torch.compile``) the prior predicts fastest for it."""
    configs = memory_distinct_configs(choices, fit.device_kind)
    if speed is not None:
        configs = [fastest_variant(model, config, choices, seq_len, speed, fit.device_kind) for config in configs]
    return by_predicted_speed(estimate_rows(model, configs, seq_len, fit, ceiling_bytes, speed, host_ceiling_bytes))


def fastest_variant(
    model: ModelSpec, config: TrialConfig, choices: dict[str, list[Any]], seq_len: int, speed: SpeedModel, kind: str
) -> TrialConfig:
    """``config`` at the values of the space's speed-only levers (a ``speed`` hook, no memory part on ``kind``, not
    the batch's: ``torch.compile``) that the throughput prior predicts fastest, among those that run with it: a row
    at its first choice (compile off) could never be the predicted winner, however much compiling gains."""
    names = [
        lever.name
        for lever in LEVERS.values()
        if lever.speed is not None
        and len(choices.get(lever.name, ())) > 1
        and not lever.changes_memory_on(kind)
        and lever.name not in GLOBAL_BATCH_LEVERS
    ]
    if not names:
        return config
    variants = [
        variant
        for values in itertools.product(*(choices[name] for name in names))
        if not config_conflict((variant := dataclasses.replace(config, **dict(zip(names, values)))).to_params())
    ]

    def model_tflops(variant: TrialConfig) -> float:
        predicted = speed.estimate(model, variant, seq_len)
        return predicted.model_tflops if predicted is not None else 0.0

    return max(variants, key=model_tflops) if variants else config


@dataclasses.dataclass(frozen=True)
class EstimateRow:
    """One config's prediction against the ceiling (``autotune estimate``), and its predicted speed
    (``None``: no throughput prior, or no peak known for its matmul dtype)."""

    config: TrialConfig
    estimate: MemoryEstimate
    fits: bool  # its peak under the ceiling, and what it offloads under the host's
    speed: SpeedEstimate | None = None


def predicted_model_tflops(row: EstimateRow) -> float:
    """The row's predicted model TFLOPs, the search's objective (0 where not predicted)."""
    return row.speed.model_tflops if row.speed is not None else 0.0


def by_predicted_speed(rows: Sequence[EstimateRow]) -> list[EstimateRow]:
    """The rows that fit, by predicted model TFLOPs (the search's objective), fastest first; then the rest
    in their order (a stable sort: rows without a prediction keep theirs)."""
    return sorted(rows, key=lambda row: (not row.fits, -predicted_model_tflops(row) if row.fits else 0.0))


def predicted_winner(rows: Sequence[EstimateRow]) -> EstimateRow | None:
    """The config that fits with the highest predicted model TFLOPs; ``None`` where none is predicted."""
    fitting = [row for row in rows if row.fits and row.speed is not None]
    return max(fitting, key=predicted_model_tflops) if fitting else None


def estimate_rows(
    model: ModelSpec,
    configs: Sequence[TrialConfig],
    seq_len: int,
    fit: MemoryFit,
    ceiling_bytes: int,
    speed: SpeedModel | None = None,
    host_ceiling_bytes: int | None = None,
) -> list[EstimateRow]:
    """Predict every config's peak and judge it against the ceiling (:func:`autotune.spec.ceiling.fits`) and
    what it offloads against the host's (:meth:`MemoryEstimate.host_fits`, where given), and its speed where
    a throughput prior is given."""
    rows = []
    for config in configs:
        estimate = estimate_peak(model, config, seq_len, fit)
        predicted = speed.estimate(model, config, seq_len) if speed is not None else None
        host_fits = estimate.host_fits(host_ceiling_bytes, fit.ranks)
        rows.append(EstimateRow(config, estimate, fits(estimate.total_bytes, ceiling_bytes) and host_fits, predicted))
    return rows


@dataclasses.dataclass(frozen=True)
class SettingRow:
    """One setting of the other memory levers in ``autotune estimate``'s short table (:func:`by_setting`).

    Attributes:
        largest: The row of the largest micro-batch predicted to fit; where none fits, the smallest (so
            :attr:`fits` is its own).
        fastest: Of the rows that fit, the one with the highest predicted model TFLOPs: not always the
            largest (a padded batch of samples that differ in length computes more padding as it grows);
            ``None`` where none fits or no speed is predicted.
    """

    largest: EstimateRow
    fastest: EstimateRow | None

    @property
    def fits(self) -> bool:
        """Whether any micro-batch of the setting is predicted to fit."""
        return self.largest.fits


def by_setting(rows: Sequence[EstimateRow]) -> list[SettingRow]:
    """For each setting of the other memory levers (dtype x checkpointing x optimizer, ...,
    :func:`setting_of`), its largest micro-batch predicted to fit and its fastest.

    Returns:
        The settings that fit first, fastest first by their fastest row's predicted model TFLOPs (so the
        first holds :func:`predicted_winner`), then the others, each group in the order the settings
        first appear.
    """
    groups: dict[tuple[Any, ...], list[EstimateRow]] = {}
    for row in rows:
        groups.setdefault(setting_of(row.config), []).append(row)
    chosen = []
    for members in groups.values():
        fitting = [row for row in members if row.fits]
        if not fitting:
            chosen.append(SettingRow(min(members, key=lambda row: size_of(row.config)), None))
            continue
        fastest = predicted_winner(fitting)
        chosen.append(SettingRow(max(fitting, key=lambda row: size_of(row.config)), fastest))
    return sorted(
        chosen,
        key=lambda setting: (
            not setting.fits,
            -predicted_model_tflops(setting.fastest) if setting.fastest is not None else 0.0,
        ),
    )


def speed_json(speed: SpeedEstimate | None) -> dict[str, Any] | None:
    """A predicted speed for scripts: the rates, the step's seconds by part (``None``: not predicted)."""
    if speed is None:
        return None
    return {
        "samples_per_s": speed.samples_per_s,
        "tokens_per_s": speed.tokens_per_s,
        "model_tflops": speed.model_tflops,
        "mfu": speed.mfu,
        "step_s": speed.step_s,
        "step_parts_s": speed.parts(),
        # The trainer's pass before training (DPO's precomputed reference), a sample; the rates above count it
        # over the run's passes over the data, as a trial's measured rates do.
        "setup_pass_s_per_sample": speed.setup_s_per_sample,
        "run_passes": speed.work.run_passes,
    }


def estimate_json(rows: Sequence[EstimateRow], header: dict[str, Any]) -> str:
    """Every row as JSON for scripts: the config's lever values, each part in bytes, the total, whether it
    fits, its predicted speed (``predicted_speed``, ``null`` where not predicted); the rows in the table's
    order and the predicted winner's config in the header (``predicted_winner``)."""
    winner = predicted_winner(rows)
    document = {
        **header,
        "predicted_winner": winner.config.to_params() if winner is not None else None,
        "rows": [
            {
                "config": row.config.to_params(),
                "parts_bytes": row.estimate.parts(),
                "total_bytes": row.estimate.total_bytes,
                "host_bytes": row.estimate.host_bytes,
                "fits": row.fits,
                "predicted_speed": speed_json(row.speed),
            }
            for row in rows
        ],
    }
    return json.dumps(document, indent=2)


@dataclasses.dataclass(frozen=True)
class LeverChange:
    """The space's least memory-hungry config with one lever set to another value, predicted."""

    lever: str
    value: Any
    estimate: MemoryEstimate
    fits: bool


@dataclasses.dataclass(frozen=True)
class FitAdvice:
    """What the estimate says when no config of a space fits (:func:`what_would_fit`).

    Attributes:
        smallest: The space's config with the smallest predicted peak.
        changes: Each memory lever's other values that lower that peak, one lever at a time, in
            :data:`LEVERS` order (those that bring it under the ceiling have ``fits``).
        leanest: Every lever at the value that lowered the peak most, all together.
        ceiling_bytes: The ceiling they were judged against.
    """

    smallest: EstimateRow
    changes: tuple[LeverChange, ...]
    leanest: EstimateRow
    ceiling_bytes: int

    def advice(self) -> str:
        """What would bring a config under the ceiling, in one clause."""
        fixes: dict[str, list[str]] = {}
        for change in self.changes:
            if change.fits:
                fixes.setdefault(change.lever, []).append(_word(change.value))
        if fixes:
            return "predicted to fit with one change: " + ", ".join(
                f"{lever} {' or '.join(v)}" for lever, v in fixes.items()
            )
        together = f"{self.leanest.config.short()} predicted {format_bytes(self.leanest.estimate.total_bytes)}"
        if self.leanest.fits:
            return f"no single lever brings it under, all of them together do ({together})"
        return (
            f"even with every lever at its leanest ({together}) nothing fits: a smaller model, a shorter --seq-len "
            "or more memory"
        )

    def sentence(self) -> str:
        """The whole answer in one line: the smallest predicted peak, and what would fit."""
        smallest = self.smallest
        return (
            f"nothing in the space is predicted to fit under the ceiling {format_bytes(self.ceiling_bytes)}: the smallest "
            f"predicted peak is {format_bytes(smallest.estimate.total_bytes)} ({smallest.config.short()}); {self.advice()}"
        )


def what_would_fit(
    model: ModelSpec,
    choices: dict[str, list[Any]],
    seq_len: int,
    fit: MemoryFit,
    ceiling_bytes: int,
    device: DeviceSpec,
) -> FitAdvice | None:
    """``None`` where some config of the space is predicted to fit; else the smallest predicted peak
    and which lever values, outside the space, would bring it under the ceiling.

    Generic over :data:`LEVERS`: every lever with memory parts on this device tries each of its other
    allowed values (its choices, its ``auto`` list, both booleans, its least integer) that the device,
    the model and the levers' combination rules allow, on the space's least memory-hungry config. A
    lever added later is covered without a change here. Levers that only act on data of different
    lengths (padding) are left out: the worst batch is full length (``autotune.runner`` measures it).
    """
    rows = plan_rows(model, choices, seq_len, fit, ceiling_bytes)
    if any(row.fits for row in rows):
        return None
    smallest = min(rows, key=lambda row: row.estimate.total_bytes)
    changes = []
    leanest = smallest.config.to_params()
    for lever in LEVERS.values():
        if not lever.changes_memory_on(fit.device_kind) or lever.needs_real_data:
            continue
        current = getattr(smallest.config, lever.name)
        found = []
        for value in _allowed_values(lever, device, model, choices):
            params = {**smallest.config.to_params(), lever.name: value}
            if value == current or not _runs_together(params):
                continue
            estimate = estimate_peak(model, TrialConfig.from_params(params), seq_len, fit)
            if estimate.total_bytes < smallest.estimate.total_bytes:
                found.append(LeverChange(lever.name, value, estimate, fits(estimate.total_bytes, ceiling_bytes)))
        changes += found
        if found:
            leanest[lever.name] = min(found, key=lambda change: change.estimate.total_bytes).value
    together = estimate_rows(model, [TrialConfig.from_params(leanest)], seq_len, fit, ceiling_bytes)[0]
    return FitAdvice(smallest=smallest, changes=tuple(changes), leanest=together, ceiling_bytes=ceiling_bytes)


def _allowed_values(lever: Lever, device: DeviceSpec, model: ModelSpec, choices: dict[str, list[Any]]) -> list[Any]:
    """A lever's values outside any space: its choices, its ``auto`` list, both booleans, or its least
    integer; without those the device, or the model cannot run."""
    if lever.choices is not None:
        values = list(lever.choices)
    elif lever.auto_choices is not None:
        values = lever.auto_choices(device)
    elif lever.value_type is bool:
        values = [False, True]
    else:
        values = [lever.least] if lever.least is not None else []
    return [
        v
        for v in values
        if not lever.unavailable_on(v, device)
        and not lever.no_effect_on(v, device)
        and (lever.unavailable_for_model is None or not lever.unavailable_for_model(v, model, choices, {}))
    ]


def _runs_together(params: dict[str, Any]) -> bool:
    """Whether the levers' combination rules keep this one config (flash attention needs 16-bit, ...)."""
    single = {name: [value] for name, value in params.items()}
    try:
        for rule in COMBINATION_RULES:
            single = rule(single, [], "")
    except AutotuneError:
        return False
    return all(single.get(name) == [value] for name, value in params.items() if name in single)


def _word(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
