"""Memory sizes: the byte units autotune uses and how it prints a size."""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def format_bytes(n: float) -> str:
    """A size in binary units (``1.50 GiB``): every memory figure autotune prints."""
    for unit, size in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"
