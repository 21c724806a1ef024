"""The levers of today's training (issue 15): attention kernels, Liger, compile modes, padding-aware
batches, emptying the cache. Each is mapped to TrainingArguments (or the model / collator), filtered
with a note where it cannot run, known to the estimator, and trained for real where the CPU can.

No GPU here: the CUDA device below is a fake (``FAKE_H100``, a DeviceSpec with no device behind
it), used only to show what the filters keep on CUDA; nothing is trained on it.
"""

from __future__ import annotations

import dataclasses
import json
import tempfile
from pathlib import Path

import pytest

from autotune.estimate import MemoryFit, estimate_peak
from autotune.estimate._activations import (
    activation_bytes,
    layer_activation_bytes,
    micro_batch_shape,
    packed_mask_bytes,
)
from autotune.estimate._logits import logits_bytes
from autotune.levers import (
    MicroBatchShape,
    TrialConfig,
    lever_values_from_base_args,
    memory_traits,
    training_arguments_kwargs,
)
from autotune.levers.attention import ATTN_IMPLEMENTATIONS
from autotune.runner import TrialJob, run_isolated
from autotune.space import load_space
from autotune.spec.devices import DeviceSpec
from autotune.spec.flops import model_flops_per_token
from autotune.spec.models import resolve_model
from tests.support.local_model import corpus, make_local_model, write_jsonl

GiB = 1024**3
SPACES = Path(__file__).resolve().parent.parent.parent / "search_spaces"
FAKE_H100 = DeviceSpec(
    kind="cuda",
    index=0,
    name="NVIDIA H100 80GB HBM3",
    total_memory_bytes=80 * GiB,
    supported_dtypes=("fp32", "tf32", "fp16", "bf16"),
    compute_capability=(9, 0),
)


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return str(path)


# --- mapping: one knob -> TrainingArguments, and back ---------------------------------------------


@pytest.mark.parametrize(
    ("knobs", "expected"),
    [
        (
            {"compile": "inductor:max-autotune"},
            {"torch_compile": True, "torch_compile_backend": "inductor", "torch_compile_mode": "max-autotune"},
        ),
        ({"compile": "inductor"}, {"torch_compile": True, "torch_compile_backend": "inductor"}),
        ({"liger": True}, {"use_liger_kernel": True}),
        ({"sampling": "group_by_length"}, {"train_sampling_strategy": "group_by_length"}),
        ({"empty_cache_steps": 4}, {"torch_empty_cache_steps": 4}),
    ],
)
def test_each_lever_writes_its_trainingarguments_field_and_reads_back(knobs, expected):
    from transformers import TrainingArguments

    config = TrialConfig(**knobs)
    kwargs = training_arguments_kwargs(config, "cuda")
    assert {k: kwargs[k] for k in expected} == expected
    assert "torch_compile_mode" not in kwargs or "torch_compile_mode" in expected
    # The inverse (what a --base-args file fixes) gives back the same knob values.
    assert {k: v for k, v in lever_values_from_base_args(kwargs).items() if k in knobs} == knobs
    with tempfile.TemporaryDirectory() as scratch:  # TrainingArguments accepts them as written
        args = TrainingArguments(output_dir=scratch, **{**kwargs, "use_cpu": True})
    for field, value in expected.items():
        assert getattr(args, field) == value


def test_the_defaults_write_none_of_the_lever_fields():
    kwargs = training_arguments_kwargs(TrialConfig(), "cpu")
    for field in ("torch_compile_mode", "use_liger_kernel", "train_sampling_strategy", "torch_empty_cache_steps"):
        assert field not in kwargs


def test_padding_is_not_a_trainingarguments_field_and_the_export_says_which_collator():
    from autotune.views.export import model_loading_note
    from autotune.views.ranking import RankedTrial

    config = TrialConfig(padding="padding_free", attn_implementation="sdpa")
    assert training_arguments_kwargs(config, "cpu") == training_arguments_kwargs(
        TrialConfig(attn_implementation="sdpa"), "cpu"
    )
    note = model_loading_note(RankedTrial(number=3, state="COMPLETE", config=config, result=None))
    assert "DataCollatorWithFlattening" in note and "attn_implementation='sdpa'" in note
    assert model_loading_note(RankedTrial(number=1, state="COMPLETE", config=TrialConfig(), result=None)) is None


def test_every_attention_choice_is_one_the_installed_transformers_offers():
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    offered = {"eager", *ALL_ATTENTION_FUNCTIONS.valid_keys()}
    assert set(ATTN_IMPLEMENTATIONS) <= offered


# --- filters: one note per removed choice -------------------------------------------------------


LEVERS_YAML = (
    'compile: ["off", inductor, "inductor:reduce-overhead", "inductor:max-autotune", "inductor:max-autotune-no-cudagraphs"]\n'
    "liger: [false, true]\nempty_cache_steps: [0, 1]\nattn_implementation: [sdpa, eager, flex_attention]\n"
)


def test_the_cpu_loses_the_cuda_only_levers_with_one_note_each(tmp_path, cpu):
    space = load_space(write(tmp_path, LEVERS_YAML), cpu)
    assert space.choices["compile"] == ["off", "inductor", "inductor:max-autotune-no-cudagraphs"]
    assert space.choices["liger"] == [False]
    assert space.choices["empty_cache_steps"] == [0]
    assert space.choices["attn_implementation"] == ["sdpa", "eager"]
    for removed in (
        "compile inductor:reduce-overhead",
        "compile inductor:max-autotune",
        "liger true",
        "empty_cache_steps 1",
        "attn_implementation flex_attention",
    ):
        assert sum(note.startswith(f"{removed} removed: ") for note in space.notes) == 1, (removed, space.notes)


def test_a_cuda_device_keeps_the_compile_modes_and_says_why_liger_goes(tmp_path):
    space = load_space(write(tmp_path, LEVERS_YAML), FAKE_H100)
    assert (
        "inductor:reduce-overhead" in space.choices["compile"] and "inductor:max-autotune" in space.choices["compile"]
    )
    assert space.choices["empty_cache_steps"] == [0, 1]
    assert space.choices["liger"] == [False]  # this environment has no liger-kernel package
    assert "liger true removed: the liger-kernel package is not installed (pip install liger-kernel)" in space.notes


def test_padding_levers_need_real_data_of_different_lengths(tmp_path, cpu, gpt2_tiny):
    path = write(tmp_path, "padding: [max_length, longest, padding_free]\nsampling: [random, group_by_length]\n")
    synthetic = load_space(path, cpu, model=gpt2_tiny)
    assert synthetic.choices["padding"] == ["max_length"] and synthetic.choices["sampling"] == ["random"]
    assert "padding longest removed: synthetic tokens have no padding (use --dataset)" in synthetic.notes
    assert "padding padding_free removed: synthetic tokens have no padding (use --dataset)" in synthetic.notes
    packed = load_space(path, cpu, model=gpt2_tiny, real_data=True, packing=True)
    assert "sampling group_by_length removed: --packing fills every sample" in packed.notes
    real = load_space(path, cpu, model=gpt2_tiny, real_data=True)
    assert real.choices["padding"] == ["max_length", "longest", "padding_free"]
    assert real.choices["sampling"] == ["random", "group_by_length"]


def test_padding_free_is_kept_only_where_the_attention_keeps_samples_apart(tmp_path, cpu):
    path = write(tmp_path, "padding: [max_length, padding_free]\nattn_implementation: [sdpa, eager]\n")
    encoder = load_space(path, cpu, model=resolve_model("bert-tiny", "masked-lm"), real_data=True)
    assert encoder.choices["padding"] == ["max_length"]
    assert any(
        n.startswith(
            "padding padding_free removed: bert-tiny (bert) under sdpa attention lets the samples of a flattened row"
        )
        for n in encoder.notes
    )
    classifier = load_space(path, cpu, model=resolve_model("bert-tiny"), real_data=True)
    assert "padding padding_free removed: a classification head needs one row per sample" in classifier.notes
    unnamed = load_space(
        write(tmp_path, "padding: [max_length, padding_free]\n"),
        cpu,
        model=resolve_model("bert-tiny", "masked-lm"),
        real_data=True,
    )
    assert any(
        "bert-tiny (bert) under its default attention lets the samples of a flattened row attend to each other" in n
        for n in unnamed.notes
    ), unnamed.notes
    decoder = load_space(path, cpu, model=resolve_model("gpt2-tiny"), real_data=True)
    assert decoder.choices["padding"] == ["max_length", "padding_free"]  # the causal mask reads position_ids


def test_liger_is_removed_for_a_model_type_it_does_not_patch(gpt2_tiny):
    from autotune.levers.kernels import liger_unsupported

    reason = liger_unsupported(gpt2_tiny)
    assert reason  # no package here; with it, gpt2 is not among MODEL_TYPE_TO_APPLY_LIGER_FN
    assert "liger-kernel" in reason or "'gpt2'" in reason


def test_the_default_space_searches_attention_where_the_model_has_more_than_one(cpu, gpt2_tiny):
    space = load_space(str(SPACES / "default.yaml"), cpu, model=gpt2_tiny)
    assert space.choices["attn_implementation"] == ["sdpa", "eager"]
    assert "attn_implementation flash_attention_2 removed: it needs a CUDA device" in space.notes


# --- the estimator's arithmetic ------------------------------------------------------------------


def test_fused_attention_keeps_no_scores_and_eager_keeps_heads_s_squared(bert_tiny):
    s, b, a = 128, 4, bert_tiny.num_heads
    for fused in ("flash_attention_2", "flash_attention_3", "flex_attention"):
        config = TrialConfig(micro_batch=b, attn_implementation=fused, dtype="bf16")
        eager = memory_traits(dataclasses.replace(config, attn_implementation="eager"), "cuda")
        with_scores = layer_activation_bytes(bert_tiny, eager, s, "cuda")
        # bf16 on CUDA: softmax output 4 bytes, 1-byte dropout mask, 2-byte dropout output per score.
        fused_bytes = layer_activation_bytes(bert_tiny, memory_traits(config, "cuda"), s, "cuda")
        assert with_scores - fused_bytes == (4 + 1 + 2) * a * s * s * b


def test_liger_keeps_a_chunk_instead_of_the_logits(gpt2_tiny):
    b, s, h, v = 8, 256, gpt2_tiny.hidden_size, gpt2_tiny.vocab_size
    plain = logits_bytes(gpt2_tiny, memory_traits(TrialConfig(micro_batch=b), "cuda"), s)
    liger = logits_bytes(gpt2_tiny, memory_traits(TrialConfig(micro_batch=b, liger=True), "cuda"), s)
    assert plain == 3 * 4 * b * s * v
    assert liger == 4 * (3 * b * s * h + v * h)
    assert liger < plain


def test_the_fullest_micro_batch_under_each_padding():
    def fullest(config: TrialConfig, lengths) -> MicroBatchShape:
        return micro_batch_shape(memory_traits(config, "cuda"), 512, lengths)

    lengths = [10, 300, 40, 250, 90, 600]
    assert fullest(TrialConfig(micro_batch=3), lengths) == MicroBatchShape(3, 512)
    assert fullest(TrialConfig(micro_batch=3, padding="longest"), lengths) == MicroBatchShape(3, 512)
    assert fullest(TrialConfig(micro_batch=3, padding="longest"), [10, 90, 40]) == MicroBatchShape(3, 90)
    # One row of the three longest samples, each truncated to seq_len: 512 + 300 + 250.
    assert fullest(TrialConfig(micro_batch=3, padding="padding_free"), lengths) == MicroBatchShape(1, 1062)
    # Grouping by length changes typical steps, not the fullest one.
    grouped = TrialConfig(micro_batch=3, padding="longest", sampling="group_by_length")
    assert fullest(grouped, lengths) == fullest(dataclasses.replace(grouped, sampling="random"), lengths)
    # Lengths unknown: the bound, three full samples, flattened into one row (its mask and scores are T x T).
    assert fullest(TrialConfig(micro_batch=3, padding="padding_free"), None) == MicroBatchShape(1, 1536)
    # TRL's bfd packing: one row of three packed rows, each filled up to seq_len, whatever the lengths.
    for known in (None, lengths):
        assert fullest(TrialConfig(micro_batch=3, packing="bfd"), known) == MicroBatchShape(1, 1536)
    assert fullest(TrialConfig(micro_batch=3, packing="padding_free"), lengths) == MicroBatchShape(1, 1062)


def test_padding_free_under_a_mask_based_kernel_pays_for_its_mask_and_scores(gpt2_tiny):
    lengths = [64] * 8
    s, b = 64, 8

    def traits(config: TrialConfig):
        return memory_traits(config, "cuda")

    flat_config = TrialConfig(micro_batch=b, padding="padding_free", attn_implementation="eager")
    flat = traits(flat_config)
    shape = micro_batch_shape(flat, s, lengths)
    assert shape == MicroBatchShape(1, 512)
    assert packed_mask_bytes(flat, shape) == 512 * 512
    assert (
        packed_mask_bytes(traits(dataclasses.replace(flat_config, attn_implementation="flash_attention_2")), shape) == 0
    )
    padded_config = TrialConfig(micro_batch=b, attn_implementation="eager")
    padded = traits(padded_config)
    # Same tokens, but the flattened row's scores are a * (b s)^2: b times those of b rows of s.
    per_token_and_scores = layer_activation_bytes(gpt2_tiny, flat, s, "cuda", shape)
    rows = layer_activation_bytes(gpt2_tiny, padded, s, "cuda")
    scores_rows = (4 + 1 + 4) * gpt2_tiny.num_heads * s * s * b  # fp32 on CUDA: softmax, mask, dropout output
    assert per_token_and_scores - (rows - scores_rows) == scores_rows * b
    # With flash attention the same tokens cost the same as padded rows (no scores either way).
    fused_flat = traits(dataclasses.replace(flat_config, attn_implementation="flash_attention_2"))
    fused_rows = traits(dataclasses.replace(padded_config, attn_implementation="flash_attention_2"))
    assert activation_bytes(gpt2_tiny, fused_flat, s, "cuda", shape) == activation_bytes(
        gpt2_tiny, fused_rows, s, "cuda"
    )


def test_short_real_samples_shrink_the_estimate_under_longest_padding(gpt2_tiny):
    config = TrialConfig(micro_batch=16, padding="longest")
    full = estimate_peak(gpt2_tiny, config, 512, MemoryFit.prior("cuda")).total_bytes
    short = estimate_peak(gpt2_tiny, config, 512, MemoryFit.prior("cuda"), lengths=[100, 120, 80]).total_bytes
    assert short < full
    assert (
        estimate_peak(
            gpt2_tiny, dataclasses.replace(config, padding="max_length"), 512, MemoryFit.prior("cuda"), lengths=[100]
        ).total_bytes
        == full
    )


# --- real trials on the CPU ----------------------------------------------------------------------


def levers_of(job: TrialJob) -> dict:
    from tests.support.probes import LEVERS_FILE

    return json.loads(Path(job.work_dir, LEVERS_FILE).read_text())


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_real_trial_builds_the_model_with_the_attention_searched(tmp_path, tiny_workload, attn):
    job = TrialJob(
        workload=tiny_workload(callbacks=("tests.support.probes:RecordLevers",)),
        config=TrialConfig(micro_batch=8, pin_memory=False, attn_implementation=attn),
        work_dir=str(tmp_path / attn),
    )
    result = run_isolated(job, timeout_s=180)
    assert result.status == "ok", result.error
    assert levers_of(job)["attn_implementation"] == attn
    assert result.real_tokens_per_s == pytest.approx(result.samples_per_s * 32)  # synthetic: every token is real


@pytest.fixture(scope="module")
def gpt2_with_data(tmp_path_factory):
    """A local GPT-2 with a tokenizer trained here, and JSON lines of 3-60 word documents."""
    from autotune.spec.dataset import prepare_dataset
    from autotune.spec.measure import MeasureSettings

    root = tmp_path_factory.mktemp("levers")
    texts = corpus(160)
    model = resolve_model(str(make_local_model(root / "gpt2", texts, "gpt2")))
    data = write_jsonl(root / "docs.jsonl", texts)
    measure = MeasureSettings(warmup_steps=1, min_steps=3, max_steps=4, max_seconds=10.0, cv_target=1.0)
    description = prepare_dataset(str(data), model, 64, 8, measure.total_steps_cap, str(root / "cache"))
    return model, description, measure


@pytest.mark.parametrize(
    ("padding", "sampling", "collator", "sampler"),
    [
        ("longest", "group_by_length", "PadToLongest", "LengthGroupedSampler"),
        ("padding_free", "random", "DataCollatorWithFlattening", "RandomSampler"),
    ],
)
@pytest.mark.slow
def test_a_real_trial_with_a_padding_lever_counts_real_tokens(
    tmp_path, tiny_workload, gpt2_with_data, padding, sampling, collator, sampler
):
    model, description, measure = gpt2_with_data
    config = TrialConfig(
        micro_batch=8, pin_memory=False, padding=padding, sampling=sampling, attn_implementation="sdpa"
    )
    job = TrialJob(
        workload=tiny_workload(
            model,
            seq_len=64,
            measure=measure,
            dataset=description,
            callbacks=("tests.support.probes:RecordLevers",),
        ),
        config=config,
        work_dir=str(tmp_path / padding),
    )
    result = run_isolated(job, timeout_s=180)
    assert result.status == "ok", result.error
    record = levers_of(job)
    assert record["collator"] == collator and sampler in record["sampler"]
    # Documents of 3-60 words, in 64-token slots: the real tokens are well under the slots.
    assert 0 < result.real_tokens_per_s < 0.9 * result.tokens_per_s
    # The ranking's useful work counts the real tokens only, the attention over each sample's own length
    # (sum s_i^2 / sum s_i, read from the batches: under the 64-token slots).
    assert 0 < result.attention_context < 64
    assert result.model_tflops == pytest.approx(
        result.real_tokens_per_s * model_flops_per_token(model, result.attention_context) / 1e12
    )


def test_the_trials_dataset_ends_where_its_length_does(gpt2_with_data):
    """LengthGroupedSampler measures every sample with ``for feature in dataset``: it needs an end."""
    from autotune.runner._loader import load_training_dataset

    model, description, _ = gpt2_with_data
    dataset = load_training_dataset(description, model, 64, pad_to_length=False)
    assert len(list(iter(dataset))) == len(dataset)
    assert all(len(sample["input_ids"]) <= 64 for sample in dataset)
    assert len({len(sample["input_ids"]) for sample in dataset}) > 1  # unpadded: lengths differ
