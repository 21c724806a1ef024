"""Measuring a device's achievable matmul peak per dtype and its memory bandwidth (``autotune devices --calibrate``).

The measured peaks are stored and read by :mod:`autotune.spec.measured_peaks`; this module runs the
matmuls, on the CPU in this process, on a GPU in a fresh process pinned to it as trial children are.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import time
from collections.abc import Callable

from autotune.errors import AutotuneError
from autotune.runner._limits import child_environment
from autotune.spec.devices import DeviceSpec
from autotune.spec.measured_peaks import MeasuredMatmulPeak

# Square matmul sizes: large enough to saturate the units, small enough to time in a second.
DEFAULT_MATRIX_SIZE = {"cpu": 2048, "cuda": 8192}
# Inner sizes a CPU's calibration times besides the square peak (``n x k @ k x n``): a small model's hidden
# width keeps every weight matmul this narrow, and the units differ in how they take it. Measured by this
# calibration on this project's Xeon (AMX-BF16, 2 threads, torch 2.13, n 2048; docs/benchmarks.md, "DPO on the
# CPU", run 9): fp32 0.307 TFLOPS at k 64 against 0.323 square, bf16 0.775 against 1.99, so bf16's lead over
# fp32 is 2.5x at k 64 and 6.2x square (the nominal AMX speed-up is 16x): a 64-wide model's matmuls gain from
# bf16 a fraction of what the square peak says.
CPU_INNER_SIZES = (64, 256)
# Where the default size is worked up to (doubling n): each step is timed, and the next taken only if it is
# predicted to fit the time a matmul may take (``seconds / min_iterations``). A dtype the CPU only emulates
# ran a 2048 x 2048 bf16 matmul in 61 s on an AVX2 EPYC (torch 2.13: 0.28 GFLOPS): five of them made a
# 1-second calibration take 6 minutes. A size the user gives is timed as given.
RAMP_START_SIZE = 256
# Bytes copied to time the memory bandwidth: well past any cache (an H100's L2 is 50 MB, a server CPU's L3
# tens of MB), small enough to copy in milliseconds.
BANDWIDTH_BYTES = {"cpu": 256 * 2**20, "cuda": 1024 * 2**20}
_TORCH_DTYPES = {"fp32": "float32", "tf32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# The work a CPU's calibration times besides matmuls and copies, bound by neither (the throughput prior's
# ``SpeedFit.dropout_s_per_element`` and ``loss_s_per_logit``): dropout's mask over a tensor well past the caches,
# drawn serially from one generator; cross-entropy forward and backward over llama-tiny's logits at micro-batch 2
# of 256 tokens (512 x 32,000: the shape whose loss a profiled CPU step spent half its time in).
DROPOUT_ELEMENTS = 4 * 2**20
LOSS_LOGITS_SHAPE = (512, 32_000)


def measure_matmul_peak(
    device_kind: str,
    dtype: str,
    matrix_size: int | None = None,
    seconds: float = 1.0,
    min_iterations: int = 3,
    inner_size: int | None = None,
) -> MeasuredMatmulPeak:
    """Time ``n x n @ n x n`` matmuls in ``dtype`` in this process and return the achievable rate
    (``inner_size`` k: ``n x k @ k x n`` matmuls, the rate at that inner size).

    Each matmul is timed alone, after synchronising the device, so the best one shows what the
    device can sustain when nothing interferes. Two untimed matmuls come first (library
    initialisation, kernel selection, clock ramp-up).

    Args:
        device_kind: ``cpu``, or ``cuda`` (the current CUDA device).
        dtype: ``fp32``, ``tf32`` (fp32 tensors with TF32 matmuls), ``fp16`` or ``bf16``.
        matrix_size: n; default :data:`DEFAULT_MATRIX_SIZE` for the device kind, or the largest power-of-two
            step towards it whose matmul is predicted to take at most ``seconds / min_iterations``
            (:data:`RAMP_START_SIZE`); the result's ``matrix_size`` says which n was timed.
        seconds: Keep timing until this much time was spent (after ``min_iterations``).
        min_iterations: Timed matmuls at least.
    """
    import torch

    if dtype not in _TORCH_DTYPES:
        raise AutotuneError(f"unknown dtype {dtype!r}: choose one of {', '.join(_TORCH_DTYPES)}")
    target = matrix_size or DEFAULT_MATRIX_SIZE[device_kind]
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    synchronize = torch.cuda.synchronize if device_kind == "cuda" else (lambda: None)
    if device_kind == "cuda":
        # PyTorch keeps TF32 off for fp32 matmuls by default: switch it on only to measure tf32.
        torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
    torch_dtype = getattr(torch, _TORCH_DTYPES[dtype])
    generator = torch.Generator(device=device).manual_seed(0)

    def flops_at(n: int) -> int:  # n*n outputs, each k multiply-adds of 2 FLOPs
        return 2 * n * n * (inner_size or n)

    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        k = inner_size or n
        a = torch.randn(n, k, device=device, dtype=torch_dtype, generator=generator)
        return a, torch.randn(k, n, device=device, dtype=torch_dtype, generator=generator)

    def timed(a: torch.Tensor, b: torch.Tensor) -> float:
        t0 = time.perf_counter()
        a @ b
        synchronize()
        return time.perf_counter() - t0

    n = target if matrix_size else min(target, RAMP_START_SIZE)
    a, b = operands(n)
    with torch.no_grad():
        timed(a, b)  # library initialisation, untimed
        while n < target:  # only towards the default size: each step's matmul is a warm-up too
            step = min(2 * n, target)
            if timed(a, b) * flops_at(step) / flops_at(n) > seconds / min_iterations:
                break
            n = step
            a, b = operands(n)
        flops = flops_at(n)
        for _ in range(2):
            a @ b
        synchronize()
        rates: list[float] = []
        started = time.perf_counter()
        while len(rates) < min_iterations or time.perf_counter() - started < seconds:
            rates.append(flops / timed(a, b) / 1e12)
    return MeasuredMatmulPeak(
        dtype=dtype,
        tflops=max(rates),
        median_tflops=statistics.median(rates),
        matrix_size=n,
        iterations=len(rates),
        inner_size=inner_size,
    )


def measure_memory_bandwidth(
    device_kind: str, nbytes: int | None = None, seconds: float = 0.5, min_iterations: int = 3
) -> float:
    """Time copies of one large buffer into another in this process; the best rate, GB/s (10^9 bytes).

    A copy of ``n`` bytes reads ``n`` and writes ``n``: ``2 n`` bytes move (how STREAM's "Copy" counts).
    One untimed copy first (page faults, clock ramp-up). This is the rate the throughput prior divides
    memory-bound work by (``autotune.estimate``).
    """
    import torch

    size = nbytes or BANDWIDTH_BYTES[device_kind]
    device = torch.device("cuda" if device_kind == "cuda" else "cpu")
    synchronize = torch.cuda.synchronize if device_kind == "cuda" else (lambda: None)
    source = torch.ones(size // 4, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    synchronize()
    rates: list[float] = []
    started = time.perf_counter()
    while len(rates) < min_iterations or time.perf_counter() - started < seconds:
        t0 = time.perf_counter()
        target.copy_(source)
        synchronize()
        rates.append(2 * source.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return max(rates)


def measure_cpu_op_rates(seconds: float = 0.5, min_iterations: int = 3) -> dict[str, float]:
    """Time, in this process, the CPU work the throughput prior counts per element rather than by its FLOPs or
    bytes: ``dropout_s_per_element`` (``F.dropout`` at p 0.1 in training, over :data:`DROPOUT_ELEMENTS`) and
    ``loss_s_per_logit`` (``F.cross_entropy`` and its backward over fp32 logits of :data:`LOSS_LOGITS_SHAPE`):
    the best of the timed runs of each, after one untimed, in seconds per element."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    activations = torch.randn(DROPOUT_ELEMENTS, generator=generator)
    tokens, vocab = LOSS_LOGITS_SHAPE
    logits = torch.randn(tokens, vocab, generator=generator, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,), generator=generator)

    def dropout() -> None:
        F.dropout(activations, 0.1, training=True)

    def loss() -> None:
        F.cross_entropy(logits, labels).backward()
        logits.grad = None

    def best_seconds(run: Callable[[], None]) -> float:
        run()  # untimed: allocations, first-touch page faults
        times: list[float] = []
        started = time.perf_counter()
        while len(times) < min_iterations or time.perf_counter() - started < seconds / 2:
            t0 = time.perf_counter()
            run()
            times.append(time.perf_counter() - t0)
        return min(times)

    return {
        "dropout_s_per_element": best_seconds(dropout) / DROPOUT_ELEMENTS,
        "loss_s_per_logit": best_seconds(loss) / (tokens * vocab),
    }


def calibrate_op_rates(device: DeviceSpec, seconds: float = 0.5) -> dict[str, float]:
    """:func:`measure_cpu_op_rates` on a CPU, in this process; nothing on a GPU (a fused pass there, not timed)."""
    return measure_cpu_op_rates(seconds) if device.kind == "cpu" else {}


def calibrate_bandwidth(device: DeviceSpec, seconds: float = 0.5) -> float:
    """The memory bandwidth of ``device`` in GB/s: the CPU in this process, a GPU in a fresh process pinned to it."""
    if device.kind == "cpu":
        return measure_memory_bandwidth("cpu", seconds=seconds)
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_bandwidth_pinned, (child_environment(device), seconds))


def _bandwidth_pinned(environment: dict[str, str], seconds: float) -> float:
    os.environ.update(environment)
    return measure_memory_bandwidth("cuda", seconds=seconds)


def calibrate_device(
    device: DeviceSpec, dtypes: tuple[str, ...] | None = None, matrix_size: int | None = None, seconds: float = 1.0
) -> list[MeasuredMatmulPeak]:
    """Measure the achievable matmul peak of every dtype ``device`` supports (or of ``dtypes``), and on a
    CPU its rate at the narrow inner sizes :data:`CPU_INNER_SIZES` (not on a GPU: never measured here).

    The CPU is measured in this process, with the thread count trials get too. A GPU is measured in
    a fresh process pinned to it the way trial children are (``CUDA_VISIBLE_DEVICES`` set before
    CUDA starts), so this process never creates a CUDA context.

    Raises:
        AutotuneError: A requested dtype the device cannot run.
    """
    wanted = dtypes or device.supported_dtypes
    unsupported = [d for d in wanted if d not in device.supported_dtypes]
    if unsupported:
        raise AutotuneError(
            f"{device.label} ({device.name}) cannot run {', '.join(unsupported)}; it supports {', '.join(device.supported_dtypes)}"
        )
    if device.kind == "cpu":
        square = [measure_matmul_peak("cpu", dtype, matrix_size, seconds) for dtype in wanted]
        narrow = [
            measure_matmul_peak("cpu", dtype, matrix_size, seconds / 2, inner_size=k)
            for dtype in wanted
            for k in CPU_INNER_SIZES
            if k < (matrix_size or DEFAULT_MATRIX_SIZE["cpu"])
        ]
        return square + narrow
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_measure_pinned, (child_environment(device), tuple(wanted), matrix_size, seconds))


def _measure_pinned(
    environment: dict[str, str], dtypes: tuple[str, ...], matrix_size: int | None, seconds: float
) -> list[MeasuredMatmulPeak]:
    """Runs in a spawned process: pin to one GPU, then measure each dtype on it."""
    os.environ.update(environment)
    return [measure_matmul_peak("cuda", dtype, matrix_size, seconds) for dtype in dtypes]
