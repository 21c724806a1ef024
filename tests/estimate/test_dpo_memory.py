"""DPO's memory terms (autotune/estimate/_dpo.py): the reference copy TRL holds, or none, and two rows a pair."""

from __future__ import annotations

from autotune.estimate._dpo import dpo_memory_terms
from autotune.spec.devices import DeviceSpec
from autotune.spec.models import resolve_model
from autotune.spec.peft import with_peft

CPU = DeviceSpec("cpu", None, "test cpu", 8 * 2**30, ("fp32", "bf16"), cpu_flags=frozenset({"avx2", "fma"}))


def test_full_fine_tuning_holds_a_copy_of_the_weights_in_the_policy_dtype():
    model = resolve_model("smollm2-135m")
    assert dpo_memory_terms(model, 8, 4, {}).reference_weights_bytes == model.num_params * 4
    assert dpo_memory_terms(model, 8, 2, {}).reference_weights_bytes == model.num_params * 2


def test_precomputed_reference_log_probs_and_peft_hold_no_copy():
    model = resolve_model("smollm2-135m")
    assert dpo_memory_terms(model, 8, 4, {"precompute_ref_log_probs": True}).reference_weights_bytes == 0
    lora = with_peft(model, "lora", CPU, [])
    assert dpo_memory_terms(lora, 8, 4, {}).reference_weights_bytes == 0


def test_a_micro_batch_of_pairs_is_twice_as_many_rows():
    model = resolve_model("llama-tiny")
    assert dpo_memory_terms(model, 4, 4, {}).rows == 8
