"""What a trial's ranks send each other (autotune/estimate/_collectives.py) and what it adds to the step
(_speed_time.collectives_seconds): the bytes of each data-parallel scheme, the ring's (N - 1) / N, what the compute
hides, and the bus bandwidths of the devices."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.estimate import fit_speed, predict_speed, speed_prior, step_work
from autotune.estimate._collectives import BACKWARD_SHARE
from autotune.estimate._speed_prior import (
    CPU_ALL_REDUCE_BUS_BYTES_PER_S,
    NVLINK_BUS_SHARE,
    PCIE_BUS_SHARE,
    PCIE_BYTES_PER_S,
)
from autotune.levers import TrialConfig
from autotune.spec.devices import DeviceSpec, known_gpu
from autotune.spec.models import PeftSpec, resolve_model

CPU = DeviceSpec("cpu", None, "test cpu", 8 * 2**30, ("fp32", "bf16"), cpu_flags=frozenset({"avx2", "fma"}))


@pytest.fixture(scope="module")
def gpt2():
    return resolve_model("gpt2-tiny")


def work(model, device_kind: str, ranks: int, **levers):
    config = TrialConfig(dtype="bf16", **levers)
    return dataclasses.replace(step_work(model, config, 64, device_kind, "bf16"), ranks=ranks)


def test_each_scheme_moves_what_its_implementation_sends(gpt2):
    """Plain DDP all-reduces the fp32 gradients once a step, whatever the accumulation; ZeRO-1 reduce-scatters the
    16-bit gradients once and gathers the updated 16-bit partitions; ZeRO-2 reduces at every micro-batch; ZeRO-3
    gathers every parameter twice a micro-batch; FSDP's full shard gathers twice, shard-grad-op once."""
    n = gpt2.num_params
    ddp = work(gpt2, "cuda", 2, micro_batch=2, grad_accum=4).collectives
    assert (ddp.all_reduce_bytes, ddp.shard_bytes) == (4 * n, 0)
    zero1 = work(gpt2, "cuda", 2, micro_batch=2, grad_accum=4, zero="1").collectives
    zero2 = work(gpt2, "cuda", 2, micro_batch=2, grad_accum=4, zero="2").collectives
    zero3 = work(gpt2, "cuda", 2, micro_batch=2, grad_accum=4, zero="3").collectives
    assert zero1.shard_bytes == 2 * (2 * n) and zero1.all_reduce_bytes == 0
    assert zero2.shard_bytes == (4 + 1) * (2 * n)
    assert zero3.shard_bytes == 4 * (2 * 2 * n + 2 * n)
    full = work(gpt2, "cuda", 2, micro_batch=2, grad_accum=4, fsdp="full_shard").collectives
    grad_op = work(gpt2, "cuda", 2, micro_batch=2, grad_accum=4, fsdp="shard_grad_op").collectives
    assert full.shard_bytes - grad_op.shard_bytes == 4 * 2 * n


def test_under_lora_only_the_adapters_are_reduced_but_zero_3_still_gathers_the_base(gpt2):
    lora = dataclasses.replace(gpt2, peft=PeftSpec({}, None, 10_000))
    ddp = work(lora, "cuda", 2, micro_batch=2).collectives
    assert ddp.all_reduce_bytes == 4 * 10_000
    zero3 = work(lora, "cuda", 2, micro_batch=2, zero="3").collectives
    assert zero3.shard_bytes == 2 * 2 * lora.num_params + 2 * 10_000


def test_one_rank_sends_nothing_and_more_ranks_approach_the_whole_ring(gpt2):
    fit = speed_prior(CPU, {}, cpu_cores=1)
    one, two, eight = (predict_speed(work(gpt2, "cpu", r, micro_batch=2), fit) for r in (1, 2, 8))
    assert one is not None and two is not None and eight is not None
    assert one.collectives_s == 0.0
    # On a CPU nothing hides: gloo's copies take the cores. All-reduce: 2 (N - 1) / N of the gradients' bytes.
    assert two.collectives_s == pytest.approx(2 * 0.5 * 4 * gpt2.num_params / CPU_ALL_REDUCE_BUS_BYTES_PER_S)
    assert eight.collectives_s == pytest.approx(two.collectives_s * (7 / 8) / (1 / 2))
    assert two.step_s - one.step_s == pytest.approx(two.collectives_s)
    assert "collectives" in two.parts()


def test_ddp_hides_its_all_reduce_behind_the_last_backward_and_zero_2_does_not(gpt2):
    """On CUDA DDP's buckets reduce during the last micro-batch's backward: exposed only beyond it. ZeRO-2 without
    ``overlap_comm`` (DeepSpeed's default below stage 3) waits for each reduction."""
    fit = dataclasses.replace(speed_prior(known_gpu("rtx-4090").device(), {}), all_reduce_bus_bytes_per_s=1e9)
    ddp = predict_speed(work(gpt2, "cuda", 2, micro_batch=2, grad_accum=2), fit)
    assert ddp is not None
    traffic = 2 * 0.5 * 4 * gpt2.num_params / 1e9
    assert ddp.collectives_s == pytest.approx(max(traffic - BACKWARD_SHARE / 2 * ddp.compute_s, 0.0))
    assert 0 < ddp.collectives_s < traffic
    zero2 = predict_speed(work(gpt2, "cuda", 2, micro_batch=2, grad_accum=2, zero="2"), fit)
    assert zero2 is not None
    assert zero2.collectives_s == pytest.approx(0.5 * (2 + 1) * 2 * gpt2.num_params / fit.shard_bus_bytes_per_s)


def test_gpus_meet_over_nvlink_where_the_datasheet_has_it_else_over_pcie():
    h100 = speed_prior(known_gpu("h100-sxm").device(), {})
    assert h100.all_reduce_bus_bytes_per_s == pytest.approx(450e9 * NVLINK_BUS_SHARE)
    pcie = speed_prior(known_gpu("h100-pcie").device(), {})
    assert pcie.shard_bus_bytes_per_s == pytest.approx(PCIE_BYTES_PER_S[9] * PCIE_BUS_SHARE)
    a100_card = dataclasses.replace(known_gpu("a100-80gb").device(), name="NVIDIA A100 80GB PCIe")
    assert speed_prior(a100_card, {}).all_reduce_bus_bytes_per_s == pytest.approx(PCIE_BYTES_PER_S[8] * PCIE_BUS_SHARE)
    assert speed_prior(known_gpu("a100-80gb").device(), {}).all_reduce_bus_bytes_per_s > 5 * (
        speed_prior(a100_card, {}).all_reduce_bus_bytes_per_s
    )


def test_the_fit_keeps_the_collectives_out_of_the_fraction(gpt2):
    """Step times of two ranks made by the model at a fraction of 0.3 and 40 ms: the fit finds both, the collectives'
    seconds held as a part it does not fit."""
    prior = speed_prior(CPU, {}, cpu_cores=1)
    truth = dataclasses.replace(prior, achievable_fraction=0.3, step_overhead_s=0.04)
    measured = []
    for micro_batch in (2, 8, 32):
        each = work(gpt2, "cpu", 2, micro_batch=micro_batch)
        measured.append((each, predict_speed(each, truth).step_s))  # type: ignore[union-attr]
    assert predict_speed(measured[0][0], truth).collectives_s > 0  # type: ignore[union-attr]
    fitted = fit_speed(measured, prior)
    assert fitted.achievable_fraction == pytest.approx(0.3)
    assert fitted.step_overhead_s == pytest.approx(0.04)


def test_a_cpu_rank_runs_on_its_share_of_the_machine_that_was_calibrated_with_every_core():
    """Two ranks on one CPU each train on half of its cores: what the calibration measured with all of them (matmul
    rates, bandwidth, the loss's per-logit rate) is a rank's at half; dropout's serial draws and the peak MFU is
    judged against are not shared."""
    import os

    from autotune.runner import Workload

    measured, rates = {"fp32": 1.0, "bf16": 4.0}, {"loss_s_per_logit": 8e-9, "dropout_s_per_element": 1e-8}
    whole = speed_prior(CPU, measured, 20.0, 8, {"bf16": {64: 1.0, 4096: 4.0}}, rates)
    half = speed_prior(CPU, measured, 20.0, 4, {"bf16": {64: 1.0, 4096: 4.0}}, rates, rank_share=0.5)
    assert half.peaks_tflops == {"fp32": 0.5, "bf16": 2.0} and half.mfu_peaks_tflops == whole.mfu_peaks_tflops
    assert half.bandwidth_bytes_per_s == whole.bandwidth_bytes_per_s / 2
    assert half.inner_rates_tflops["bf16"] == ((64, 0.5), (4096, 2.0))
    assert half.loss_s_per_logit == 2 * whole.loss_s_per_logit
    assert half.dropout_s_per_element == whole.dropout_s_per_element
    cores = os.cpu_count() or 1
    two = Workload.for_model("gpt2-tiny", seq_len=64, ceiling_bytes=2**30, devices_per_trial=2).speed_model().fit
    one = Workload.for_model("gpt2-tiny", seq_len=64, ceiling_bytes=2**30).speed_model().fit
    assert two.bandwidth_bytes_per_s == pytest.approx(one.bandwidth_bytes_per_s * max(1, cores // 2) / cores)


def test_zeros_own_work_is_counted_per_reduction_where_its_step_runs_on_the_device(gpt2):
    """DeepSpeed's ZeRO optimizer passes over every trained gradient at each reduction: once a step at stage 1, at
    every micro-batch at stages 2 and 3; none under offload (DeepSpeed's CPU Adam steps the partition the gradients
    land in) or without ZeRO. A rank of several passes over the whole gradient twice and over its own partition
    three times. On a CPU it is timed per parameter; on CUDA it is the passes' bytes over the memory bandwidth."""
    from autotune.estimate._speed_time import ZERO_S_PER_PARAM

    n, cpu = gpt2.trainable_params, speed_prior(CPU, {}, cpu_cores=1)

    def zero_s(zero: str, grad_accum: int, ranks: int = 1) -> float:
        each = work(gpt2, "cpu", ranks, micro_batch=2, grad_accum=grad_accum, zero=zero)
        return predict_speed(each, cpu).zero_s  # type: ignore[union-attr]

    assert zero_s("off", 4) == 0.0
    assert zero_s("1", 1) == zero_s("1", 4) == pytest.approx(n * ZERO_S_PER_PARAM["cpu"])
    assert zero_s("2", 4) == zero_s("3", 4) == pytest.approx(4 * n * ZERO_S_PER_PARAM["cpu"])
    assert zero_s("2", 4, ranks=2) == pytest.approx(zero_s("2", 4) * (2 + 3 / 2) / 5)
    assert zero_s("2", 4, ranks=8) == pytest.approx(zero_s("2", 4) * (2 + 3 / 8) / 5)
    assert zero_s("2+offload", 4) == zero_s("3+offload", 4) == 0.0
    # On CUDA: the 16-bit gradients (bf16 here) read and written 5 times a reduction, over the memory bandwidth.
    h100 = speed_prior(known_gpu("h100-sxm").device(), {})
    on_gpu = {
        z: predict_speed(work(gpt2, "cuda", 1, micro_batch=2, grad_accum=4, zero=z), h100) for z in ("2", "2+offload")
    }
    assert on_gpu["2"].zero_s == pytest.approx(4 * n * 5 * 2 * 2 / h100.bandwidth_bytes_per_s)  # type: ignore[union-attr]
    assert on_gpu["2+offload"].zero_s == 0.0  # type: ignore[union-attr]


def test_the_fit_keeps_zeros_own_work_out_of_the_fraction(gpt2):
    """ZeRO-2 trials made by the model at a fraction of 0.3 and 40 ms: the fit finds both, DeepSpeed's own work held
    as a part it does not fit (counted into the compute, it would pull the fraction down)."""
    prior = speed_prior(CPU, {}, cpu_cores=1)
    truth = dataclasses.replace(prior, achievable_fraction=0.3, step_overhead_s=0.04)
    measured = []
    for micro_batch in (2, 8, 32):
        each = work(gpt2, "cpu", 1, micro_batch=micro_batch, grad_accum=2, zero="2")
        measured.append((each, predict_speed(each, truth).step_s))  # type: ignore[union-attr]
    fitted = fit_speed(measured, prior)
    assert fitted.achievable_fraction == pytest.approx(0.3)
    assert fitted.step_overhead_s == pytest.approx(0.04)
