"""What ``autotune devices`` prints: what each device is, its datasheet and measured peaks, and the GPUs
``autotune estimate --gpu-type`` plans for."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from autotune.spec.devices import DeviceSpec
from autotune.units import format_bytes
from autotune.views.trial_table import format_tflops


def known_gpus_table() -> Table:
    """``autotune devices --known``: the GPUs ``autotune estimate --gpu-type`` plans for."""
    from autotune.spec.devices import KNOWN_GPUS

    table = Table(title="GPUs to plan for without having them (autotune estimate --gpu-type NAME)")
    for header in (
        "name",
        "GPU (as NVML names it)",
        "memory",
        "compute capability",
        "dtypes",
        "datasheet peaks (TFLOPS)",
        "memory figure from",
    ):
        table.add_column(header)
    for gpu in KNOWN_GPUS:
        device = gpu.device()
        entry = device.datasheet_entry()
        peaks = ", ".join(f"{d} {v:g}" for d, v in entry.peaks_tflops.items()) if entry else "-"
        table.add_row(
            gpu.key,
            gpu.nvml_name,
            format_bytes(gpu.memory_bytes),
            f"{gpu.compute_capability[0]}.{gpu.compute_capability[1]}",
            ", ".join(device.supported_dtypes),
            peaks,
            gpu.memory_source,
        )
    return table


def calibrated_peaks_text(
    spec: DeviceSpec,
    peaks: Sequence[Any],
    path: object,
    bandwidth_gb_s: float | None = None,
    op_rates: Mapping[str, float] | None = None,
) -> str:
    """``autotune devices --calibrate``'s lines for one device: each measured peak (a
    ``calibrate.MeasuredMatmulPeak``), the measured memory bandwidth, a CPU's per-element rates, then where they
    were stored."""
    lines = [
        f"  measured peak {spec.label} {peak.dtype}: {format_tflops(peak.tflops)} TFLOPS (best of "
        f"{peak.iterations} {peak.matrix_size}x{peak.matrix_size} matmuls; median {format_tflops(peak.median_tflops)})"
        if peak.inner_size is None
        else f"  measured rate {spec.label} {peak.dtype} at inner size {peak.inner_size}: {format_tflops(peak.tflops)} "
        f"TFLOPS (best of {peak.iterations} {peak.matrix_size}x{peak.inner_size} by {peak.inner_size}x{peak.matrix_size} "
        f"matmuls; the throughput prior reads it for a model that narrow)"
        for peak in peaks
    ]
    if bandwidth_gb_s is not None:
        lines.append(
            f"  measured memory bandwidth {spec.label}: {bandwidth_gb_s:.1f} GB/s (best large copy, read + write)"
        )
    words = {
        "dropout_s_per_element": "dropout's mask (p 0.1, training)",
        "loss_s_per_logit": "cross-entropy forward and backward per fp32 logit",
    }
    lines += [
        f"  measured {spec.label} {words[name]}: {value * 1e9:.2f} ns an element (best run; the throughput prior's rate)"
        for name, value in (op_rates or {}).items()
        if name in words
    ]
    return "\n".join([*lines, f"  stored in {path}"])


def devices_table(
    devices: Sequence[DeviceSpec], measured_peaks: dict[str, dict[str, float]]
) -> tuple[Table, list[str]]:
    """``autotune devices``: each device's memory and peak TFLOPS per dtype, datasheet / measured, and a
    note per device saying what MFU is measured against.

    Args:
        devices: The devices found.
        measured_peaks: Peaks measured by ``autotune devices --calibrate``, by device name and dtype.
    """
    from autotune.levers import DTYPES
    from autotune.spec.measured_peaks import peak_note

    table = Table(
        title="Devices: peak TFLOPS per dtype, datasheet / measured* ('-' = unknown, never invented; n/a = unsupported; "
        "emulated = no matmul hardware for it)"
    )
    for header in ["device", "name", "memory", "datasheet", *DTYPES]:
        table.add_column(header)
    notes = []
    for spec in devices:
        measured = measured_peaks.get(spec.name, {})
        cells = []
        for dtype in DTYPES:
            if dtype not in spec.supported_dtypes:
                cells.append("n/a")
                continue
            datasheet = spec.datasheet_peak_tflops(dtype)
            cells.append(
                f"{'-' if datasheet is None else format_tflops(datasheet)} / "
                f"{format_tflops(measured[dtype]) + '*' if dtype in measured else '-'}"
                + (" emulated" if dtype in spec.emulated_dtypes else "")
            )
        entry = spec.datasheet_entry()
        table.add_row(
            spec.label, spec.name, format_bytes(spec.total_memory_bytes), entry.label if entry else "-", *cells
        )
        notes.append(f"{spec.label}: {peak_note(spec, measured)}")
        notes += [f"{spec.label}: {spec.emulation_reason(dtype)}" for dtype in spec.emulated_dtypes]
    return table, notes
