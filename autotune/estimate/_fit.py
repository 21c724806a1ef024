"""The memory model calibrated on a study's measured peaks (:func:`fit_memory`), starting from the
device's prior (:mod:`autotune.estimate._prior`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.estimate._parts import estimate_peak
from autotune.estimate._prior import MemoryFit
from autotune.levers import TrialConfig, memory_traits
from autotune.spec.models import ModelSpec

# Calibrated scales outside this range mean the model is wrong for this setup, not that it needs
# stretching: the fit is clamped.
SCALE_BOUNDS = (0.5, 3.0)
# The fit needs this many measured trials, and this much spread in their activations, to
# estimate the scale; with fewer, only the context is fitted.
MIN_POINTS_FOR_SCALE = 3
MIN_RELATIVE_SPREAD_FOR_SCALE = 0.25
# ... and activations must be this share of the largest predicted peak, or their scale drowns in
# the noise of the other parts (a small LM is mostly logits).
MIN_ACTIVATION_SHARE_FOR_SCALE = 0.2


@dataclasses.dataclass(frozen=True)
class MeasuredMemory:
    """One measured trial's peak memory, as the fit sees it."""

    config: TrialConfig
    peak_bytes: int


def fit_memory(
    model: ModelSpec,
    seq_len: int,
    measured: Sequence[MeasuredMemory],
    prior: MemoryFit,
) -> MemoryFit:
    """Fit ``measured = context * processes + fixed + scale * activations`` by least squares.

    ``processes`` is 1 + the processes forked from the trial's (``MemoryTraits.forked_workers``: CPU
    dataloader workers; 1 on CUDA); ``fixed`` the model states, the
    logits and the weights each CPU worker maps; ``activations`` the uncalibrated activations. With
    fewer than :data:`MIN_POINTS_FOR_SCALE` points, or too little spread in the activations to tell
    a scale from an offset, the scale keeps its prior and only the context is fitted.
    """
    if not measured:
        return prior
    rows = []  # (processes, uncalibrated activation bytes, measured - fixed bytes)
    for point in measured:
        uncalibrated = estimate_peak(
            model, point.config, seq_len, dataclasses.replace(prior, context_bytes=0, activation_scale=1.0)
        )
        processes = 1 + memory_traits(point.config, prior.device_kind).forked_workers
        # Model states, logits, the weights each CPU worker maps and the CUDA allocator's overhead
        # (at the prior's share) are not fitted.
        fixed = (
            uncalibrated.model_state_bytes
            + uncalibrated.logits_bytes
            + uncalibrated.context_bytes
            + uncalibrated.allocator_bytes
        )
        rows.append((processes, uncalibrated.activations_bytes, point.peak_bytes - fixed))
    activations = [a for _, a, _ in rows]
    spread = (max(activations) - min(activations)) / max(max(activations), 1)
    predicted = [estimate_peak(model, point.config, seq_len, prior).total_bytes for point in measured]
    share = max(activations) / max(max(predicted), 1)
    if (
        len(rows) >= MIN_POINTS_FOR_SCALE
        and spread >= MIN_RELATIVE_SPREAD_FOR_SCALE
        and share >= MIN_ACTIVATION_SHARE_FOR_SCALE
    ):
        context, scale = _least_squares_two(rows)
        if not SCALE_BOUNDS[0] <= scale <= SCALE_BOUNDS[1] or context < 0:
            scale = min(max(scale, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])
            context = _context_given_scale(rows, scale)
    else:
        scale = prior.activation_scale
        context = _context_given_scale(rows, scale)
    fitted = dataclasses.replace(prior, context_bytes=int(max(context, 0)), activation_scale=scale, points=len(rows))
    errors = [
        abs(estimate_peak(model, p.config, seq_len, fitted).total_bytes - p.peak_bytes) / p.peak_bytes
        for p in measured
        if p.peak_bytes > 0
    ]
    return dataclasses.replace(fitted, max_relative_error=max(errors) if errors else None)


def _least_squares_two(rows: list[tuple[int, int, int]]) -> tuple[float, float]:
    """Solve ``y = c * processes + s * activations`` in the least-squares sense (2 x 2 normal equations)."""
    spp = sum(p * p for p, _, _ in rows)
    spb = sum(p * b for p, b, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    spy = sum(p * y for p, _, y in rows)
    sby = sum(b * y for _, b, y in rows)
    determinant = spp * sbb - spb * spb
    if determinant == 0:
        return _context_given_scale(rows, 1.0), 1.0
    context = (spy * sbb - sby * spb) / determinant
    scale = (spp * sby - spb * spy) / determinant
    return context, scale


def _context_given_scale(rows: list[tuple[int, int, int]], scale: float) -> float:
    """Least-squares context once the scale is fixed: ``sum p (y - s b) / sum p^2``."""
    return sum(p * (y - scale * b) for p, b, y in rows) / sum(p * p for p, _, _ in rows)
