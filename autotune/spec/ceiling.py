"""The memory ceiling: how the user gives it, and the one rule that says whether a peak fits it.

Every place that judges memory against the ceiling calls :func:`fits` or :func:`excess_gib`: the
runner (a trial that ran over it is ``over_ceiling``), ``tell`` (the study's memory constraint) and
screening (a prediction clearly over it is not run). A peak equal to the ceiling fits. A trial's peak is
its largest rank's, judged against a rank's ceiling: the whole one where each rank has a device of its own,
a share where ranks share one (:func:`ranks_sharing`).
"""

from __future__ import annotations

import re

from autotune.errors import AutotuneError
from autotune.units import GiB, format_bytes

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1024,
    "mib": 1024**2,
    "gib": GiB,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}


def parse_ceiling(text: str, total_bytes: int, option: str = "--memory-ceiling", memory: str = "device memory") -> int:
    """``--memory-ceiling``: a fraction of device memory (``0.9``) or a size (``14GiB``, ``512MiB``).

    ``--host-memory-ceiling`` is read by the same rule (``option``), against the host RAM available
    (``memory`` names it in messages).

    Raises:
        AutotuneError: Unparsable, not positive, a fraction above 1, or more than the device has.
    """
    # A sign is accepted so that "-1" is answered with "must be above zero", not "not understood".
    match = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise AutotuneError(
            f"{option} {text!r} is not understood: give a fraction of {memory} (0.9) or a size (14GiB, 512MiB)"
        )
    number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise AutotuneError(f"{option} {text!r} must be above zero")
    if unit == "":
        if number > 1:
            raise AutotuneError(f"{option} {text!r}: a fraction must be at most 1 (or give a unit: 14GiB)")
        return int(number * total_bytes)
    ceiling = int(number * _UNITS[unit])
    if ceiling > total_bytes:
        raise AutotuneError(
            f"{option} {text!r} is more than the {memory}'s {format_bytes(total_bytes)}; give at most that"
        )
    return ceiling


def ranks_sharing(device_kind: str, ranks: int) -> int:
    """How many of a trial's ``ranks`` share the memory one ``--memory-ceiling`` bounds: on the CPU all of them
    (its ranks are processes on one machine's RAM, so each is judged against its share of the ceiling, and the
    trial's ranks together stay under it, as the exported run of as many ranks must); on GPUs one, each rank
    having a device of its own."""
    return ranks if device_kind == "cpu" else 1


def fits(peak_bytes: float, ceiling_bytes: float) -> bool:
    """Whether a peak (measured, predicted, or a bound on either) fits under the ceiling."""
    return peak_bytes <= ceiling_bytes


def excess_gib(peak_bytes: float, ceiling_bytes: float) -> float:
    """``peak - ceiling`` in GiB: the study's memory constraint, ``<= 0`` exactly when :func:`fits`."""
    return (peak_bytes - ceiling_bytes) / GiB


def host_ceiling_bytes(text: str | None, available_bytes: int, trials_at_once: int = 1) -> int:
    """``--host-memory-ceiling``: the host RAM one trial may use, all its ranks together (what ZeRO offload
    and TRL's activation offloading keep there counts against it); ``None``: the RAM available when the search
    starts (``psutil``'s ``available``), shared by the ``trials_at_once`` trials it runs side by side."""
    if text is None:
        return available_bytes // trials_at_once
    return parse_ceiling(text, available_bytes, "--host-memory-ceiling", "available host RAM")
