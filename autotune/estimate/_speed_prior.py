"""The throughput prior's rates for a device before any trial (:func:`speed_prior`), and their calibration on
a study's measured trials (:func:`fit_speed`): the achievable fraction of the matmul peak and the per-step
overhead, as the memory prior's context and activation scale are fitted (:mod:`autotune.estimate._fit`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from autotune.estimate._speed import StepWork
from autotune.estimate._speed_time import (
    DROPOUT_S_PER_ELEMENT,
    HEAD_S_PER_LOGIT,
    LOSS_S_PER_LOGIT,
    OP_OVERHEAD_S,
    STEP_OVERHEAD_S,
    ZERO_S_PER_PARAM,
    SpeedFit,
    collectives_seconds,
    predict_speed,
)
from autotune.spec.devices import TYPICAL_MATMUL_FRACTION, DeviceSpec

# The share of the achievable matmul peak a whole training step's matmuls reach (shapes smaller than the
# peak's square matmuls, attention, the loss): torchtitan's Llama-3 8B runs on A100 at 57-61 % MFU
# (docs/facts.md), i.e. 0.59 of the datasheet's 312 TFLOPS over the A100's achievable matmul fraction of
# 0.87 (271 TFLOPS): 0.68. The fit on measured trials replaces it per device.
TRAINING_MATMUL_FRACTION = 0.68
# A CPU without a calibration (``autotune devices --calibrate``): a nominal peak of ``cores x clock x
# FLOPs per cycle``. fp32 FLOPs per cycle and core: two FMA ports of 8 (AVX2) or 16 (AVX-512) fp32 lanes,
# 2 FLOPs each (Intel 64 and IA-32 Optimization Reference Manual; AMD's Zen 4 runs AVX-512 on 256-bit
# units, half this: the calibration measures it). A nominal clock of 2.5 GHz.
CPU_NOMINAL_CLOCK_HZ = 2.5e9
CPU_FP32_FLOPS_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("asimd", 16))
CPU_DEFAULT_FP32_FLOPS_PER_CYCLE = 8
# bf16 over fp32 per cycle: AVX512-BF16's VDPBF16PS makes two bf16 products per fp32 lane (2x); AMX-BF16's
# tile multiply does 1024 bf16 FLOPs per cycle and core against AVX-512's 64 fp32 (16x; Intel's
# optimization manual, "Intel AMX"); Arm's BF16 (BFMMLA) 2x. Without any, bf16 is emulated: 57x slower
# than fp32, measured on this project's AVX2 CPU (docs/facts.md, "bf16 on a CPU without bf16 instructions").
CPU_BF16_SPEEDUP = (("amx_bf16", 16.0), ("avx512_bf16", 2.0), ("bf16", 2.0))
CPU_EMULATED_SLOWDOWN = 57.0
# A CPU's memory bandwidth where it was not measured: the order measured on this project's 2-core VMs
# (2026-11-28, torch.add over 256 MB: 6.5-14.4 GB/s under load; a copy 5.2-5.4 GB/s).
CPU_FALLBACK_BANDWIDTH_BYTES_PER_S = 24e9
# The host link of a GPU, per direction, by compute capability major: PCIe 3.0 x16 (Volta) 16 GB/s, 4.0
# (Ampere, Ada) 32 GB/s, 5.0 (Hopper) 64 GB/s (PCI-SIG's per-lane rates).
PCIE_BYTES_PER_S = {7: 16e9, 8: 32e9, 9: 64e9}
# The bus bandwidth NCCL's collectives reach over a link, as a share of its per-direction rate: over NVLink,
# 8 A100 SXM4 all-reduce at 230-250 GB/s of NVLink 3's 300 (docs.alayanew.com, "NCCL-tests in practice", reference
# table; 195 GB/s send/receive, li-plus/playground cuda/nccl.md); over PCIe, 8 H100 PCIe without NVLink at 35-45
# GB/s of PCIe 5.0's 64 (the same table). GPUs that meet over PCIe are taken at that share of their link
# (consumer cards without peer-to-peer copies, through the host, may reach less).
NVLINK_BUS_SHARE = 0.8
PCIE_BUS_SHARE = 0.6
# A CPU's ranks (gloo over the loopback, one host): bus bandwidths measured here, torch 2.13, 2 processes of one
# thread on a 2-core Intel Xeon with AMX, 32 and 128 MB fp32 tensors: all-reduce 1.16-1.26 GB/s, all-gather
# (``all_gather_into_tensor``) 0.54-0.55, reduce-scatter (``reduce_scatter_tensor``) 0.37-0.39 (docs/estimator.md,
# "The ranks' collectives").
CPU_ALL_REDUCE_BUS_BYTES_PER_S = 1.2e9
CPU_SHARD_BUS_BYTES_PER_S = 0.45e9
# The fit's bounds: a fraction outside them means the model is wrong for this setup, not that it needs
# stretching.
FRACTION_BOUNDS = (0.01, 1.0)
# The fit needs this much relative spread in the trials' compute to tell a fraction from an overhead.
MIN_COMPUTE_SPREAD = 0.25


def cpu_nominal_peaks_tflops(device: DeviceSpec, cores: int) -> dict[str, float]:
    """A CPU's nominal matmul peaks by dtype (``cores x clock x FLOPs per cycle``, the flags' speed-ups)."""
    per_cycle = next(
        (n for flag, n in CPU_FP32_FLOPS_PER_CYCLE if flag in device.cpu_flags), CPU_DEFAULT_FP32_FLOPS_PER_CYCLE
    )
    fp32 = cores * CPU_NOMINAL_CLOCK_HZ * per_cycle / 1e12
    peaks = {"fp32": fp32}
    if "bf16" in device.supported_dtypes:
        if device.has_matmul_hardware("bf16"):
            peaks["bf16"] = fp32 * next(x for flag, x in CPU_BF16_SPEEDUP if flag in device.cpu_flags)
        else:
            peaks["bf16"] = fp32 / CPU_EMULATED_SLOWDOWN
    return peaks


def speed_prior(
    device: DeviceSpec,
    measured_peaks_tflops: Mapping[str, float],
    measured_bandwidth_gb_s: float | None = None,
    cpu_cores: int = 1,
    measured_inner_tflops: Mapping[str, Mapping[int, float]] | None = None,
    measured_op_rates: Mapping[str, float] | None = None,
    rank_share: float = 1.0,
) -> SpeedFit:
    """The one throughput prior for a device: what every speed prediction starts from before a trial.

    Args:
        device: The device (a GPU's datasheet by its name; a CPU's flags).
        measured_peaks_tflops: Achievable matmul peaks by dtype from ``autotune devices --calibrate``
            (:func:`autotune.spec.measured_peaks.load_measured_peaks`); they win over the datasheet's.
        measured_bandwidth_gb_s: Memory bandwidth measured by the same calibration, GB/s.
        cpu_cores: On a CPU without a calibration, the cores its nominal peak counts (a trial's threads).
        measured_inner_tflops: Measured rates by dtype and inner size, the square peak among them
            (:func:`autotune.spec.measured_peaks.load_measured_inner_rates`): a narrow model's matmuls are
            predicted at its width's rate.
        measured_op_rates: A CPU's per-element rates the same calibration timed (``dropout_s_per_element``,
            ``loss_s_per_logit``: :func:`autotune.spec.measured_peaks.load_measured_op_rates`); they win over
            :data:`DROPOUT_S_PER_ELEMENT` and :data:`LOSS_S_PER_LOGIT`, measured on one CPU.
        rank_share: On a CPU, the share of its cores one rank of a trial runs on (``cpu_cores`` of them all): what
            the calibration measured with every core, its matmul rates, bandwidth and the loss's and head's
            per-logit rates, is that rank's in this share (the ranks run side by side on one machine; dropout's
            serial draws and ZeRO's own work are each rank's own). Measured here, bert-small, 2 cores: a rank of
            two, on one core, steps in 0.42 s, one rank alone on one core in 0.31 s and on both in 0.19 s
            (docs/benchmarks.md, "ZeRO and several ranks").
    """
    op, step = OP_OVERHEAD_S[device.kind], STEP_OVERHEAD_S[device.kind]
    dropout, loss, head = (
        DROPOUT_S_PER_ELEMENT[device.kind],
        LOSS_S_PER_LOGIT[device.kind],
        HEAD_S_PER_LOGIT[device.kind],
    )
    measured = {d: float(v) for d, v in measured_peaks_tflops.items() if v > 0}
    if device.kind == "cpu":
        timed = measured_op_rates or {}
        dropout = timed.get("dropout_s_per_element", dropout)
        loss, head = timed.get("loss_s_per_logit", loss) / rank_share, head / rank_share
        nominal = {d: v * TYPICAL_MATMUL_FRACTION for d, v in cpu_nominal_peaks_tflops(device, cpu_cores).items()}
        source = "measured" if measured else f"nominal for {cpu_cores} core(s), not calibrated"
        if measured and rank_share < 1:
            source += f", a rank's {rank_share:.0%} of the cores"
        bandwidth = ((measured_bandwidth_gb_s or 0) * 1e9 or CPU_FALLBACK_BANDWIDTH_BYTES_PER_S) * rank_share
        inner = {
            dtype: tuple(sorted((int(k), float(v) * rank_share) for k, v in by_inner.items()))
            for dtype, by_inner in (measured_inner_tflops or {}).items()
            if dtype in measured and len(by_inner) >= 2
        }
        return SpeedFit(
            "cpu",
            {**nominal, **{d: v * rank_share for d, v in measured.items()}},
            dict(measured),  # MFU: against the machine's own peak
            source,
            bandwidth,
            bandwidth,
            TRAINING_MATMUL_FRACTION,
            op,
            step,
            inner_rates_tflops=inner,
            dropout_s_per_element=dropout,
            loss_s_per_logit=loss,
            head_s_per_logit=head,
            zero_s_per_param=ZERO_S_PER_PARAM["cpu"],
            all_reduce_bus_bytes_per_s=CPU_ALL_REDUCE_BUS_BYTES_PER_S,
            shard_bus_bytes_per_s=CPU_SHARD_BUS_BYTES_PER_S,
        )
    entry = device.datasheet_entry()
    share = (entry.matmul_fraction if entry and entry.matmul_fraction else None) or TYPICAL_MATMUL_FRACTION
    datasheet = dict(entry.peaks_tflops) if entry else {}
    peaks = {**{d: v * share for d, v in datasheet.items()}, **measured}
    source = "measured" if measured else (f"{entry.label} datasheet x {share:.2f} matmul" if entry else "unknown")
    bandwidth = (measured_bandwidth_gb_s or (entry.bandwidth_gb_s if entry else None) or 0) * 1e9
    major = min(max((device.compute_capability or (8, 0))[0], 7), 9)
    bus = gpu_bus_bytes_per_s(device, PCIE_BYTES_PER_S[major])
    return SpeedFit(
        "cuda",
        peaks,
        datasheet,
        source,
        bandwidth or float("inf"),
        PCIE_BYTES_PER_S[major],
        TRAINING_MATMUL_FRACTION,
        op,
        step,
        dropout_s_per_element=dropout,
        loss_s_per_logit=loss,
        head_s_per_logit=head,
        zero_s_per_param=ZERO_S_PER_PARAM["cuda"],
        all_reduce_bus_bytes_per_s=bus,
        shard_bus_bytes_per_s=bus,
    )


def gpu_bus_bytes_per_s(device: DeviceSpec, pcie_bytes_per_s: float) -> float:
    """The bus bandwidth of collectives between GPUs of this kind on one board: over NVLink where its datasheet
    entry has one and its name does not say PCIe, else over its PCIe link (one node: a trial's ranks are this
    machine's GPUs)."""
    entry = device.datasheet_entry()
    if entry is not None and entry.nvlink_gb_s and "pcie" not in device.name.lower():
        return entry.nvlink_gb_s * 1e9 * NVLINK_BUS_SHARE
    return pcie_bytes_per_s * PCIE_BUS_SHARE


def fit_speed(measured: Sequence[tuple[StepWork, float]], prior: SpeedFit) -> SpeedFit:
    """Fit ``step time = compute at the peak / fraction + memory + host + dropout + loss + head + collectives + ZeRO's
    own work + launches + overhead`` on measured trials ((their step's work, their measured step time in seconds))
    by least squares; the collectives held at the prior's compute (what runs behind the compute depends on the
    fraction being fitted; the bytes do not).

    With two or more trials whose compute differs by :data:`MIN_COMPUTE_SPREAD`, both the fraction and the
    per-step overhead; otherwise only the fraction, the overhead kept at the prior's.
    """
    rows = []  # (compute seconds at the peak, measured - the parts not fitted)
    for work, seconds in measured:
        predicted = predict_speed(work, dataclasses.replace(prior, achievable_fraction=1.0, step_overhead_s=0.0))
        if predicted is None or seconds <= 0:
            continue
        fixed = (
            collectives_seconds(work, prior, predicted.compute_s / prior.achievable_fraction)
            + predicted.memory_s
            + predicted.host_s
            + predicted.dropout_s
            + predicted.loss_s
            + predicted.head_s
            + predicted.zero_s
            + predicted.overhead_s
        )
        rows.append((predicted.compute_s, seconds - fixed))
    if not rows:
        return prior
    computes = [c for c, _ in rows]
    spread = (max(computes) - min(computes)) / max(max(computes), 1e-12)
    inverse, overhead = None, prior.step_overhead_s
    if len(rows) >= 2 and spread >= MIN_COMPUTE_SPREAD:
        inverse, overhead = _least_squares(rows)
        if inverse <= 0 or overhead < 0:
            inverse, overhead = None, prior.step_overhead_s
    if inverse is None:
        inverse = sum(c * (y - overhead) for c, y in rows) / sum(c * c for c, _ in rows)
    fraction = min(max(1 / inverse if inverse > 0 else FRACTION_BOUNDS[1], FRACTION_BOUNDS[0]), FRACTION_BOUNDS[1])
    fitted = dataclasses.replace(
        prior, achievable_fraction=fraction, step_overhead_s=max(overhead, 0.0), points=len(rows)
    )
    errors = []
    for work, seconds in measured:
        predicted = predict_speed(work, fitted)
        if predicted is not None and seconds > 0:
            errors.append(abs(predicted.step_s - seconds) / seconds)
    return dataclasses.replace(fitted, max_relative_error=max(errors) if errors else None)


def _least_squares(rows: list[tuple[float, float]]) -> tuple[float, float]:
    """``y = a c + o`` in the least-squares sense: (a, o)."""
    n = len(rows)
    mean_c = sum(c for c, _ in rows) / n
    mean_y = sum(y for _, y in rows) / n
    variance = sum((c - mean_c) ** 2 for c, _ in rows)
    if variance == 0:
        return 0.0, -1.0
    slope = sum((c - mean_c) * (y - mean_y) for c, y in rows) / variance
    return slope, mean_y - slope * mean_c


# The uncalibrated prior's error, as measured by benchmarks/bench_speed_prior.py (docs/benchmarks.md, "The
# throughput prior"): what `autotune estimate` states beside its predicted winner before any trial.
PRIOR_EXPECTED_ERROR = (
    "uncalibrated: on published GPU figures tokens/s within 25 % on 65 of llm-foundry's 75 one-node rows "
    "(up to 1.43x fast at 8-16k tokens on H100, down to 0.70x for 7-30B models on A100) and on all 10 of "
    "torchtitan's Llama 2 and 3 rows that set no constant (0.75-0.80x on A100, 1.05-1.12x on H100); on the CPU its "
    "level is off by 0.4-2x "
    "under the Trainer (by grid, median: 1.0x, 1.0x, 1.1x, 1.6x and 1.8x fast, 2.2x slow where bf16 is emulated), "
    "in real tokens/s 1.2-1.9x fast under SFTTrainer and 1.2-1.7x under DPOTrainer (0.8x where bf16 is emulated), "
    "and it ranks configs within a few percent of each other no better than chance, a landscape spread 2.7x at a "
    "rank correlation of 0.93 (docs/benchmarks.md, 'The throughput prior'); a "
    "study's trials calibrate it (--storage)"
)


def speed_expected_error(fit: SpeedFit) -> str:
    """How far the fit's predictions may be off, in words: the worst error on the trials it was fitted on,
    or the prior's measured error."""
    if fit.points and fit.max_relative_error is not None:
        return (
            f"step time within {fit.max_relative_error:.0%} on the {fit.points} measured trial(s) it was calibrated on"
        )
    return PRIOR_EXPECTED_ERROR
