"""The planner's table (``autotune estimate``): every memory-distinct config of a space against the ceiling."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Sequence
from typing import Any

from autotune.ceiling import fits
from autotune.config import TrialConfig
from autotune.estimate._fit import MemoryFit
from autotune.estimate._parts import MemoryEstimate, estimate_peak
from autotune.levers import LEVERS
from autotune.models import ModelSpec


def memory_distinct_configs(choices: dict[str, list[Any]], device_kind: str) -> list[TrialConfig]:
    """One config per combination of the levers the estimate depends on on this device kind (each
    lever's ``memory_parts``); other levers at their first choice.

    Micro-batch varies fastest, so the rows of one setting read as a growing batch.
    """
    memory = [name for name, lever in LEVERS.items() if name in choices and lever.changes_memory_on(device_kind)]
    knobs = [name for name in memory if name != "micro_batch"] + ["micro_batch"]
    base = {name: values[0] for name, values in choices.items()}
    configs = []
    for combination in itertools.product(*(choices[k] for k in knobs)):
        configs.append(TrialConfig.from_params({**base, **dict(zip(knobs, combination))}))
    return configs


def smallest_peak_bytes(model: ModelSpec, choices: dict[str, list[Any]], seq_len: int, fit: MemoryFit) -> int:
    """The estimate of the space's least memory-hungry config: what any trial needs at least."""
    configs = memory_distinct_configs(choices, fit.device_kind)
    return min(estimate_peak(model, config, seq_len, fit).total_bytes for config in configs)


def plan_rows(model: ModelSpec, choices: dict[str, list[Any]], seq_len: int, fit: MemoryFit, ceiling_bytes: int) -> list[EstimateRow]:
    """The planner (``autotune estimate``): every memory-distinct config of a space, predicted and judged."""
    return estimate_rows(model, memory_distinct_configs(choices, fit.device_kind), seq_len, fit, ceiling_bytes)


@dataclasses.dataclass(frozen=True)
class EstimateRow:
    """One config's prediction against the ceiling (``autotune estimate``)."""

    config: TrialConfig
    estimate: MemoryEstimate
    fits: bool


def estimate_rows(
    model: ModelSpec,
    configs: Sequence[TrialConfig],
    seq_len: int,
    fit: MemoryFit,
    ceiling_bytes: int,
) -> list[EstimateRow]:
    """Predict every config's peak and judge it against the ceiling (:func:`autotune.ceiling.fits`)."""
    rows = []
    for config in configs:
        estimate = estimate_peak(model, config, seq_len, fit)
        rows.append(EstimateRow(config, estimate, fits(estimate.total_bytes, ceiling_bytes)))
    return rows


def largest_fitting(rows: Sequence[EstimateRow]) -> list[tuple[EstimateRow, bool]]:
    """For each setting of the other memory knobs (dtype x checkpointing x optimizer, ...), the row of
    the largest micro-batch predicted to fit; where none fits, the smallest, marked ``False``.

    Returns:
        (row, whether any micro-batch of that setting fits), in the order the settings first appear.
    """
    groups: dict[TrialConfig, list[EstimateRow]] = {}
    for row in rows:
        groups.setdefault(dataclasses.replace(row.config, micro_batch=1), []).append(row)
    chosen = []
    for members in groups.values():
        fitting = [row for row in members if row.fits]
        if fitting:
            chosen.append((max(fitting, key=lambda row: row.config.micro_batch), True))
        else:
            chosen.append((min(members, key=lambda row: row.config.micro_batch), False))
    return chosen


def estimate_json(rows: Sequence[EstimateRow], header: dict[str, Any]) -> str:
    """Every row as JSON for scripts: the config's knobs, each part in bytes, the total, whether it fits."""
    document = {
        **header,
        "rows": [
            {
                "config": row.config.to_params(),
                "parts_bytes": row.estimate.parts(),
                "total_bytes": row.estimate.total_bytes,
                "fits": row.fits,
            }
            for row in rows
        ],
    }
    return json.dumps(document, indent=2)
