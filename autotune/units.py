"""Memory sizes: the byte units autotune uses and how it prints a size."""

from __future__ import annotations

KiB = 1024
MiB = 1024**2
GiB = 1024**3


BYTE_UNITS = (("GiB", GiB), ("MiB", MiB), ("KiB", KiB), ("B", 1))


def byte_unit(n: float) -> tuple[str, int]:
    """The unit :func:`format_bytes` writes ``n`` in: the largest of :data:`BYTE_UNITS` it holds one of."""
    return next((unit, size) for unit, size in BYTE_UNITS if abs(n) >= size or size == 1)


def format_bytes(n: float, unit: tuple[str, int] | None = None) -> str:
    """A size in binary units (``1.50 GiB``): every memory figure autotune prints; ``unit``: in that one (two figures
    side by side), else its own (:func:`byte_unit`)."""
    name, size = unit or byte_unit(n)
    return f"{n:.0f} B" if size == 1 else f"{n / size:.2f} {name}"
