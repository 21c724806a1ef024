"""Parse and format memory sizes."""

from __future__ import annotations

import re

from autotune.errors import AutotuneError

_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_ceiling(text: str, total_bytes: int) -> int:
    """``--memory-ceiling``: a fraction of device memory (``0.9``) or a size (``14GiB``, ``512MiB``).

    Raises:
        AutotuneError: Unparsable, not positive, a fraction above 1, or more than the device has.
    """
    # A sign is accepted so that "-1" is answered with "must be above zero", not "not understood".
    match = re.fullmatch(r"\s*([-+]?[0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise AutotuneError(
            f"--memory-ceiling {text!r} is not understood: give a fraction of device memory (0.9) or a size (14GiB, 512MiB)"
        )
    number, unit = float(match.group(1)), match.group(2).lower()
    if number <= 0:
        raise AutotuneError(f"--memory-ceiling {text!r} must be above zero")
    if unit == "":
        if number > 1:
            raise AutotuneError(f"--memory-ceiling {text!r}: a fraction must be at most 1 (or give a unit: 14GiB)")
        return int(number * total_bytes)
    ceiling = int(number * _UNITS[unit])
    if ceiling > total_bytes:
        raise AutotuneError(
            f"--memory-ceiling {text!r} is more than the device's {format_bytes(total_bytes)}; give at most that"
        )
    return ceiling


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
