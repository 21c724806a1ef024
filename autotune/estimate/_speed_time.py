"""The throughput prior's second half: a device's rates (:class:`SpeedFit`) turn one step's work
(:class:`~autotune.estimate._speed.StepWork`, counted once per configuration by ``_speed.step_work``) into
time (:func:`predict_speed`, :class:`SpeedEstimate`); :class:`SpeedModel` is one workload's prior. Split from
``_speed.py`` so that each half reads in one sitting: what a step does there, how long it takes here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from autotune.estimate._collectives import zero_rank_share
from autotune.estimate._speed import StepWork, step_work
from autotune.levers import TrialConfig
from autotune.spec.measure import over_the_run
from autotune.spec.models import ModelSpec

# What one kernel launch costs: on CUDA a few microseconds (NVIDIA's "Getting Started with CUDA Graphs",
# which CUDA graphs remove); on the CPU torch's eager dispatch of one op, of the same order. An
# order-of-magnitude figure: the fit on measured trials (``fit_speed``) absorbs its error into the
# per-step overhead.
OP_OVERHEAD_S = {"cpu": 10e-6, "cuda": 5e-6}
# The Trainer's own work per optimizer step (scheduler, callbacks, zero_grad, logging checks): an
# order-of-magnitude prior, replaced by the fit on measured trials.
STEP_OVERHEAD_S = {"cpu": 2e-3, "cuda": 1e-3}
# Dropout's random draws, per element, where they cost time of their own: on the CPU torch draws a dropout
# mask from one generator, serially (``F.dropout`` forward, torch 2.13 CPU, AMD EPYC with AVX2: 10.4 ns an
# element on 1 thread, 11.9-14.6 ns on 2: not parallelised), 15-20x a multiply's 0.8 ns. bert-mini's step
# (dropout 0.1 on its attention probabilities, residuals and embeddings) spent about a third of its time
# there, which the prior did not count (docs/benchmarks.md, "The throughput prior": the repeated bert-mini
# grid ranked at 0.74 without it). On CUDA the mask is a fused elementwise pass (Philox): in the
# elementwise passes, nothing of its own.
DROPOUT_S_PER_ELEMENT = {"cpu": 12e-9, "cuda": 0.0}
# The plain loss's cross-entropy, forward and backward, per logit, where its ``exp`` and ``log`` bound it: on the
# CPU (``F.cross_entropy`` on fp32 logits and its backward, torch 2.13, AMD EPYC with AVX2, 2 threads: 7.4-9.0 ns a
# logit at 512-2048 tokens of a 32k-50k vocabulary; 11-12 ns on 1 thread; 11.6-13.5 ns from bf16 logits, their
# upcast included), 7-9x what its 24 bytes a logit take at this machine's memory bandwidth. On llama-tiny's
# 32k vocabulary a profiled CPU step spent half its time there (docs/benchmarks.md, "The throughput prior").
# On CUDA the loss is memory-bound: its bytes (``_speed.LOSS_BYTES_PER_LOGIT``), nothing of its own.
LOSS_S_PER_LOGIT = {"cpu": 8e-9, "cuda": 0.0}
# TRL's chunked log-prob head off CUDA, its training pass (forward and backward over each tile in torch ops), per
# logit, its matmuls apart (counted as FLOPs): ``ChunkedLogProbFunction`` over 512 tokens of a 64-wide model and a
# 32,000 vocabulary, torch 2.13, AMD EPYC with AVX2, 2 threads: 46-53 ns a logit in all, of which its four matmuls
# 11-12: 34 ns with the log-probabilities alone, 42 with DPO's outputs (entropy, mean logits, top-1). On CUDA its
# Triton kernels fold the tiles as the matmul writes them: nothing of its own.
HEAD_S_PER_LOGIT = {"cpu": 40e-9, "cuda": 0.0}
# DeepSpeed's ZeRO optimizer's own work on the gradients where its step runs on the device (stages 1-3 without
# offload), per trained parameter and reduction (``_collectives.zero_reductions``), on one rank (a rank of several:
# ``_collectives.zero_rank_share``): the five passes over the gradients ``_collectives.ZERO_WHOLE_PASSES`` counts from
# torch's profiler, about 40 bytes a parameter, plus DeepSpeed's Python per bucket. On the CPU those copies run far
# below the memory bandwidth (7 GB/s on the AVX2 EPYC), so the whole is timed: one rank's step slower than plain
# training's by 5.7 ns a parameter on the 2-core AMX Xeon (bert-small, bf16: 0.165 s), 9-10 ns on the 2-core AVX2 EPYC
# (bert-small, fp32: 0.26-0.30 s; 5-8 ns in a bare Trainer loop there), ZeRO-2 at 2 micro-batches twice ZeRO-1's
# (docs/benchmarks.md, "ZeRO's own work in a step"): 8 ns, within 1.4x of both. Under offload DeepSpeed's CPU Adam
# steps the fp32 partition the gradients land in: none of these passes. On CUDA they are memory-bound: bytes
# (``StepWork.zero_bytes``), nothing of its own.
ZERO_S_PER_PARAM = {"cpu": 8e-9, "cuda": 0.0}


@dataclasses.dataclass(frozen=True)
class SpeedFit:
    """A device's rates, which turn a step's work into time (the prior before any trial, or fitted).

    Attributes:
        device_kind: ``cpu`` or ``cuda``.
        peaks_tflops: Achievable matmul peak by dtype (measured by ``autotune devices --calibrate``, else
            the datasheet's times its matmul fraction; on a CPU without a calibration, nominal figures).
        mfu_peaks_tflops: What MFU is reported against, by dtype: the datasheet peak, or on a CPU the
            measured one (MFU*); empty where none is known (no MFU, never an invented one).
        peak_source: Where ``peaks_tflops`` come from, in words.
        bandwidth_bytes_per_s: Memory bandwidth.
        link_bytes_per_s: The host link's bandwidth (PCIe); on a CPU the memory bandwidth.
        achievable_fraction: The share of ``peaks_tflops`` a training step's matmuls reach.
        op_overhead_s: Seconds per kernel launch (CPU: per op).
        step_overhead_s: Seconds per optimizer step of the Trainer's own work.
        points: Measured trials the fit used (0: the prior).
        max_relative_error: Worst ``|predicted - measured| / measured`` step time over those trials.
        inner_rates_tflops: Measured matmul rates by dtype at narrow inner sizes, ``((k, TFLOPS), ...)``
            ascending, the square peak last (``autotune devices --calibrate`` on a CPU); empty: the peak alone.
        dropout_s_per_element: Seconds per element dropout draws a mask for (:data:`DROPOUT_S_PER_ELEMENT`).
        loss_s_per_logit: Seconds per logit of the plain loss where it is not memory-bound (:data:`LOSS_S_PER_LOGIT`).
        head_s_per_logit: Seconds per logit of TRL's chunked head's torch path (:data:`HEAD_S_PER_LOGIT`).
        zero_s_per_param: Seconds per trained parameter and reduction of DeepSpeed's ZeRO optimizer's own work
            where it is not memory-bound (:data:`ZERO_S_PER_PARAM`).
        all_reduce_bus_bytes_per_s: The bus bandwidth of an all-reduce between a trial's ranks (NCCL's tests'
            ``busbw``: ``S x 2 (N - 1) / N`` bytes a second); infinite where no figure applies.
        shard_bus_bytes_per_s: The same of an all-gather or a reduce-scatter (``S x (N - 1) / N``).
    """

    device_kind: str
    peaks_tflops: dict[str, float]
    mfu_peaks_tflops: dict[str, float]
    peak_source: str
    bandwidth_bytes_per_s: float
    link_bytes_per_s: float
    achievable_fraction: float
    op_overhead_s: float
    step_overhead_s: float
    points: int = 0
    max_relative_error: float | None = None
    inner_rates_tflops: dict[str, tuple[tuple[int, float], ...]] = dataclasses.field(default_factory=dict)
    dropout_s_per_element: float = 0.0
    loss_s_per_logit: float = 0.0
    head_s_per_logit: float = 0.0
    zero_s_per_param: float = 0.0
    all_reduce_bus_bytes_per_s: float = math.inf
    shard_bus_bytes_per_s: float = math.inf

    def matmul_rate_tflops(self, dtype: str, inner: int) -> float | None:
        """The matmul rate of ``dtype`` at inner size ``inner``: the peak, or where the device was calibrated
        at narrow inner sizes, interpolated between them (log-linear in the inner size, held flat beyond
        the measured ones); ``None`` where the dtype's peak is unknown."""
        peak = self.peaks_tflops.get(dtype)
        points = self.inner_rates_tflops.get(dtype, ())
        if not peak or not points or inner <= 0:
            return peak
        if inner <= points[0][0]:
            return points[0][1]
        for (k0, r0), (k1, r1) in zip(points, points[1:]):
            if inner <= k1:
                share = math.log(inner / k0) / math.log(k1 / k0)
                return r0 + share * (r1 - r0)
        return points[-1][1]

    def describe(self) -> str:
        """One line: the rates and where they come from."""
        peaks = ", ".join(f"{d} {v:.3g}" for d, v in sorted(self.peaks_tflops.items()))
        narrow = (
            "; at narrow inner sizes "
            + ", ".join(
                f"{d} " + " ".join(f"{v:.3g}@{k}" for k, v in points[:-1])
                for d, points in sorted(self.inner_rates_tflops.items())
            )
            if self.inner_rates_tflops
            else ""
        )
        rates = (
            f"matmul peaks {peaks} TFLOPS ({self.peak_source}{narrow}) x {self.achievable_fraction:.0%} achievable, "
            f"{self.bandwidth_bytes_per_s / 1e9:.0f} GB/s memory, {self.step_overhead_s * 1e3:.1f} ms per step"
        )
        if not self.points:
            return f"throughput prior ({rates}; not calibrated: no measured trial)"
        error = f", worst error {self.max_relative_error:.1%}" if self.max_relative_error is not None else ""
        return f"throughput calibrated on {self.points} measured trial(s) ({rates}{error})"


@dataclasses.dataclass(frozen=True)
class SpeedEstimate:
    """Predicted time of one optimizer step, by part, and the rates that follow: a trial's, over its ``ranks``
    (data parallel, one device each: each rank's step trains its own ``work``, and a trial records its ranks'
    rates summed, ``runner/_ranks.py``; MFU stays per device). ``collectives_s``: what the ranks' collectives
    add to the step beyond what runs behind its compute."""

    work: StepWork
    compute_s: float
    memory_s: float
    host_s: float
    overhead_s: float
    mfu_peak_tflops: float | None
    setup_s_per_sample: float = 0.0
    dropout_s: float = 0.0
    loss_s: float = 0.0
    head_s: float = 0.0
    collectives_s: float = 0.0
    zero_s: float = 0.0

    @property
    def ranks(self) -> int:
        return self.work.ranks

    @property
    def step_s(self) -> float:
        """One steady optimizer step (what a trial's median step measures, and calibration fits)."""
        return (
            self.compute_s
            + self.memory_s
            + self.host_s
            + self.overhead_s
            + self.dropout_s
            + self.loss_s
            + self.head_s
            + self.collectives_s
            + self.zero_s
        )

    @property
    def steady_samples_per_s(self) -> float:
        """Samples a second of the steady steps alone, before the pass counted in :attr:`run_share`."""
        return self.work.samples * self.ranks / self.step_s

    @property
    def run_share(self) -> float:
        """What is left of the steady rate over the user's run once the trainer's pass before the first step
        is counted (``over_the_run``, as a trial's measured rates count it): 1 without such a pass."""
        steady = self.steady_samples_per_s
        return over_the_run(steady, self.setup_s_per_sample, self.work.run_passes) / steady if steady > 0 else 1.0

    @property
    def samples_per_s(self) -> float:
        """Samples a second over the user's run (the pass before training counted, where there is one)."""
        return self.steady_samples_per_s * self.run_share

    @property
    def tokens_per_s(self) -> float:
        """Real (non-padding) tokens per second, over the user's run as :attr:`samples_per_s`."""
        return self.work.real_tokens * self.ranks / self.step_s * self.run_share

    @property
    def model_tflops(self) -> float:
        return self.work.model_flops * self.ranks / self.step_s / 1e12 * self.run_share

    @property
    def mfu(self) -> float | None:
        return self.model_tflops / self.ranks / self.mfu_peak_tflops if self.mfu_peak_tflops else None

    def parts(self) -> dict[str, float]:
        return {
            "compute": self.compute_s,
            "memory": self.memory_s,
            "host": self.host_s,
            "dropout": self.dropout_s,
            "loss": self.loss_s,
            "head": self.head_s,
            "collectives": self.collectives_s,
            "zero_own_work": self.zero_s,
            "overhead": self.overhead_s,
        }


def predict_speed(work: StepWork, fit: SpeedFit) -> SpeedEstimate | None:
    """The step's time with the device's rates, on each of the work's ``ranks`` devices; ``None`` where the device's
    peak for the dtype is unknown."""
    rate = fit.matmul_rate_tflops(work.matmul_dtype, work.matmul_inner)
    if not rate:
        return None
    compute_s = work.matmul_flops / (rate * 1e12 * fit.achievable_fraction)
    if work.fp32_matmul_flops:
        fp32_rate = fit.matmul_rate_tflops("fp32", work.matmul_inner) or rate
        compute_s += work.fp32_matmul_flops / (fp32_rate * 1e12 * fit.achievable_fraction)
    setup_s = (
        work.setup_matmul_flops_per_sample / (rate * 1e12 * fit.achievable_fraction)
        + work.setup_memory_bytes_per_sample / fit.bandwidth_bytes_per_s
    )
    return SpeedEstimate(
        work=work,
        compute_s=compute_s,
        memory_s=work.memory_bytes / fit.bandwidth_bytes_per_s,
        host_s=work.host_bytes / fit.link_bytes_per_s,
        overhead_s=work.launches * fit.op_overhead_s + fit.step_overhead_s,
        mfu_peak_tflops=fit.mfu_peaks_tflops.get(work.matmul_dtype),
        setup_s_per_sample=setup_s / work.ranks,  # the ranks share the pass over the data, a shard each
        dropout_s=work.dropout_elements * fit.dropout_s_per_element,
        loss_s=work.loss_logits * fit.loss_s_per_logit,
        head_s=work.head_logits * fit.head_s_per_logit,
        collectives_s=collectives_seconds(work, fit, compute_s),
        zero_s=zero_rank_share(work.ranks)
        * (work.zero_params * fit.zero_s_per_param + work.zero_bytes / fit.bandwidth_bytes_per_s),
    )


def collectives_seconds(work: StepWork, fit: SpeedFit, compute_s: float) -> float:
    """What the ranks' collectives add to a step whose matmuls take ``compute_s``: their bytes over the bus
    bandwidths, times the ring's ``(N - 1) / N`` (none on one rank), less what runs behind the compute."""
    if work.ranks <= 1:
        return 0.0
    collectives = work.collectives
    ring = (work.ranks - 1) / work.ranks
    traffic_s = ring * (
        2 * collectives.all_reduce_bytes / fit.all_reduce_bus_bytes_per_s
        + collectives.shard_bytes / fit.shard_bus_bytes_per_s
    )
    return max(traffic_s - collectives.hidden_share * compute_s, 0.0)


def estimate_speed(
    model: ModelSpec,
    config: TrialConfig,
    seq_len: int,
    fit: SpeedFit,
    matmul_dtype: str,
    lengths: Sequence[int] | None = None,
) -> SpeedEstimate | None:
    """:func:`step_work` then :func:`predict_speed`: one configuration's predicted speed on the fit's device."""
    return predict_speed(step_work(model, config, seq_len, fit.device_kind, matmul_dtype, lengths), fit)


@dataclasses.dataclass(frozen=True)
class SpeedModel:
    """The throughput prior of one workload: its device's rates, how a config's matmul dtype is read (the
    workload's ``peak_dtype``: tf32 where TF32 is on), the user's sample lengths where known, and how many
    times the user's run goes over its data at a config's global batch (``run_passes``: a pass the trainer
    runs before training is counted over them), and the ranks a trial spans (``--devices-per-trial``), whose
    rates it predicts together as a trial records them."""

    fit: SpeedFit
    matmul_dtype: Callable[[TrialConfig], str]
    lengths: tuple[int, ...] | None = None
    run_passes: Callable[[TrialConfig], float] | None = None
    ranks: int = 1

    def work(self, model: ModelSpec, config: TrialConfig, seq_len: int) -> StepWork:
        work = step_work(model, config, seq_len, self.fit.device_kind, self.matmul_dtype(config), self.lengths)
        work = dataclasses.replace(work, ranks=self.ranks)
        if self.run_passes is None or not work.setup_matmul_flops_per_sample:
            return work
        return dataclasses.replace(work, run_passes=self.run_passes(config))

    def estimate(self, model: ModelSpec, config: TrialConfig, seq_len: int) -> SpeedEstimate | None:
        return predict_speed(self.work(model, config, seq_len), self.fit)
