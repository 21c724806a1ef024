"""DPO's memory in the prior (autotune/estimate/_parts.py, through the trainer's model: trainers.with_model): the
reference copy TRL holds, or none, and two rows a pair."""

from __future__ import annotations

import dataclasses

from autotune.estimate import estimate_peak, memory_prior
from autotune.levers import TrialConfig
from autotune.spec.devices import DeviceSpec
from autotune.spec.models import resolve_model
from autotune.spec.peft import with_peft
from autotune.trainers import get, with_model

CPU = DeviceSpec("cpu", None, "test cpu", 8 * 2**30, ("fp32", "bf16"), cpu_flags=frozenset({"avx2", "fma"}))
SEQ = 256


def peak(model, **levers):
    return estimate_peak(model, TrialConfig(**levers), SEQ, memory_prior(CPU, {}))  # no allocator settings


def test_full_fine_tuning_holds_a_copy_of_the_weights_in_the_policy_dtype():
    base = with_model(resolve_model("smollm2-135m"), get("sft"))
    dpo = with_model(resolve_model("smollm2-135m"), get("dpo"))
    for weight_dtype, dtype, size in (("fp32", "fp32", 4), ("bf16", "bf16", 2)):
        extra = peak(dpo, micro_batch=1, weight_dtype=weight_dtype, dtype=dtype).weights_bytes
        plain = peak(base, micro_batch=1, weight_dtype=weight_dtype, dtype=dtype).weights_bytes
        assert extra - plain == dpo.num_params * size


def test_precomputed_reference_log_probs_and_peft_hold_no_copy():
    base = with_model(resolve_model("smollm2-135m"), get("sft"))
    dpo = with_model(resolve_model("smollm2-135m"), get("dpo"))
    plain = peak(base, micro_batch=1).weights_bytes
    assert peak(dpo, micro_batch=1, precompute_ref_log_probs=True).weights_bytes == plain
    lora = with_model(with_peft(resolve_model("smollm2-135m"), "lora", CPU, []), get("dpo"))
    lora_sft = dataclasses.replace(lora, holds_reference=False)
    assert peak(lora, micro_batch=1).weights_bytes == peak(lora_sft, micro_batch=1).weights_bytes


def test_a_micro_batch_of_pairs_holds_the_activations_of_twice_as_many_rows():
    dpo = with_model(resolve_model("llama-tiny"), get("dpo"))
    one_row_a_sample = dataclasses.replace(dpo, rows_per_sample=1)
    assert peak(dpo, micro_batch=2).activations_bytes == peak(one_row_a_sample, micro_batch=4).activations_bytes
    assert peak(dpo, micro_batch=2).activations_bytes > peak(one_row_a_sample, micro_batch=2).activations_bytes
