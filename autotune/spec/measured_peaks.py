"""Measured matmul peaks: what a device actually achieves per dtype, the honest MFU denominator.

No API reports peak FLOPS and datasheets know only GPUs (and quote clocks a device may not hold),
so ``autotune devices --calibrate`` times large square matmuls per dtype and stores the best rate
seen, keyed by device name, in ``$XDG_CACHE_HOME/autotune/peaks.json`` (``AUTOTUNE_PEAKS_FILE``
overrides the path). A search then reports MFU against that measured peak too. Achievable matmul
peaks are typically 80-87 % of datasheet figures on GPUs (docs/facts.md).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError
from autotune.spec.devices import DeviceSpec
from autotune.spec.files import autotune_cache_dir

PEAKS_FILE_ENV = "AUTOTUNE_PEAKS_FILE"


@dataclasses.dataclass(frozen=True)
class MeasuredMatmulPeak:
    """The achievable matmul rate of one dtype on one device.

    Attributes:
        dtype: ``fp32``, ``tf32``, ``fp16`` or ``bf16``.
        tflops: The best rate seen over the timed matmuls: the achievable peak.
        median_tflops: The median rate (how steady the device was while measuring).
        matrix_size: n of the n x n by n x n matmuls (``2 * n**3`` FLOPs each).
        iterations: Timed matmuls.
        inner_size: ``None`` for the square matmuls of the peak; else k of ``n x k`` by ``k x n`` matmuls
            (``2 * n * n * k`` FLOPs each): the rate at a model's narrow inner size (its hidden width), which
            the throughput prior reads for that model (:func:`load_measured_inner_rates`).
    """

    dtype: str
    tflops: float
    median_tflops: float
    matrix_size: int
    iterations: int
    inner_size: int | None = None


def peaks_file() -> Path:
    """Where measured peaks are stored: ``AUTOTUNE_PEAKS_FILE``, else the user's cache directory."""
    override = os.environ.get(PEAKS_FILE_ENV)
    if override:
        return Path(override).expanduser()
    return autotune_cache_dir() / "peaks.json"


def _read_store(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        store = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AutotuneError(
            f"measured peaks file {path} cannot be read ({exc}); delete it and run `autotune devices --calibrate` again"
        ) from None
    if not isinstance(store, dict):
        raise AutotuneError(f"measured peaks file {path} is not a JSON object; delete it and calibrate again")
    return store


def load_calibration(device_name: str) -> dict[str, Any] | None:
    """The stored calibration record of ``device_name`` (peaks, when, with what), or ``None``."""
    record = _read_store(peaks_file()).get(device_name)
    return record if isinstance(record, dict) else None


def load_measured_peaks(device_name: str) -> dict[str, float]:
    """Measured peak TFLOPs by dtype for ``device_name``; empty if it was never calibrated."""
    record = load_calibration(device_name) or {}
    peaks = record.get("peaks_tflops") or {}
    return {dtype: float(value) for dtype, value in peaks.items() if isinstance(value, (int, float)) and value > 0}


def load_measured_bandwidth(device_name: str) -> float | None:
    """The memory bandwidth (GB/s) ``autotune devices --calibrate`` measured for ``device_name``; ``None`` if never."""
    value = (load_calibration(device_name) or {}).get("bandwidth_gb_s")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def load_measured_inner_rates(device_name: str) -> dict[str, dict[int, float]]:
    """Measured matmul rates (TFLOPS) by dtype and inner size for ``device_name``: the narrow inner sizes
    ``autotune devices --calibrate`` timed on a CPU, and the square peak at its matrix size; empty for a dtype
    never timed narrow."""
    record = load_calibration(device_name) or {}
    found, peaks, sizes = (record.get(key) or {} for key in ("inner_tflops", "peaks_tflops", "matrix_size"))
    rates: dict[str, dict[int, float]] = {}
    for dtype, by_inner in found.items() if isinstance(found, dict) else ():
        if not isinstance(by_inner, dict):
            continue
        kept = {int(k): float(v) for k, v in by_inner.items() if str(k).isdigit() and isinstance(v, (int, float))}
        kept = {k: v for k, v in kept.items() if k > 0 and v > 0}
        peak, size = peaks.get(dtype), sizes.get(dtype)
        if kept and isinstance(peak, (int, float)) and isinstance(size, int) and peak > 0 and size > max(kept):
            rates[dtype] = {**kept, size: float(peak)}
    return rates


# The rates of work a CPU's calibration times per element (``autotune.runner.measure_cpu_op_rates``), by the
# name of the throughput prior's field each sets (``SpeedFit``): seconds per element.
OP_RATE_NAMES = ("dropout_s_per_element", "loss_s_per_logit")


def load_measured_op_rates(device_name: str) -> dict[str, float]:
    """The per-element rates ``autotune devices --calibrate`` timed on a CPU (:data:`OP_RATE_NAMES`, seconds per
    element); empty where never timed (a GPU, an older calibration)."""
    found = (load_calibration(device_name) or {}).get("op_rates") or {}
    if not isinstance(found, dict):
        return {}
    return {n: float(v) for n, v in found.items() if n in OP_RATE_NAMES and isinstance(v, (int, float)) and v > 0}


def save_calibration(
    device: DeviceSpec,
    peaks: list[MeasuredMatmulPeak],
    bandwidth_gb_s: float | None = None,
    op_rates: dict[str, float] | None = None,
) -> Path:
    """Store ``peaks`` (and the memory bandwidth, GB/s, and a CPU's per-element rates, :data:`OP_RATE_NAMES`) under
    ``device.name``, keeping other devices' records; returns the file. Square matmuls are the peaks; narrow ones
    (``inner_size``) their rates by inner size."""
    import torch

    path = peaks_file()
    store = _read_store(path)
    found = store.get(device.name)
    previous: dict[str, Any] = found if isinstance(found, dict) else {}
    square = [p for p in peaks if p.inner_size is None]
    # A dtype measured again keeps none of its earlier narrow rates: they belong to the peak they were timed with.
    remeasured = {p.dtype for p in square}
    inner: dict[str, dict[str, float]] = {
        d: dict(v) for d, v in (previous.get("inner_tflops") or {}).items() if d not in remeasured
    }
    for peak in peaks:
        if peak.inner_size is not None:
            inner.setdefault(peak.dtype, {})[str(peak.inner_size)] = peak.tflops
    record = {
        "peaks_tflops": {**previous.get("peaks_tflops", {}), **{p.dtype: p.tflops for p in square}},
        "median_tflops": {**previous.get("median_tflops", {}), **{p.dtype: p.median_tflops for p in square}},
        "matrix_size": {**previous.get("matrix_size", {}), **{p.dtype: p.matrix_size for p in square}},
        "inner_tflops": inner,
        "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
    }
    if bandwidth_gb_s is not None:
        record["bandwidth_gb_s"] = bandwidth_gb_s
    elif "bandwidth_gb_s" in previous:
        record["bandwidth_gb_s"] = previous["bandwidth_gb_s"]
    if op_rates:
        record["op_rates"] = dict(op_rates)
    elif "op_rates" in previous:
        record["op_rates"] = previous["op_rates"]
    if device.kind == "cpu":
        record["threads"] = torch.get_num_threads()  # a CPU's rate depends on how many cores torch uses
    store[device.name] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(store, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
    return path


def peak_note(device: DeviceSpec, measured_peaks: dict[str, float]) -> str:
    """What MFU will be measured against on ``device``, in one line for the user."""
    entry = device.datasheet_entry()
    if entry is not None:
        datasheet = f"MFU against the {entry.label} datasheet peaks ({entry.source})"
    elif device.kind == "cpu":
        datasheet = "no datasheet peak for a CPU, so no MFU against one"
    else:
        datasheet = (
            f"{device.name} is not in the datasheet table, so MFU against a datasheet peak is omitted (never invented)"
        )
    if measured_peaks:
        figures = ", ".join(f"{dtype} {value:.3g}" for dtype, value in sorted(measured_peaks.items()))
        return f"{datasheet}; MFU* against the measured peaks ({figures} TFLOPS, from {peaks_file()})"
    calibrate = "`autotune devices --calibrate` measures an achievable peak to report MFU* against"
    if device.kind == "cpu":  # a CPU's nominal bf16 figure is far from what a narrow model's matmuls get
        calibrate += ", and this CPU's rates at a narrow model's width, which the throughput prior ranks dtypes by"
    return f"{datasheet}; {calibrate}"
