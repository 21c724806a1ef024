"""The search-space module: YAML validation, device and model filters, the notes they leave."""

from __future__ import annotations

import json

import pytest

from autotune.errors import AutotuneError
from autotune.runner import trial_memory_prior
from autotune.space import default_space_path, load_space
from autotune.spec.devices import DeviceSpec

GiB = 1024**3

# A fake for what cannot exist here: a CUDA device without bf16 (a V100), as NVML would describe it.
FAKE_V100 = DeviceSpec(
    kind="cuda",
    index=0,
    name="Tesla V100-SXM2-16GB",
    total_memory_bytes=16 * GiB,
    supported_dtypes=("fp32", "fp16"),
    compute_capability=(7, 0),
)


def write(tmp_path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("micro_batch: [8]\nlearning_rate: [0.1]\n", "learning_rate: unknown lever (see search_spaces/README.md)"),
        ("optim: []\n", "optim: needs at least one choice"),
        ("micro_batch: [8, 0]\n", "micro_batch: needs at least one choice, each a positive integer"),
        ("grad_accum: [-1]\n", "grad_accum: needs at least one choice, each a positive integer"),
        ("micro_batch: big\n", "micro_batch: must be a list of choices or 'auto'"),
        ("dtype: [fp8]\n", "dtype: unknown choice 'fp8'; choose from fp32, tf32, fp16, bf16"),
        ("dataloader_workers: [-2]\n", "dataloader_workers: needs at least one choice, each >= 0"),
        ("global_batch: 0\n", "global_batch: must be a positive integer"),
        ("global_batch: 64\nmax_global_batch: 64\n", "give global_batch or max_global_batch, not both"),
        ("- micro_batch\n", "expected a mapping of lever -> list of choices"),
        ("micro_batch: [8\n", "not valid YAML"),
    ],
)
def test_invalid_spaces_are_refused_with_the_knob_named(tmp_path, cpu, yaml_text, message):
    with pytest.raises(AutotuneError) as error:
        load_space(write(tmp_path, yaml_text), cpu)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_wrong_type_names_the_knob_and_the_choice(tmp_path, cpu):
    path = write(tmp_path, "checkpointing: [maybe]\n")
    with pytest.raises(AutotuneError) as error:
        load_space(path, cpu)
    assert str(error.value).startswith(f"--space {path}: checkpointing: ")
    assert "'maybe'" in str(error.value)


def test_missing_file_is_one_line(cpu, tmp_path):
    with pytest.raises(AutotuneError, match="cannot read it"):
        load_space(str(tmp_path / "absent.yaml"), cpu)


# Fakes for CPUs this machine may not be (its own is read from /proc/cpuinfo): one with AMX and
# AVX512-BF16 (a Sapphire Rapids Xeon), and one with AVX2 only (an EPYC of the Zen 3 generation).
FAKE_CPU_WITH_BF16 = DeviceSpec(
    kind="cpu",
    index=None,
    name="fake Xeon with AMX",
    total_memory_bytes=16 * GiB,
    supported_dtypes=("fp32", "bf16"),
    cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"}),
)
FAKE_CPU_WITHOUT_BF16 = DeviceSpec(
    kind="cpu",
    index=None,
    name="fake AVX2 EPYC",
    total_memory_bytes=16 * GiB,
    supported_dtypes=("fp32", "bf16"),
    cpu_flags=frozenset({"avx", "avx2", "fma"}),
)


def test_cpu_filter_removes_what_a_cpu_cannot_run_and_says_why(cpu, tmp_path):
    space = load_space(default_space_path(), cpu)
    assert space.choices["dtype"] == (["fp32", "bf16"] if cpu.has_matmul_hardware("bf16") else ["fp32"])
    assert space.choices["pin_memory"] == [False]
    assert "cudagraphs" not in space.choices["compile"]
    # dtype: auto holds the dtypes the device trains in: only an emulated one is worth a note.
    dtype_notes = [note for note in space.notes if note.startswith("dtype ")]
    assert dtype_notes == ([] if cpu.has_matmul_hardware("bf16") else [dtype_notes[0]])
    assert all("bf16 removed" in note for note in dtype_notes)
    listed = load_space(write(tmp_path, "dtype: [fp32, tf32, fp16]\n"), cpu)  # listed: each removal said
    assert any(note.startswith("dtype tf32 removed: cpu") for note in listed.notes)
    assert any(note.startswith("dtype fp16 removed: cpu") for note in listed.notes)
    assert any("pin_memory true removed" in note for note in space.notes)


@pytest.mark.parametrize("name", ["default.yaml", "quick.yaml"])
def test_the_default_and_quick_spaces_leave_out_a_dtype_the_cpu_only_emulates_with_one_note(name):
    from importlib import resources

    path = str(resources.files("autotune.spaces").joinpath(name))
    with_hardware = load_space(path, FAKE_CPU_WITH_BF16)
    assert with_hardware.choices["dtype"] == ["fp32", "bf16"]
    assert not any("emulated" in note for note in with_hardware.notes)
    without = load_space(path, FAKE_CPU_WITHOUT_BF16)
    assert without.choices["dtype"] == ["fp32"]
    emulated = [note for note in without.notes if "emulated" in note]
    assert emulated == [
        "dtype bf16 removed: cpu (fake AVX2 EPYC) has no bf16 matmul instructions (none of amx_bf16, avx512_bf16, "
        "bf16): it runs emulated, slower than fp32; list it in the space (dtype: [...]) to search it anyway"
    ]


def test_a_space_that_lists_an_emulated_dtype_keeps_it_with_a_note(tmp_path):
    path = write(tmp_path, "dtype: [fp32, bf16]\nweight_dtype: [fp32, bf16]\n")
    space = load_space(path, FAKE_CPU_WITHOUT_BF16)
    assert space.choices["dtype"] == ["fp32", "bf16"]  # searchable: bf16 may be what fits in memory
    assert sum("kept because the space lists it" in note for note in space.notes) == 2  # dtype and weight_dtype
    assert not any("kept because" in note for note in load_space(path, FAKE_CPU_WITH_BF16).notes)
    # A space that leaves dtype out still trains in fp32 alone (auto only where written).
    assert load_space(write(tmp_path, "micro_batch: [8]\n"), FAKE_CPU_WITH_BF16).choices["dtype"] == ["fp32"]


def test_compile_auto_leaves_inductor_out_on_a_cpu_with_a_note_and_keeps_it_where_listed(tmp_path, cpu):
    """On a CPU inductor's C++ warm-up costs more than a trial measures (issue 29): the default space
    (``compile: auto``) searches no compile there, with one note; a space that lists inductor keeps it,
    with a note; on a GPU ``auto`` is inductor and its CUDA-graph modes."""
    default = load_space(default_space_path(), cpu)
    assert default.choices["compile"] == ["off"]
    assert [note for note in default.notes if note.startswith("compile inductor removed")] == [
        "compile inductor removed: on a CPU, inductor generates and compiles C++ for every new shape: about a "
        "minute of warm-up per trial on a few cores, more than the trial's measurement; list it in the space "
        "(compile: [...]) to search it anyway"
    ]
    listed = load_space(write(tmp_path, 'compile: ["off", inductor]\n'), cpu)
    assert listed.choices["compile"] == ["off", "inductor"]
    assert any(note.startswith("compile inductor kept because the space lists it: on a CPU") for note in listed.notes)
    ampere = DeviceSpec("cuda", 0, "fake A100", 40 * GiB, ("fp32", "fp16", "tf32", "bf16"), (8, 0))
    on_gpu = load_space(write(tmp_path, "compile: auto\n"), ampere)
    assert on_gpu.choices["compile"] == ["off", "inductor", "inductor:reduce-overhead", "inductor:max-autotune"]
    assert not any(note.startswith("compile") for note in on_gpu.notes)


def test_dtype_auto_on_a_gpu_is_what_its_tensor_cores_run(tmp_path):
    path = write(tmp_path, "dtype: auto\n")
    assert load_space(path, FAKE_V100).choices["dtype"] == ["fp32", "fp16"]
    ampere = DeviceSpec("cuda", 0, "fake A100", 40 * GiB, ("fp32", "fp16", "tf32", "bf16"), (8, 0))
    assert load_space(path, ampere).choices["dtype"] == ["fp32", "tf32", "fp16", "bf16"]


def test_a_gpu_without_bf16_loses_bf16_with_a_note(tmp_path):
    space = load_space(write(tmp_path, "dtype: [fp16, bf16]\n"), FAKE_V100)
    assert space.choices["dtype"] == ["fp16"]
    assert "dtype bf16 removed: cuda:0 (Tesla V100-SXM2-16GB) does not support it" in space.notes


def test_a_knob_left_empty_by_the_device_is_an_error(tmp_path, cpu):
    with pytest.raises(AutotuneError, match="no choice of dtype runs on cpu"):
        load_space(write(tmp_path, "dtype: [fp16, tf32]\n"), cpu)


def test_auto_micro_batches_are_1_2_4_then_multiples_of_8(tmp_path, cpu):
    space = load_space(write(tmp_path, "micro_batch: auto\n"), cpu)
    micro = space.choices["micro_batch"]
    assert micro[:3] == [1, 2, 4]  # without the memory context (model, seq len, ceiling, prior) all stay
    assert all(m % 8 == 0 for m in micro[3:])


def test_tensor_core_note_names_tokens_not_samples_and_only_on_cuda(tmp_path, cpu):
    path = write(tmp_path, "micro_batch: [1, 2, 4, 8]\ndtype: [fp16]\n")
    # A micro-batch of 1 at seq len 2048 is 2048 rows: aligned, nothing to say.
    assert not any("tensor cores" in note for note in load_space(path, FAKE_V100, seq_len=2048).notes)
    odd = load_space(path, FAKE_V100, seq_len=99)  # 99, 198 and 396 tokens are not multiples of 8; 792 is
    assert "micro_batch 1, 2, 4 x seq len 99 is not a multiple of 8 tokens: tensor cores may run it slower" in odd.notes
    cpu_space = load_space(write(tmp_path, "micro_batch: [1, 8]\n"), cpu, seq_len=100)
    assert not any("tensor cores" in note for note in cpu_space.notes)  # no tensor cores on the CPU


def _memory_context(gpt2_tiny, cpu, ceiling_gib: float):

    return dict(
        model=gpt2_tiny, seq_len=256, ceiling_bytes=int(ceiling_gib * GiB), memory_fit=trial_memory_prior(cpu, {}, 1)
    )


def test_auto_keeps_small_micro_batches_only_where_a_larger_one_may_not_fit(tmp_path, cpu, gpt2_tiny):
    from autotune.estimate import UNCALIBRATED_MARGIN, estimate_peak
    from autotune.levers import TrialConfig

    path = write(tmp_path, "micro_batch: auto\ndtype: [fp32]\noptim: [adamw_torch]\n")
    roomy = load_space(path, cpu, **_memory_context(gpt2_tiny, cpu, 16))
    assert min(roomy.choices["micro_batch"]) == 8
    assert any(n.startswith("micro_batch 1, 2, 4 removed: micro-batch 8 is predicted to fit") for n in roomy.notes)
    # The rule, checked against the estimate itself: 2 stays because 4 may not fit, 1 goes because 2 does.
    # The ceiling sits between the two (about 1.3 GiB; the prior's process baseline is this installation's).
    prior = trial_memory_prior(cpu, {}, 1)
    peak = {
        m: estimate_peak(gpt2_tiny, TrialConfig(micro_batch=m, pin_memory=False), 256, prior).total_bytes
        for m in (2, 4)
    }
    ceiling_gib = (peak[2] + peak[4]) / 2 * UNCALIBRATED_MARGIN / GiB
    tight = load_space(path, cpu, **_memory_context(gpt2_tiny, cpu, ceiling_gib))
    assert peak[4] * UNCALIBRATED_MARGIN > ceiling_gib * GiB >= peak[2] * UNCALIBRATED_MARGIN
    assert tight.choices["micro_batch"][:2] == [2, 4]
    # A space that lists its micro-batches measures them, whatever the estimate says.
    listed = load_space(write(tmp_path, "micro_batch: [1, 2, 8]\n"), cpu, **_memory_context(gpt2_tiny, cpu, 16))
    assert listed.choices["micro_batch"] == [1, 2, 8]


def test_auto_keeps_small_micro_batches_where_a_batch_is_padded_to_its_longest_sample(tmp_path, cpu, gpt2_tiny):
    """Where the user's samples differ in length and a batch is padded to its longest (TRL's collators, the
    padding lever's ``longest``), a smaller micro-batch computes less padding: 1, 2 and 4 stay with a note
    even where 8 fits well, for the throughput prior to rank; on full samples they go as before."""
    import dataclasses

    path = write(tmp_path, "micro_batch: auto\ndtype: [fp32]\noptim: [adamw_torch]\n")
    trl_padded = dataclasses.replace(gpt2_tiny, pads_to_longest=True)
    roomy = {**_memory_context(gpt2_tiny, cpu, 16), "model": trl_padded}
    kept = load_space(path, cpu, real_data=True, **roomy)
    assert kept.choices["micro_batch"][:4] == [1, 2, 4, 8]
    assert any(n.startswith("micro_batch 1, 2, 4 kept: your samples differ in length") for n in kept.notes)
    # Synthetic samples are all --seq-len long, and --packing fills every one: nothing to pad.
    assert min(load_space(path, cpu, **roomy).choices["micro_batch"]) == 8
    assert min(load_space(path, cpu, real_data=True, packing=True, **roomy).choices["micro_batch"]) == 8
    # The Trainer's loader pads every sample to --seq-len unless the padding lever pads to the longest.
    trainer = _memory_context(gpt2_tiny, cpu, 16)
    assert min(load_space(path, cpu, real_data=True, **trainer).choices["micro_batch"]) == 8
    longest = write(
        tmp_path, "micro_batch: auto\ndtype: [fp32]\noptim: [adamw_torch]\npadding: [max_length, longest]\n"
    )
    assert load_space(longest, cpu, real_data=True, **trainer).choices["micro_batch"][:3] == [1, 2, 4]


def test_global_batch_keeps_its_size_at_micro_batches_1_2_4(tmp_path, cpu, gpt2_tiny):
    from autotune.levers import TrialConfig

    space = load_space(
        write(tmp_path, "micro_batch: auto\n"), cpu, global_batch=16, **_memory_context(gpt2_tiny, cpu, 0.9)
    )
    assert space.choices["micro_batch"][:3] == [1, 2, 4]
    for micro in (1, 2, 4):
        config = TrialConfig.from_params({"micro_batch": micro, "global_batch": 16})
        assert config.grad_accum * config.micro_batch == 16


def test_flash_attention_needs_cuda_and_flash_attn(tmp_path, cpu, bert_tiny):
    space = load_space(write(tmp_path, "attn_implementation: [eager, sdpa, flash_attention_2]\n"), cpu, model=bert_tiny)
    assert space.choices["attn_implementation"] == ["eager", "sdpa"]
    assert any(
        n.startswith("attn_implementation flash_attention_2 removed: it needs a CUDA device") for n in space.notes
    )


def test_attention_the_architecture_lacks_is_removed(tmp_path, cpu):
    from transformers import MPNetConfig

    from autotune.spec.models import resolve_model

    # MPNet has no SDPA attention in transformers: asking for it would fail in every trial.
    MPNetConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    ).save_pretrained(tmp_path / "mpnet")
    model = resolve_model(str(tmp_path / "mpnet"))
    space = load_space(write(tmp_path, "attn_implementation: [eager, sdpa]\n"), cpu, model=model)
    assert space.choices["attn_implementation"] == ["eager"]
    assert any(note.startswith("attn_implementation sdpa removed: MPNet") for note in space.notes)
    with pytest.raises(AutotuneError, match="supports none of attn_implementation"):
        load_space(write(tmp_path, "attn_implementation: [sdpa]\n"), cpu, model=model)


def test_attention_left_out_keeps_the_model_default(tmp_path, cpu, bert_tiny):
    space = load_space(write(tmp_path, "micro_batch: [8]\n"), cpu, model=bert_tiny)
    assert "attn_implementation" not in space.choices


def test_a_single_choice_is_fixed_and_the_size_counts_the_rest(tmp_path, cpu):
    space = load_space(write(tmp_path, "micro_batch: [8, 16]\ngrad_accum: [1, 2, 4]\noptim: [sgd]\n"), cpu)
    assert space.fixed()["optim"] == "sgd"
    assert space.size == 2 * 3  # every knob the YAML leaves out keeps one default choice
    assert space.largest_global_batch == 16 * 4


@pytest.mark.parametrize(
    "name", ["default.yaml", "quick.yaml", "memory-tight.yaml", "speed-only.yaml", "fixed-global-batch.yaml"]
)
def test_shipped_spaces_load_on_the_cpu(cpu, name):
    from importlib import resources

    path = str(resources.files("autotune.spaces").joinpath(name))
    space = load_space(path, cpu)
    assert space.size >= 1


def test_the_llm_space_is_sfts_default_and_keeps_what_a_cpu_runs_with_a_note_for_the_rest(cpu):
    """Under --trainer sft the LLM space is the default; on the CPU flash and flex attention, Liger,
    activation offloading (CUDA) go, each with a note, and TRL's packing stays."""
    from autotune.spec.models import resolve_model

    space = load_space(None, cpu, model=resolve_model("llama-tiny"), trainer="sft")
    assert space.source.endswith("llm.yaml")
    assert space.choices["packing"] == ["off", "padding_free", "bfd"]
    assert space.choices["attn_implementation"] == ["sdpa", "eager"]
    assert space.choices["dtype"] == ["bf16", "fp32"] and space.choices["weight_dtype"] == ["fp32", "bf16"]
    assert space.choices["liger"] == [False] and space.choices["activation_offloading"] == [False]
    notes = "\n".join(space.notes)
    assert "not searched together: dtype fp32 with weight_dtype bf16" in notes
    for removed in ("flex_attention removed", "flash_attention_2 removed", "liger true removed"):
        assert removed in notes
    assert "activation_offloading true removed: TRL's activation offloading" in notes


def test_the_llm_space_leaves_inductor_out_on_a_cpu_with_a_note_and_keeps_its_gpu_choices(tmp_path, cpu):
    """The LLM space lists ``compile: ["off", inductor]`` (not ``auto``: that would add the CUDA-graph
    modes on a GPU) and names compile in ``leave_out_slow``: on a CPU inductor goes with one note, as
    default.yaml's ``auto`` does (issue 38, 10: a CPU SFT search spent 317 s in one inductor trial);
    on a GPU both choices stay; a space of the user's that lists inductor keeps it."""
    from autotune.spec.models import resolve_model

    llama = resolve_model("llama-tiny")
    for trainer in ("sft", "trainer"):
        space = load_space(None, cpu, model=llama, trainer=trainer)
        assert space.source.endswith("llm.yaml") and space.choices["compile"] == ["off"]
        assert [note for note in space.notes if note.startswith("compile")] == [
            "compile inductor removed: on a CPU, inductor generates and compiles C++ for every new shape: about a "
            "minute of warm-up per trial on a few cores, more than the trial's measurement; this space leaves it "
            "out (leave_out_slow: [compile]): list it in a space of your own (--space) to search it anyway"
        ]
    ampere = DeviceSpec("cuda", 0, "fake A100", 40 * GiB, ("fp32", "fp16", "tf32", "bf16"), (8, 0))
    on_gpu = load_space(None, ampere, model=llama, trainer="sft")
    assert on_gpu.choices["compile"] == ["off", "inductor"]
    assert not any(note.startswith("compile") for note in on_gpu.notes)
    listed = load_space(write(tmp_path, 'compile: ["off", inductor]\n'), cpu, model=llama, trainer="sft")
    assert listed.choices["compile"] == ["off", "inductor"]


def test_leave_out_slow_names_levers_only(tmp_path, cpu):
    with pytest.raises(AutotuneError, match=r"leave_out_slow: 'compiles' is not a lever"):
        load_space(write(tmp_path, "leave_out_slow: [compiles]\n"), cpu)


@pytest.mark.parametrize(
    ("task", "space_file"),
    [
        ("causal-lm", "llm.yaml"),
        ("sequence-classification", "default.yaml"),
        ("masked-lm", "default.yaml"),
        (None, "default.yaml"),
    ],
)
def test_the_default_space_follows_the_models_task(task, space_file):
    assert default_space_path(task).endswith(f"search_spaces/{space_file}")


def test_a_causal_lm_gets_the_llm_space_under_either_trainer_an_encoder_the_default_and_a_given_file_wins(
    tmp_path, cpu
):
    """A decoder from the catalog, a local directory holding one, and either trainer: the LLM space; under
    the Trainer TRL's levers go, each with a note. bert-tiny: the default space. --space: that file."""
    from autotune.spec.models import resolve_model

    llama = resolve_model("llama-tiny")
    local = tmp_path / "my-decoder"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(resolve_model("gpt2-tiny").hf_config))
    for model in (llama, resolve_model(str(local))):
        assert model.task == "causal-lm"
        under_trainer = load_space(None, cpu, model=model, trainer="trainer")
        assert under_trainer.source.endswith("search_spaces/llm.yaml")
        assert under_trainer.choices["packing"] == ["off"] and under_trainer.choices["activation_offloading"] == [False]
        assert "packing bfd removed: it is how TRL's SFTTrainer batches samples" in "\n".join(under_trainer.notes)
        assert load_space(None, cpu, model=model, trainer="sft").source.endswith("search_spaces/llm.yaml")
    assert load_space(None, cpu, model=resolve_model("bert-tiny")).source.endswith("search_spaces/default.yaml")
    assert load_space(None, cpu).source.endswith("search_spaces/default.yaml")  # no model: the default
    given = write(tmp_path, "micro_batch: [8]\n")
    assert load_space(given, cpu, model=llama, trainer="sft").source == given


def test_each_trainer_keeps_its_own_batching_levers(tmp_path, cpu):
    """TRL's packing under the Trainer and the Trainer's padding collators under SFTTrainer are
    removed, a note each (the default value stays: it changes nothing)."""
    path = tmp_path / "space.yaml"
    path.write_text('packing: ["off", bfd]\npadding: [max_length, longest]\n')
    under_trainer = load_space(str(path), cpu, real_data=True)
    assert under_trainer.choices["packing"] == ["off"] and under_trainer.choices["padding"] == ["max_length", "longest"]
    assert any("packing bfd removed: it is how TRL's SFTTrainer batches samples" in n for n in under_trainer.notes)
    under_sft = load_space(str(path), cpu, real_data=True, trainer="sft")
    assert under_sft.choices["packing"] == ["off", "bfd"] and under_sft.choices["padding"] == ["max_length"]
    assert any("padding longest removed: under --trainer sft TRL's collator" in n for n in under_sft.notes)


def test_a_space_naming_wrapped_packing_is_refused_with_its_reason(tmp_path, cpu):
    path = tmp_path / "space.yaml"
    path.write_text("packing: [bfd, wrapped]\n")
    with pytest.raises(AutotuneError, match="packing: wrapped is refused: TRL's wrapped packing cuts samples mid-way"):
        load_space(str(path), cpu, trainer="sft")


# --- constrain_global_batch: a fixed or capped global batch, which (micro-batch, accumulation) pairs are searched


def test_constrain_global_batch_leaves_an_unconstrained_space_alone_and_keeps_the_other_knobs():
    from autotune.space import SearchSpace
    from autotune.space._narrow import constrain_global_batch

    space = SearchSpace(
        choices={"micro_batch": [8, 12, 16], "grad_accum": [1, 2], "dtype": ["fp32", "bf16"]},
        notes=("an earlier note",),
        source="mine.yaml",
    )
    assert constrain_global_batch(space) is space
    constrained = constrain_global_batch(space, global_batch=32)
    assert constrained.choices == {"micro_batch": [8, 16], "dtype": ["fp32", "bf16"], "global_batch": [32]}
    assert constrained.notes == (
        "an earlier note",
        "global batch 32: grad_accum = 32 / micro_batch, not searched; micro_batch 12 removed (they do not divide 32)",
    )
    assert constrained.source == "mine.yaml"
    assert space.choices["grad_accum"] == [1, 2]  # the space it was given is unchanged


BATCH_SPACE = "micro_batch: [4, 8, 16, 24, 32, 64, 128]\ngrad_accum: [1, 2]\ndtype: [fp32, bf16]\n"


def pairs(space) -> list[tuple[int, int]]:
    """The (micro-batch, accumulation) pairs the space's trials can have."""
    from autotune.levers import TrialConfig

    fixed = {name: values[0] for name, values in space.choices.items() if len(values) == 1}
    configs = [
        TrialConfig.from_params({**fixed, "micro_batch": m, "grad_accum": a})
        for m in space.choices["micro_batch"]
        for a in space.choices.get("grad_accum", [1])
    ]
    return [(c.micro_batch, c.grad_accum) for c in configs]


def test_global_batch_searches_divisors_and_derives_accumulation(tmp_path, cpu):
    space = load_space(write(tmp_path, BATCH_SPACE), cpu, global_batch=64)
    assert space.choices["micro_batch"] == [4, 8, 16, 32, 64]
    assert space.choices["global_batch"] == [64]  # fixed: recorded with every trial, not searched
    assert "grad_accum" not in space.choices
    assert pairs(space) == [(4, 16), (8, 8), (16, 4), (32, 2), (64, 1)]  # accumulation beyond the space's [1, 2]
    assert (
        "global batch 64: grad_accum = 64 / micro_batch, not searched; micro_batch 24, 128 removed (they do not divide 64)"
        in space.notes
    )
    assert space.largest_global_batch == 64
    assert space.size == 5 * 2


def test_a_global_batch_over_ranks_keeps_micro_batch_x_accumulation_x_ranks_at_it(tmp_path, cpu):
    space = load_space(write(tmp_path, BATCH_SPACE), cpu, global_batch=64, ranks=4)
    assert space.choices["global_batch"] == [16]  # each rank's share: the knob counts one device's samples
    assert [(m * a * 4) for m, a in pairs(space)] == [64] * len(pairs(space))
    assert space.notes[-1].startswith(
        "global batch 64 over 4 ranks: 16 per rank; global batch 16: grad_accum = 16 / micro_batch"
    )
    with pytest.raises(AutotuneError) as error:
        load_space(write(tmp_path, BATCH_SPACE), cpu, global_batch=66, ranks=4)
    assert str(error.value) == "global batch 66 cannot be shared by 4 ranks (--devices-per-trial): give a multiple of 4"
    capped = load_space(write(tmp_path, BATCH_SPACE), cpu, max_global_batch=64, ranks=2)
    assert capped.choices["micro_batch"] == [4, 8, 16, 24, 32]


def test_a_global_batch_no_micro_batch_divides_is_refused(tmp_path, cpu):
    with pytest.raises(AutotuneError) as error:
        load_space(write(tmp_path, "micro_batch: [8, 16]\n"), cpu, global_batch=12)
    assert str(error.value) == (
        "global batch 12: no micro_batch 8, 16 divides it into whole accumulation steps; "
        "use micro-batches among its divisors 1, 2, 3, 4, 6, 12"
    )


def test_max_global_batch_accumulates_the_most_that_fits(tmp_path, cpu):
    space = load_space(
        write(tmp_path, "micro_batch: [8, 24, 32, 64]\ngrad_accum: [1, 2, 4]\n"), cpu, max_global_batch=48
    )
    assert space.choices["micro_batch"] == [8, 24, 32] and space.choices["max_global_batch"] == [48]
    assert pairs(space) == [(8, 6), (24, 2), (32, 1)]
    assert space.largest_global_batch == 48
    assert (
        "max global batch 48: grad_accum = 48 // micro_batch (the most that fits), not searched; micro_batch 64 removed"
        in space.notes
    )
    # The derived accumulation ignores the space's choices: 16 fits a cap of 16 once, not twice.
    assert pairs(
        load_space(write(tmp_path, "micro_batch: [8, 16]\ngrad_accum: [2, 4]\n"), cpu, max_global_batch=16)
    ) == [(8, 2), (16, 1)]
    with pytest.raises(AutotuneError, match="max global batch 4: even micro_batch 8 x grad_accum 1 is over it"):
        load_space(write(tmp_path, "micro_batch: [8, 16]\n"), cpu, max_global_batch=4)


def test_a_cap_without_searched_accumulation_only_removes_micro_batches(tmp_path, cpu):
    space = load_space(write(tmp_path, "micro_batch: [8, 16, 32]\ngrad_accum: [2]\n"), cpu, max_global_batch=32)
    assert space.choices["micro_batch"] == [8, 16] and space.choices["grad_accum"] == [2]
    assert "max_global_batch" not in space.choices
    assert pairs(space) == [(8, 2), (16, 2)]


def test_the_yaml_can_fix_the_global_batch_and_the_command_line_overrides_it(tmp_path, cpu):
    path = write(tmp_path, "global_batch: 32\nmicro_batch: [8, 16, 32]\ngrad_accum: [1, 2]\n")
    assert pairs(load_space(path, cpu)) == [(8, 4), (16, 2), (32, 1)]
    assert pairs(load_space(path, cpu, global_batch=16)) == [(8, 2), (16, 1)]
    assert pairs(load_space(path, cpu, max_global_batch=24)) == [(8, 3), (16, 1)]
    # --global-batch and --max-global-batch themselves are options, checked with the others (tests/plan/test_plan.py).


def test_a_micro_batch_fixed_by_base_args_leaves_one_pair(tmp_path, cpu):
    path = write(tmp_path, "micro_batch: [8, 16, 32]\n")
    space = load_space(path, cpu, global_batch=64, base_args={"per_device_train_batch_size": 16})
    assert pairs(space) == [(16, 4)]
    # A fixed accumulation derives the micro-batch, even one the space does not list.
    space = load_space(path, cpu, global_batch=64, base_args={"gradient_accumulation_steps": 16})
    assert pairs(space) == [(4, 16)]
    with pytest.raises(AutotuneError, match=r"global batch 64: no micro_batch \(fixed by --base-args\) 24 divides it"):
        load_space(path, cpu, global_batch=64, base_args={"per_device_train_batch_size": 24})


def test_a_cap_with_base_args_keeps_what_the_user_fixed(tmp_path, cpu):
    path = write(tmp_path, "micro_batch: [8, 16, 32, 64]\ngrad_accum: [1, 2, 4]\n")
    assert pairs(load_space(path, cpu, max_global_batch=64, base_args={"per_device_train_batch_size": 16})) == [(16, 4)]
    fixed_accum = load_space(path, cpu, max_global_batch=64, base_args={"gradient_accumulation_steps": 2})
    assert pairs(fixed_accum) == [(8, 2), (16, 2), (32, 2)]
