"""The throughput prior (autotune/estimate/_speed.py, _speed_prior.py): its arithmetic against hand-computed
cases, its monotonicity, its device rates, and its calibration on measured step times."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.estimate import (
    SpeedFit,
    estimate_speed,
    fit_speed,
    predict_speed,
    speed_prior,
    step_work,
    typical_micro_batch,
)
from autotune.estimate._activations import attention_score_bytes
from autotune.estimate._elementwise import eager_layer_traffic
from autotune.estimate._speed import (
    ELEMENTWISE_PASSES,
    FUSED_HEAD_FALLBACK_REFERENCE_BYTES_PER_LOGIT,
    LOSS_BYTES_PER_LOGIT,
)
from autotune.estimate._speed_prior import CPU_EMULATED_SLOWDOWN, TRAINING_MATMUL_FRACTION
from autotune.levers import PADDED, MemoryTraits, MicroBatchShape, TrialConfig, memory_traits
from autotune.levers.batching import PaddedToLongest
from autotune.levers.packing import TrlFlattened, TrlPacked
from autotune.spec.devices import DeviceSpec, known_gpu
from autotune.spec.flops import hardware_flops_per_sample, model_flops_per_sample
from autotune.spec.models import resolve_model

AVX2 = DeviceSpec("cpu", None, "test cpu", 8 * 2**30, ("fp32", "bf16"), cpu_flags=frozenset({"avx2", "fma"}))
AVX512_BF16 = dataclasses.replace(AVX2, cpu_flags=frozenset({"avx2", "fma", "avx512f", "avx512_bf16"}))
# Round rates for hand-computed cases: 1 TFLOPS at a fraction of 0.5, 1 GB/s, no overhead.
ROUND = SpeedFit("cpu", {"fp32": 1.0}, {"fp32": 1.0}, "test", 1e9, 1e9, 0.5, 0.0, 0.0)


@pytest.fixture(scope="module")
def bert():
    return resolve_model("bert-mini")


@pytest.fixture(scope="module")
def gpt2():
    return resolve_model("gpt2-tiny")


@pytest.fixture(scope="module")
def llama():
    return resolve_model("llama-tiny")


def test_compute_is_the_hardware_flops_over_the_peak_times_the_fraction(bert):
    """bert-mini (a classification head: no loss over a vocabulary) at micro-batch 4 of 128 tokens: the
    compute part is 4 samples' hardware FLOPs (spec/flops.py) over 1 TFLOPS x 0.5."""
    config = TrialConfig(micro_batch=4, checkpointing=True)
    estimate = estimate_speed(bert, config, 128, ROUND, "fp32")
    assert estimate is not None
    assert estimate.compute_s == pytest.approx(4 * hardware_flops_per_sample(bert, 128, True) / 0.5e12)
    assert estimate.work.model_flops == pytest.approx(4 * model_flops_per_sample(bert, 128))


def test_memory_counts_the_elementwise_passes_the_loss_and_the_optimizer(gpt2):
    """gpt2-tiny (an LM: the loss over 50,257 logits per token) at micro-batch 2 of 64 tokens, eager, fp32,
    fused AdamW: every byte of the memory part, by hand; on CUDA the loss's bytes among them, on a CPU its
    logits timed apart, per logit."""
    config = TrialConfig(micro_batch=2, optim="adamw_torch_fused")
    traits = memory_traits(config, "cuda")
    traffic = eager_layer_traffic(gpt2, 4, half_autocast=False)
    assert traffic is not None and traffic.forward > 0 and traffic.backward > traffic.forward
    scores = attention_score_bytes(gpt2, traits, "cuda", MicroBatchShape(rows=2, row_tokens=64))
    elementwise = gpt2.num_layers * (2 * 64 * (traffic.forward + traffic.backward) + scores * ELEMENTWISE_PASSES)
    logits = 2 * 64 * gpt2.vocab_size
    weights = gpt2.num_non_embedding_params * 4 * 3  # fp32 weights read in the forward and twice in the backward
    optimizer = gpt2.trainable_params * (28 + 3 * 4)  # one fused pass of 7 tensors, gradient clipping's 3
    on_cuda = step_work(gpt2, config, 64, "cuda", "fp32")
    assert on_cuda.memory_bytes == pytest.approx(elementwise + LOSS_BYTES_PER_LOGIT * logits + weights + optimizer)
    assert on_cuda.loss_logits == 0
    estimate = predict_speed(on_cuda, ROUND)
    assert estimate is not None and estimate.memory_s == pytest.approx(on_cuda.memory_bytes / 1e9)
    on_cpu = step_work(gpt2, config, 64, "cpu", "fp32")
    cpu_scores = attention_score_bytes(
        gpt2, memory_traits(config, "cpu"), "cpu", MicroBatchShape(rows=2, row_tokens=64)
    )
    cpu_elementwise = gpt2.num_layers * (
        2 * 64 * (traffic.forward + traffic.backward) + cpu_scores * ELEMENTWISE_PASSES
    )
    assert on_cpu.memory_bytes == pytest.approx(cpu_elementwise + weights + optimizer)
    assert on_cpu.loss_logits == logits


def test_the_plain_loss_is_timed_per_logit_on_a_cpu_and_by_its_bytes_on_cuda(gpt2, bert):
    """On a CPU cross-entropy's exp and log bound it (7-9 ns a logit measured, 7-9x its bytes at the memory
    bandwidth): the prior's CPU rate, none on CUDA; a fused loss and a classification head have no plain loss."""
    work = step_work(gpt2, TrialConfig(micro_batch=4), 64, "cpu", "fp32")
    rate = dataclasses.replace(ROUND, loss_s_per_logit=1e-8)
    estimate = predict_speed(work, rate)
    assert estimate is not None and estimate.parts()["loss"] == pytest.approx(4 * 64 * gpt2.vocab_size * 1e-8)
    assert estimate.step_s == pytest.approx(sum(estimate.parts().values()))
    assert speed_prior(AVX2, {}, cpu_cores=2).loss_s_per_logit > 0
    assert speed_prior(known_gpu("h100-sxm").device(), {}).loss_s_per_logit == 0
    fused = dataclasses.replace(gpt2, fused_lm_head=True)
    assert step_work(fused, TrialConfig(micro_batch=4), 64, "cpu", "fp32").loss_logits == 0
    assert bert.task == "sequence-classification"  # its head: two logits a sample, no loss over a vocabulary
    assert step_work(bert, TrialConfig(micro_batch=4), 64, "cpu", "fp32").loss_logits == 0


def test_a_fused_loss_and_compile_take_memory_traffic_away(gpt2):
    plain = step_work(gpt2, TrialConfig(micro_batch=4), 64, "cpu", "fp32")
    compiled = step_work(gpt2, TrialConfig(micro_batch=4, compile="inductor"), 64, "cpu", "fp32")
    assert compiled.memory_bytes < plain.memory_bytes and compiled.launches < plain.launches
    # A fused head (Liger's, TRL's Triton kernels) on CUDA: no traffic over the logits beyond the matmul.
    on_cuda = step_work(gpt2, TrialConfig(micro_batch=4), 64, "cuda", "fp32")
    fused = step_work(dataclasses.replace(gpt2, fused_lm_head=True), TrialConfig(micro_batch=4), 64, "cuda", "fp32")
    assert on_cuda.memory_bytes - fused.memory_bytes == pytest.approx(LOSS_BYTES_PER_LOGIT * 4 * 64 * gpt2.vocab_size)


def test_trls_fused_head_off_cuda_counts_its_torch_passes_and_the_reference_s(llama):
    """Off CUDA TRL's chunked head runs its torch fallback over every tile, timed per logit (46-53 ns measured on a
    CPU, 5x its passes' bytes; a DPO step spent 55 % of its time there), and the reference's head pass, still in
    bytes, only where each step runs the reference."""
    trl = dataclasses.replace(llama, fused_lm_head=True)
    plain = step_work(llama, TrialConfig(micro_batch=4), 64, "cpu", "fp32")
    fused = step_work(trl, TrialConfig(micro_batch=4), 64, "cpu", "fp32")
    logits = 4 * 64 * llama.vocab_size  # synthetic samples: every position is a real, labelled token
    # Its training pass timed per logit (the plain loss's logits none), its bytes not counted again.
    assert (plain.loss_logits, fused.loss_logits, plain.head_logits, fused.head_logits) == (logits, 0, 0, logits)
    assert fused.memory_bytes == pytest.approx(plain.memory_bytes)
    estimate = predict_speed(fused, dataclasses.replace(ROUND, head_s_per_logit=4e-8))
    assert estimate is not None and estimate.parts()["head"] == pytest.approx(logits * 4e-8)
    assert speed_prior(AVX2, {}, cpu_cores=2).head_s_per_logit > speed_prior(AVX2, {}, cpu_cores=2).loss_s_per_logit
    assert speed_prior(known_gpu("h100-sxm").device(), {}).head_s_per_logit == 0
    assert step_work(trl, TrialConfig(micro_batch=4), 64, "cuda", "fp32").head_logits == 0  # Triton folds it
    dpo = dataclasses.replace(trl, holds_reference=True)
    each_step = step_work(dpo, TrialConfig(micro_batch=4), 64, "cpu", "fp32")
    precomputed = step_work(dpo, TrialConfig(micro_batch=4, precompute_ref_log_probs=True), 64, "cpu", "fp32")
    assert each_step.memory_bytes - precomputed.memory_bytes == pytest.approx(
        FUSED_HEAD_FALLBACK_REFERENCE_BYTES_PER_LOGIT * logits
    )


def test_trls_fused_head_backward_runs_at_the_fp32_rate_off_cuda_under_bf16(llama):
    """TRL's ``_addmm_fp32`` keeps 16-bit operands only on CUDA: elsewhere the head's backward matmuls (the
    hidden states' gradient, the head's own unless frozen) run in fp32 from tiles cast up."""
    trl = dataclasses.replace(llama, fused_lm_head=True)
    bf16 = TrialConfig(micro_batch=4, dtype="bf16")
    on_cpu = step_work(trl, bf16, 64, "cpu", "bf16")
    per_token = 4 * llama.vocab_size * llama.hidden_size
    assert on_cpu.fp32_matmul_flops == pytest.approx(per_token * 4 * 64)
    plain = step_work(llama, bf16, 64, "cpu", "bf16")
    assert on_cpu.matmul_flops + on_cpu.fp32_matmul_flops == pytest.approx(plain.matmul_flops)  # moved, not added
    assert step_work(trl, bf16, 64, "cuda", "bf16").fp32_matmul_flops == 0  # the Triton path keeps bf16
    assert step_work(trl, TrialConfig(micro_batch=4), 64, "cpu", "fp32").fp32_matmul_flops == 0
    # At the fp32 rate: a device whose bf16 is 10x its fp32 spends the moved FLOPs' time at the fp32 rate.
    fit = SpeedFit("cpu", {"fp32": 1.0, "bf16": 10.0}, {}, "test", 1e12, 1e12, 1.0, 0.0, 0.0)
    estimate = predict_speed(on_cpu, fit)
    assert estimate is not None
    assert estimate.compute_s == pytest.approx(on_cpu.matmul_flops / 10e12 + on_cpu.fp32_matmul_flops / 1e12)


def test_a_calibration_at_narrow_inner_sizes_sets_the_rate_of_a_narrow_model():
    """bf16's lead over fp32 on a CPU shrinks with the matmuls' inner size (AMX needs deep tiles): a model as
    wide as the calibration's narrow matmuls is predicted at their rate, a wide one at the square peak."""
    inner = {"bf16": {64: 0.8, 256: 2.0, 2048: 2.4}, "fp32": {64: 0.3, 256: 0.31, 2048: 0.32}}
    fit = speed_prior(AVX512_BF16, {"bf16": 2.4, "fp32": 0.32}, measured_inner_tflops=inner)
    assert fit.matmul_rate_tflops("bf16", 64) == pytest.approx(0.8)
    assert fit.matmul_rate_tflops("bf16", 32) == pytest.approx(0.8)  # below the narrowest: held there
    assert fit.matmul_rate_tflops("bf16", 128) == pytest.approx(1.4)  # log-linear: halfway from 64 to 256
    assert fit.matmul_rate_tflops("bf16", 4096) == pytest.approx(2.4)  # past the square peak: the peak
    assert fit.matmul_rate_tflops("fp16", 64) is None  # no peak known: no rate
    narrow, wide = (dataclasses.replace(resolve_model("llama-tiny"), hidden_size=h) for h in (64, 2048))
    work = step_work(narrow, TrialConfig(micro_batch=4, dtype="bf16"), 64, "cpu", "bf16")
    estimate = predict_speed(work, fit)
    assert estimate is not None
    assert estimate.compute_s == pytest.approx(work.matmul_flops / (0.8e12 * fit.achievable_fraction))
    assert step_work(wide, TrialConfig(micro_batch=4, dtype="bf16"), 64, "cpu", "bf16").matmul_inner == 2048
    uncalibrated = speed_prior(AVX512_BF16, {"bf16": 2.4, "fp32": 0.32})
    assert uncalibrated.matmul_rate_tflops("bf16", 64) == pytest.approx(2.4)  # the peak alone


def test_dropout_draws_are_counted_where_the_config_drops_and_again_when_recomputed(bert, llama):
    """bert-mini drops out at 0.1 on its attention probabilities, residuals and embeddings: per token, each layer
    ``heads x 128`` attention probabilities and ``2 h`` residual elements, and ``h`` embeddings, all again in a
    recomputed forward, at the CPU's per-element rate and not at all on CUDA; llama-tiny (``attention_dropout``
    0.0, no other dropout) draws none."""
    assert bert.hf_config["hidden_dropout_prob"] == 0.1 and bert.hf_config["attention_probs_dropout_prob"] == 0.1
    per_token = bert.num_layers * (bert.num_heads * 128 + 2 * bert.hidden_size) + bert.hidden_size
    plain = step_work(bert, TrialConfig(micro_batch=4), 128, "cpu", "fp32")
    recomputed = step_work(bert, TrialConfig(micro_batch=4, checkpointing=True), 128, "cpu", "fp32")
    assert plain.dropout_elements == pytest.approx(4 * 128 * per_token)
    assert recomputed.dropout_elements == pytest.approx(2 * plain.dropout_elements)
    rate = dataclasses.replace(ROUND, dropout_s_per_element=1e-8)
    estimate = predict_speed(plain, rate)
    assert estimate is not None and estimate.parts()["dropout"] == pytest.approx(plain.dropout_elements * 1e-8)
    assert speed_prior(AVX2, {}, cpu_cores=2).dropout_s_per_element > 0
    assert speed_prior(known_gpu("h100-sxm").device(), {}).dropout_s_per_element == 0
    assert step_work(llama, TrialConfig(micro_batch=4), 128, "cpu", "fp32").dropout_elements == 0


def test_dpo_draws_no_dropout_where_it_switches_the_modules_off_unless_the_base_args_keep_them():
    """DPOTrainer sets every ``nn.Dropout`` to ``p = 0`` (``DPOConfig.disable_dropout``, default True): gpt2-tiny's
    attention, residual and embedding dropouts draw nothing under it, and draw again with ``disable_dropout:
    false``; a Llama-style ``attention_dropout`` is a float its attention reads, not a module, and stays."""
    from autotune.trainers import get, with_model

    gpt2 = resolve_model("gpt2-tiny")
    config = TrialConfig(micro_batch=2)

    def drawn(model, base_args=None):
        return step_work(with_model(model, get("dpo"), base_args), config, 64, "cpu", "fp32").dropout_elements

    assert step_work(with_model(gpt2, get("sft")), config, 64, "cpu", "fp32").dropout_elements > 0
    assert drawn(gpt2) == 0
    assert drawn(gpt2, {"disable_dropout": True}) == 0
    kept = drawn(gpt2, {"disable_dropout": False})
    assert kept == pytest.approx(
        step_work(with_model(gpt2, get("sft")), config, 64, "cpu", "fp32").dropout_elements * 2
    )
    llama = resolve_model("llama-tiny")
    dropping = dataclasses.replace(llama, hf_config={**llama.hf_config, "attention_dropout": 0.1})
    assert drawn(dropping) == drawn(dropping, {"disable_dropout": False}) > 0


def test_a_recomputed_forward_dispatches_the_forwards_ops_again(llama):
    """Checkpointing reruns each block's forward in the backward: its ~35 ops a layer are launched again (a
    third of them compiled); under CUDA graphs nothing is launched either way."""
    from autotune.estimate._speed import FORWARD_OPS_PER_LAYER

    for config, share in ((TrialConfig(micro_batch=2), 1.0), (TrialConfig(micro_batch=2, compile="inductor"), 1 / 3)):
        plain = step_work(llama, config, 64, "cpu", "fp32")
        recomputed = step_work(llama, dataclasses.replace(config, checkpointing=True), 64, "cpu", "fp32")
        extra = FORWARD_OPS_PER_LAYER * llama.num_layers * share
        assert recomputed.launches - plain.launches == pytest.approx(extra)
    graphs = TrialConfig(micro_batch=2, compile="inductor:reduce-overhead")
    assert step_work(llama, dataclasses.replace(graphs, checkpointing=True), 64, "cuda", "bf16").launches == (
        step_work(llama, graphs, 64, "cuda", "bf16").launches
    )


def test_lora_costs_four_n_for_the_frozen_base(llama):
    from autotune.spec.peft import with_peft

    lora = with_peft(llama, "lora", AVX2, [])
    full = step_work(llama, TrialConfig(micro_batch=1), 32, "cpu", "fp32")
    adapted = step_work(lora, TrialConfig(micro_batch=1), 32, "cpu", "fp32")
    saved = 2 * llama.num_non_embedding_params - 6 * lora.peft.adapter_params  # type: ignore[union-attr]
    assert full.matmul_flops - adapted.matmul_flops == pytest.approx(32 * saved)


def test_gradient_accumulation_shares_the_optimizer_step(bert):
    one = step_work(bert, TrialConfig(micro_batch=8, grad_accum=1), 128, "cpu", "fp32")
    four = step_work(bert, TrialConfig(micro_batch=8, grad_accum=4), 128, "cpu", "fp32")
    assert four.samples == 4 * one.samples and four.matmul_flops == pytest.approx(4 * one.matmul_flops)
    assert four.memory_bytes < 4 * one.memory_bytes  # one optimizer step for the four micro-batches


DEVICES = [AVX2, AVX512_BF16, known_gpu("h100-sxm").device(), known_gpu("a10g").device()]


@pytest.mark.parametrize("device", DEVICES, ids=lambda d: d.name if d.kind == "cuda" else sorted(d.cpu_flags)[-1])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama"])
def test_more_recompute_is_never_faster_and_a_bigger_micro_batch_never_less_utilised(device, name, request):
    model = request.getfixturevalue(name)
    fit = speed_prior(device, {})
    dtype = "bf16" if "bf16" in device.supported_dtypes else "fp32"
    for optim in ("adamw_torch", "adafactor"):
        utilisation = 0.0
        for micro_batch in (1, 2, 4, 8, 16, 32):
            config = TrialConfig(micro_batch=micro_batch, dtype=dtype, optim=optim)
            plain = estimate_speed(model, config, 128, fit, dtype)
            recomputed = estimate_speed(model, dataclasses.replace(config, checkpointing=True), 128, fit, dtype)
            assert plain is not None and recomputed is not None
            assert recomputed.step_s > plain.step_s
            assert plain.model_tflops >= utilisation
            utilisation = plain.model_tflops


def test_the_cpu_prior_ranks_bf16_by_its_matmul_hardware(bert):
    config = TrialConfig(micro_batch=16)
    for device, bf16_faster in ((AVX2, False), (AVX512_BF16, True)):
        fit = speed_prior(device, {}, cpu_cores=2)
        fp32 = estimate_speed(bert, config, 128, fit, "fp32")
        bf16 = estimate_speed(bert, dataclasses.replace(config, dtype="bf16"), 128, fit, "bf16")
        assert fp32 is not None and bf16 is not None
        assert (bf16.samples_per_s > fp32.samples_per_s) is bf16_faster
    assert speed_prior(AVX2, {}).peaks_tflops["bf16"] == pytest.approx(
        speed_prior(AVX2, {}).peaks_tflops["fp32"] / CPU_EMULATED_SLOWDOWN
    )


def test_measured_peaks_win_and_are_what_mfu_is_against_on_a_cpu():
    fit = speed_prior(AVX2, {"fp32": 0.1, "bf16": 0.002}, measured_bandwidth_gb_s=12.0)
    assert fit.peaks_tflops == {"fp32": 0.1, "bf16": 0.002} and fit.mfu_peaks_tflops == fit.peaks_tflops
    assert fit.bandwidth_bytes_per_s == 12e9 and fit.peak_source == "measured"
    assert speed_prior(AVX2, {}).mfu_peaks_tflops == {}  # no MFU against a nominal figure


def test_a_gpu_prior_is_its_datasheet_and_an_unknown_gpu_predicts_nothing(bert):
    h100 = known_gpu("h100-sxm").device()
    fit = speed_prior(h100, {})
    assert fit.peaks_tflops["bf16"] == pytest.approx(795.0)  # 989 x the measured matmul share 795/989
    assert fit.mfu_peaks_tflops["bf16"] == 989.0 and fit.bandwidth_bytes_per_s == 3350e9
    assert fit.achievable_fraction == TRAINING_MATMUL_FRACTION
    unknown = dataclasses.replace(h100, name="NVIDIA Mystery GPU")
    assert estimate_speed(bert, TrialConfig(), 128, speed_prior(unknown, {}), "bf16") is None


def test_typical_micro_batches_by_hand():
    lengths = [10, 30, 20, 40]  # mean 25, token-weighted mean (100 + 900 + 400 + 1600) / 100 = 30
    padded = typical_micro_batch(MemoryTraits(rows=2, batching=PADDED), 64, lengths)
    assert (padded.samples, padded.computed_tokens, padded.real_tokens, padded.model_context) == (2, 128, 50, 30)
    longest = typical_micro_batch(MemoryTraits(rows=2, batching=PaddedToLongest()), 64, lengths)
    assert longest.computed_tokens == 2 * (30 + 40) / 2 and longest.attended_context == 35
    flat = typical_micro_batch(MemoryTraits(rows=2, batching=TrlFlattened()), 64, lengths)
    assert flat.computed_tokens == 50 and flat.attended_context == 50  # a mask-based kernel attends the whole row
    varlen = typical_micro_batch(MemoryTraits(rows=2, batching=TrlFlattened(), reads_boundaries=True), 64, lengths)
    assert varlen.attended_context == 30
    packed = typical_micro_batch(MemoryTraits(rows=2, batching=TrlPacked(), reads_boundaries=True), 64, lengths)
    # TRL's bfd rows of 64: 40 + 20 and 30 + 10, two rows of 50 tokens and 2 samples on average, not full rows
    assert packed.computed_tokens == 100 and packed.samples == 4
    synthetic = typical_micro_batch(MemoryTraits(rows=2, batching=PADDED), 64)
    assert (synthetic.samples, synthetic.real_tokens, synthetic.model_context) == (2, 128, 64)


def test_fit_speed_recovers_the_fraction_and_the_overhead(bert):
    """Step times made by the model itself at a fraction of 0.3 and 40 ms per step: the fit finds both."""
    prior = speed_prior(AVX512_BF16, {}, cpu_cores=2)
    truth = dataclasses.replace(prior, achievable_fraction=0.3, step_overhead_s=0.04)
    measured = []
    for micro_batch in (4, 16, 64):
        work = step_work(bert, TrialConfig(micro_batch=micro_batch), 128, "cpu", "fp32")
        measured.append((work, predict_speed(work, truth).step_s))  # type: ignore[union-attr]
    fitted = fit_speed(measured, prior)
    assert fitted.achievable_fraction == pytest.approx(0.3)
    assert fitted.step_overhead_s == pytest.approx(0.04)
    assert fitted.points == 3 and fitted.max_relative_error == pytest.approx(0.0, abs=1e-9)
    assert "calibrated on 3" in fitted.describe()
    one = fit_speed(measured[:1], prior)  # one trial: the fraction alone, the prior's overhead kept
    assert one.step_overhead_s == prior.step_overhead_s and one.achievable_fraction != prior.achievable_fraction
    assert fit_speed([], prior) is prior


def test_the_weights_bytes_follow_how_each_kind_of_weight_runs(gpt2):
    """Per non-embedding parameter and micro-batch under bf16 autocast over fp32 weights: a trained weight read twice
    and its gradient written (3 passes of its 16-bit copy) plus the copy cast from fp32 (4 + 2): 12 bytes; a frozen
    base (LoRA) 2 passes: 10; a 4-bit base (QLoRA) dequantized at both uses, no autocast copy: 2 x (0.5625 + 2 + 2)."""
    from autotune.estimate._parts import QUANTIZED_4BIT_BYTES
    from autotune.estimate._speed import weight_read_bytes
    from autotune.spec.models import PeftSpec

    traits = memory_traits(TrialConfig(micro_batch=2, dtype="bf16"), "cuda")
    n = gpt2.num_non_embedding_params
    assert weight_read_bytes(gpt2, traits) == pytest.approx(12 * n)
    lora = dataclasses.replace(gpt2, peft=PeftSpec(adapter_config={"r": 8}, quantize=None, adapter_params=1000))
    assert weight_read_bytes(lora, traits) == pytest.approx(10 * n)
    qlora_peft = PeftSpec(adapter_config={"r": 8}, quantize="4bit", adapter_params=1000, quantized_params=n // 2)
    qlora = dataclasses.replace(gpt2, peft=qlora_peft)
    per_quantized = 2 * (QUANTIZED_4BIT_BYTES + 2 + 2)
    assert weight_read_bytes(qlora, traits) == pytest.approx(10 * (n - n // 2) + per_quantized * (n // 2))
    assert per_quantized < 10  # dequantizing 4-bit weights moves less than casting fp32 ones
    recomputed = memory_traits(TrialConfig(micro_batch=2, dtype="bf16", checkpointing=True), "cuda")
    assert weight_read_bytes(qlora, recomputed) == pytest.approx(
        (n - n // 2) * (2 * 3 + 6 * 2) + 3 * (QUANTIZED_4BIT_BYTES + 4) * (n // 2)
    )


def test_each_planned_row_is_at_the_compile_setting_the_prior_predicts_fastest():
    """`torch.compile` changes no memory, so the planner's memory-distinct rows once all sat at the space's first
    choice (off), and a compiled config could never be the predicted winner. Now each row takes the speed-only
    levers' fastest values: on an H100, Llama-3.1-8B at 4k tokens gains from fused elementwise work."""
    from autotune.estimate import MemoryFit, plan_rows
    from autotune.estimate._speed_time import SpeedModel

    model = resolve_model("llama-3.1-8b")
    speed = SpeedModel(speed_prior(known_gpu("h100-sxm").device(), {}), lambda config: "bf16")
    choices = {"micro_batch": [1], "dtype": ["bf16"], "weight_dtype": ["bf16"], "compile": ["off", "inductor"]}
    rows = plan_rows(model, choices, 4096, MemoryFit.prior("cuda"), 200 * 2**30, speed)
    assert [row.config.compile for row in rows] == ["inductor"]
    off = speed.estimate(model, dataclasses.replace(rows[0].config, compile="off"), 4096)
    assert rows[0].speed is not None and off is not None and rows[0].speed.model_tflops > off.model_tflops


def test_a_trial_of_two_ranks_is_predicted_as_a_trial_records_it_and_its_run_takes_half_as_long():
    """A trial of N ranks records its ranks' rates summed and MFU per device (runner/_ranks.py): the prediction
    says the same, and the whole run over N devices takes 1/N the time at the same cost (it once took as long as
    on one device and cost N times as much)."""
    from autotune.estimate._speed_time import SpeedModel
    from autotune.result import duration
    from autotune.result._run_time import money
    from autotune.views.run_time import predicted_run_time

    model = resolve_model("llama-3.2-1b")
    one = SpeedModel(speed_prior(known_gpu("h100-sxm").device(), {}), lambda config: "bf16")
    config = TrialConfig(micro_batch=4, dtype="bf16", weight_dtype="bf16")
    alone, paired = one.estimate(model, config, 2048), dataclasses.replace(one, ranks=2).estimate(model, config, 2048)
    assert alone is not None and paired is not None and alone.mfu is not None
    assert paired.step_s == alone.step_s  # each rank's step trains its own micro-batches
    for rate in ("samples_per_s", "tokens_per_s", "model_tflops"):
        assert getattr(paired, rate) == pytest.approx(2 * getattr(alone, rate)), rate
    assert paired.mfu == pytest.approx(alone.mfu)
    samples = 100_000
    for ranks, speed in ((1, alone), (2, paired)):
        line = predicted_run_time({}, 1.0, samples, (config, speed), None, 2.0, ranks, "trainer")
        assert line is not None
        seconds = samples / (ranks * alone.samples_per_s)
        assert f": {duration(seconds)} (predicted winner" in line, line
        assert f"cost {money(samples / alone.samples_per_s / 3600 * 2.0)} at $2/h per device" in line, line
