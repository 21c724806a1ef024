"""The ``zero`` lever: its DeepSpeed configs, their rules with other levers, when a space searches
it, and the estimator's per-rank arithmetic (Rajbhandari et al. 2019, arXiv:1910.02054)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from autotune.errors import AutotuneError
from autotune.estimate import MeasuredMemory, MemoryFit, estimate_peak, fit_memory
from autotune.estimate._zero import DEEPSPEED_CPU_PROCESS_BYTES, deepspeed_buffer_elements, zero_state_bytes
from autotune.levers import (
    LEVERS,
    TrialConfig,
    deepspeed_config,
    lever_values_from_base_args,
    memory_traits,
    training_arguments_kwargs,
)
from autotune.levers.distributed import ZERO_CHOICES, zero_with_other_levers
from autotune.space import load_space
from autotune.units import GiB

needs_deepspeed = pytest.mark.skipif(
    __import__("importlib").util.find_spec("deepspeed") is None, reason="deepspeed is the [deepspeed] extra"
)


def test_each_value_is_one_deepspeed_config_and_off_writes_nothing():
    assert "deepspeed" not in training_arguments_kwargs(TrialConfig(), "cpu")
    for value in ZERO_CHOICES[1:]:
        config = deepspeed_config(value)
        stage = int(value[0])
        assert config["zero_optimization"]["stage"] == stage
        offload = value.endswith("+offload")
        assert ("offload_optimizer" in config["zero_optimization"]) is offload
        assert ("offload_param" in config["zero_optimization"]) is (offload and stage == 3)
        # Offload names DeepSpeed's own AdamW (its CPU Adam); otherwise the Trainer's optim is used.
        assert ("optimizer" in config) is offload
        assert training_arguments_kwargs(TrialConfig(zero=value), "cpu")["deepspeed"] == config


@needs_deepspeed
@pytest.mark.parametrize("value", ["2", "3+offload"])
def test_the_trainer_fills_every_auto_value_and_the_estimator_reads_the_same_buckets(value, gpt2_tiny):
    """transformers' own HfTrainerDeepSpeedConfig fills the config from the arguments and the model."""
    from transformers import AutoModelForCausalLM, GPT2Config, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    config = deepspeed_config(value)
    args = TrainingArguments(output_dir="unused", use_cpu=True, bf16=True, per_device_train_batch_size=4, report_to=[])
    # Built first: with a ZeRO-3 config alive, from_config would partition the model (zero.Init).
    model = AutoModelForCausalLM.from_config(GPT2Config(n_embd=gpt2_tiny.hidden_size, n_layer=1, n_head=2))
    filled = HfTrainerDeepSpeedConfig(config)
    try:
        filled.trainer_config_process(args)
        filled.trainer_config_finalize(args, model, num_training_steps=10)
    finally:
        unset_hf_deepspeed_config()
    assert "auto" not in json.dumps(filled.config), filled.config
    assert filled.config["train_micro_batch_size_per_gpu"] == 4 and filled.config["bf16"]["enabled"] is True
    zero = filled.config["zero_optimization"]
    bucket, weight_buffer = deepspeed_buffer_elements(gpt2_tiny, int(value[0]))
    assert bucket == min(zero["reduce_bucket_size"], gpt2_tiny.num_params)
    if value.startswith("3"):
        assert zero["stage3_prefetch_bucket_size"] == int(0.9 * gpt2_tiny.hidden_size**2)
        assert weight_buffer >= zero["stage3_prefetch_bucket_size"]


def test_base_args_with_a_deepspeed_config_fix_the_lever(tmp_path):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    assert lever_values_from_base_args({"deepspeed": str(path)}) == {"zero": "3+offload"}
    assert lever_values_from_base_args({"deepspeed": {"zero_optimization": {"stage": 0}}}) == {"zero": "off"}
    path.write_text("{not json")
    with pytest.raises(AutotuneError, match="not valid JSON"):
        lever_values_from_base_args({"deepspeed": str(path)})


def test_zero_states_per_rank_follow_the_paper(gpt2_tiny):
    """The ZeRO paper's Figure 1 (Psi = 7.5B, K = 12, N_d = 64): 4 Psi + K Psi / N_d = 31.4 GB,
    2 Psi + (2 + K) Psi / N_d = 16.6 GB, (2 + 2 + K) Psi / N_d = 1.9 GB per rank (printed rounded).
    autotune also counts DeepSpeed's fp32 gradient partition (4 Psi / N_d) and its buckets."""
    psi, ranks = 7_500_000_000, 64
    big = dataclasses.replace(
        gpt2_tiny, num_params=psi, num_embedding_params=0, hidden_size=4096, intermediate_size=16384, num_layers=32
    )
    paper = {"1": 4 * psi + 12 * psi / ranks, "2": 2 * psi + 14 * psi / ranks, "3": 16 * psi / ranks}
    assert [round(v / 1e9, 1) for v in paper.values()] == [31.4, 16.6, 1.9]
    for value, expected in paper.items():
        states = zero_state_bytes(big, memory_traits(TrialConfig(dtype="bf16", zero=value), "cuda"), ranks, "cuda")
        bucket, weight_buffer = deepspeed_buffer_elements(big, int(value))
        ours = states.weights_bytes + states.gradients_bytes + states.optimizer_bytes
        extras = 4 * psi // ranks + 2 * bucket + 2 * weight_buffer
        assert abs((ours - extras) - expected) <= 0.001 * expected, (value, ours - extras)
        assert states.host_bytes == 0


@pytest.mark.parametrize("value", ["1", "2", "3"])
def test_partitioned_parts_shrink_with_the_ranks_and_the_rest_does_not(value, gpt2_tiny):
    config = TrialConfig(dtype="bf16", zero=value)
    one, eight = (zero_state_bytes(gpt2_tiny, memory_traits(config, "cuda"), ranks, "cuda") for ranks in (1, 8))
    n = gpt2_tiny.num_params
    assert one.optimizer_bytes == (4 + 8) * n and eight.optimizer_bytes == (4 + 8) * n // 8
    bucket, weights_buffer = deepspeed_buffer_elements(gpt2_tiny, int(value))
    half_grads = 2 * n if value == "1" else 2 * n // 8
    assert eight.gradients_bytes == half_grads + 4 * n // 8 + 2 * bucket
    weights = 2 * n // 8 if value == "3" else 2 * n
    assert eight.weights_bytes == weights + 2 * weights_buffer


def test_offload_moves_the_states_to_host_memory_which_on_the_cpu_is_the_same_memory(gpt2_tiny):
    n = gpt2_tiny.num_params
    for value, host in (("2+offload", (4 + 8 + 4) * n), ("3+offload", (4 + 8 + 4 + 2) * n)):
        config = TrialConfig(dtype="bf16", zero=value)
        gpu = zero_state_bytes(gpt2_tiny, memory_traits(config, "cuda"), 1, "cuda")
        cpu = zero_state_bytes(gpt2_tiny, memory_traits(config, "cpu"), 1, "cpu")
        assert gpu.host_bytes == cpu.host_bytes == host
        assert gpu.optimizer_bytes == 0 and cpu.optimizer_bytes == 12 * n
        assert gpu.gradients_bytes < cpu.gradients_bytes  # the fp32 gradient partition went to the host
        # estimate_peak: on a GPU the device total excludes the host bytes; on the CPU it holds them.
        on_gpu = estimate_peak(gpt2_tiny, config, 32, MemoryFit.prior("cuda"))
        on_cpu = estimate_peak(gpt2_tiny, config, 32, MemoryFit.prior("cpu"))
        assert on_gpu.host_bytes == on_cpu.host_bytes == host
        assert on_cpu.model_state_bytes - on_gpu.model_state_bytes == host


@pytest.mark.parametrize("value", ["1", "3"])
def test_on_the_cpu_a_zero_rank_holds_deepspeed_and_its_adamw_step_over_the_whole_partition(value, gpt2_tiny):
    """docs/benchmarks-archive.md, "ZeRO and several ranks": torch's single-tensor AdamW steps DeepSpeed's flat
    fp32 partition at once (two temporaries of its size); the fused kernel makes none."""
    n, cpu = gpt2_tiny.num_params, dataclasses.replace(MemoryFit.prior("cpu"), ranks=2)
    without_zero = estimate_peak(gpt2_tiny, TrialConfig(dtype="bf16"), 32, cpu)
    for optim, temporaries in (("adamw_torch", 8 * n // 2), ("adamw_torch_fused", 0)):
        estimate = estimate_peak(gpt2_tiny, TrialConfig(dtype="bf16", zero=value, optim=optim), 32, cpu)
        assert estimate.optimizer_bytes == int((4 + 8) * n / 2) + temporaries
        assert estimate.context_bytes == without_zero.context_bytes + DEEPSPEED_CPU_PROCESS_BYTES
    on_gpu = estimate_peak(gpt2_tiny, TrialConfig(dtype="bf16", zero=value), 32, MemoryFit.prior("cuda"))
    assert on_gpu.optimizer_bytes == (4 + 8) * n and on_gpu.context_bytes == MemoryFit.prior("cuda").context_bytes


def test_the_fit_keeps_deepspeeds_term_out_of_the_base_context(gpt2_tiny):
    """A study calibrated on ZeRO trials predicts its trials without ZeRO without DeepSpeed's share."""
    prior = MemoryFit.prior("cpu")
    config = TrialConfig(dtype="bf16", zero="2")
    fitted = fit_memory(
        gpt2_tiny, 32, [MeasuredMemory(config, estimate_peak(gpt2_tiny, config, 32, prior).total_bytes)], prior
    )
    assert fitted.context_bytes == pytest.approx(prior.context_bytes, abs=1)  # not 32 MiB more


def test_combination_rules_say_why_and_keep_what_runs():
    notes: list[str] = []
    choices = zero_with_other_levers({"zero": ["2+offload"], "optim": ["adamw_torch", "adafactor"]}, notes, "s.yaml")
    assert choices["optim"] == ["adamw_torch"] and "DeepSpeed's own AdamW" in notes[0]
    notes = []
    choices = zero_with_other_levers(
        {"zero": ["off", "2"], "weight_dtype": ["fp32", "bf16"], "compile": ["off", "inductor"]}, notes, "s.yaml"
    )
    assert choices["zero"] == ["off"] and len(notes) == 1 and "zero 2 removed" in notes[0]
    notes = []
    choices = zero_with_other_levers({"zero": ["1", "3"], "compile": ["off", "inductor"]}, notes, "s.yaml")
    assert choices == {"zero": ["1", "3"], "compile": ["off"]} and "compile inductor removed" in notes[0]


def test_each_zero_note_holds_of_the_space_the_rules_leave():
    """Rules taken one at a time removed 2+offload for an 8-bit optimizer, named it as what to leave out, then
    removed that optimizer anyway: offload was lost from a space that could search it, and the note's advice was
    already followed. Now the optimizer goes, and both stages stay."""
    notes: list[str] = []
    both = zero_with_other_levers({"zero": ["2", "2+offload"], "optim": ["adamw_torch", "adamw_bnb_8bit"]}, notes, "s")
    assert both == {"zero": ["2", "2+offload"], "optim": ["adamw_torch"]}
    assert notes == [
        "optim adamw_bnb_8bit removed: DeepSpeed hands the optimizer flat fp32 partitions: bitsandbytes' "
        "per-parameter 32-bit overrides do not apply"
    ]
    # A value that goes is named once, with every reason and every value whose absence lets it be searched.
    notes = []
    mixed = {"zero": ["off", "2", "2+offload"], "optim": ["adamw_torch", "adamw_bnb_8bit", "adafactor"]}
    assert zero_with_other_levers(mixed, notes, "s")["zero"] == ["off"]
    offload = next(note for note in notes if note.startswith("zero 2+offload removed"))
    assert offload.endswith("search it in a space whose optim is not adamw_bnb_8bit, adafactor")
    assert "DeepSpeedCPUAdam" in offload and "flat fp32 partitions" in offload
    assert next(note for note in notes if note.startswith("zero 2 removed")).endswith("optim is not adamw_bnb_8bit")
    assert len(notes) == 2
    narrowed = zero_with_other_levers({"zero": ["2+offload"], "optim": ["adamw_torch"]}, [], "s")
    assert narrowed["zero"] == ["2+offload"]  # the advice, followed, searches it


def write_space(tmp_path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


@needs_deepspeed
def test_a_space_searches_zero_only_where_nothing_fits_without_it(tmp_path, cpu, gpt2_tiny):
    space = write_space(tmp_path, "micro_batch: [1]\ndtype: [bf16]\n")
    fit = MemoryFit.prior("cpu")
    plenty = load_space(space, cpu, model=gpt2_tiny, seq_len=32, ceiling_bytes=16 * GiB, memory_fit=fit)
    assert plenty.choices["zero"] == ["off"]
    without = estimate_peak(gpt2_tiny, TrialConfig(micro_batch=1, dtype="bf16"), 32, fit).total_bytes
    offload = estimate_peak(gpt2_tiny, TrialConfig(micro_batch=1, dtype="bf16", zero="3+offload"), 32, fit).total_bytes
    # On one rank only offload could help; on the CPU the host is the same memory: nothing does, so ZeRO is not what
    # is missing: every value is searched, off among them (the search then says what would fit, and must see the
    # levers ZeRO does not run with, 16-bit weights and 8-bit optimizers: once off was dropped, it named a ZeRO
    # config 3x the leanest one's peak as the smallest).
    tight = load_space(space, cpu, model=gpt2_tiny, seq_len=32, ceiling_bytes=min(without, offload) - 1, memory_fit=fit)
    assert tight.choices["zero"][0] == "off" and len(tight.choices["zero"]) > 1
    assert not any("predicted to fit without DeepSpeed ZeRO" in note for note in tight.notes)
    listed = load_space(
        write_space(tmp_path, 'zero: ["off", "2"]\n'),
        cpu,
        model=gpt2_tiny,
        seq_len=32,
        ceiling_bytes=16 * GiB,
        memory_fit=fit,
    )
    assert listed.choices["zero"] == ["off", "2"]


def test_the_newest_levers_are_last_so_existing_spaces_keep_their_order():
    assert list(LEVERS)[-5:] == ["zero", "fsdp", "packing", "activation_offloading", "precompute_ref_log_probs"]


def test_a_deepspeed_config_the_user_fixed_is_kept_whole(tmp_path):
    """--base-args names a DeepSpeed config: the lever is fixed at its stage, and the trials and the
    export train with the user's own file (its buckets, its optimizer), not autotune's."""
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}}))
    base_args = {"deepspeed": str(path)}
    fixed = lever_values_from_base_args(base_args)
    assert fixed == {"zero": "2"}
    assert training_arguments_kwargs(TrialConfig(**fixed), "cpu", base_args)["deepspeed"] == str(path)


def test_where_only_zero_fits_the_space_searches_only_the_values_that_do(tmp_path, gpt2_tiny):
    """A planned H100 whose ceiling only offloading the optimizer's states to the host gets under: ZeRO is what is
    missing, so the space keeps the values with which something fits, without off, and says so."""
    from autotune.spec.devices import known_gpu

    space = write_space(tmp_path, "micro_batch: [1]\ndtype: [bf16]\noptim: [adamw_torch]\n")
    fit = MemoryFit.prior("cuda")
    config = TrialConfig(micro_batch=1, dtype="bf16", optim="adamw_torch")
    without = estimate_peak(gpt2_tiny, config, 32, fit).total_bytes
    offload = estimate_peak(gpt2_tiny, dataclasses.replace(config, zero="3+offload"), 32, fit).total_bytes
    assert offload < without
    gpu = known_gpu("h100-sxm").device()
    tight = load_space(space, gpu, model=gpt2_tiny, seq_len=32, ceiling_bytes=(offload + without) // 2, memory_fit=fit)
    assert "off" not in tight.choices["zero"] and "3+offload" in tight.choices["zero"]
    assert any("predicted to fit without DeepSpeed ZeRO" in note for note in tight.notes)
