"""``--peft``: the adapter config read and checked, counted, filtered on the CPU, the estimator's
bytes, the FLOPs formula, the study identity, and the 4-bit path through a fake bitsandbytes."""

from __future__ import annotations

import dataclasses
import json

import optuna
import pytest
import torch

from autotune.errors import AutotuneError
from autotune.estimate._parts import QUANTIZED_4BIT_BYTES, model_state_bytes
from autotune.levers import TrialConfig, memory_traits
from autotune.spec.flops import attention_flops_per_token, model_flops_per_token, recompute_flops_per_token
from autotune.spec.peft import PeftSpec, adapter_config_path, quantize_4bit, read_peft_option, with_peft
from autotune.storage import schema
from autotune.study import check_identity
from tests.support.cli import run_cli_in_process

ADAPTER = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["c_attn", "c_proj"]}


def _file(tmp_path, text: str, name: str = "adapter.json") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", "expected a mapping of LoraConfig keys"),
        ("r: [4", "not valid JSON or YAML"),
        ('{"lora_alfa": 4}', "lora_alfa is not a LoraConfig key (did you mean lora_alpha?)"),
        ('{"r": 0}', "r must be a positive integer"),
        ('{"r": true}', "r must be a positive integer"),
        ('{"lora_alpha": -1}', "lora_alpha must be a positive number"),
        ('{"lora_dropout": 1.5}', "lora_dropout must be a number from 0 up to, not including, 1"),
        ('{"target_modules": [1]}', "target_modules must be a module name pattern or a list of names"),
        ('{"quantize": "8bit"}', "quantize '8bit': the only choice is 4bit"),
        ('{"peft_type": "IA3"}', "peft_type 'IA3': autotune tunes LoRA adapters only"),
    ],
)
def test_a_bad_adapter_config_is_one_line_naming_the_option_and_file(tmp_path, text, message):
    path = _file(tmp_path, text)
    with pytest.raises(AutotuneError) as raised:
        read_peft_option(path)
    assert str(raised.value).startswith(f"--peft {path}: ") and message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_missing_file_and_a_binary_file_are_refused(tmp_path):
    with pytest.raises(AutotuneError, match=r"^--peft .*missing.json: give lora, qlora, or the path of an adapter"):
        read_peft_option(str(tmp_path / "missing.json"))
    with pytest.raises(AutotuneError, match=r"^--peft lroa: give lora, qlora, or the path of an adapter config"):
        read_peft_option("lroa")  # a misspelled kind is no file either
    binary = tmp_path / "adapter.bin"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(AutotuneError, match=r"not a text file"):
        read_peft_option(str(binary))


def test_a_saved_adapter_config_json_is_read_without_its_bookkeeping(tmp_path):
    """What peft's save_pretrained writes (inference_mode true in a config loaded for inference)."""
    from peft import LoraConfig

    LoraConfig(**ADAPTER, task_type="CAUSAL_LM").save_pretrained(str(tmp_path))
    config, quantize = read_peft_option(str(tmp_path / "adapter_config.json"))
    assert quantize is None and config["r"] == 4 and set(config["target_modules"]) == {"c_attn", "c_proj"}
    assert "inference_mode" not in config and "peft_version" not in config


def test_yaml_with_quantize_asks_for_qlora(tmp_path):
    path = _file(tmp_path, "r: 8\nlora_alpha: 16\ntarget_modules: all-linear\nquantize: 4bit\n", "adapter.yaml")
    assert read_peft_option(path) == ({"r": 8, "lora_alpha": 16, "target_modules": "all-linear"}, "4bit")


def test_target_modules_the_model_lacks_are_refused(tmp_path, gpt2_tiny, cpu):
    path = _file(tmp_path, '{"target_modules": ["q_proj"]}')
    with pytest.raises(AutotuneError, match=rf"^--peft {path}: Target modules .*q_proj.* not found"):
        with_peft(gpt2_tiny, path, cpu, [])


def test_the_adapters_are_counted_by_peft(tmp_path, gpt2_tiny, cpu):
    spec = with_peft(gpt2_tiny, _file(tmp_path, json.dumps(ADAPTER)), cpu, []).peft
    h, layers = gpt2_tiny.hidden_size, gpt2_tiny.num_layers
    # c_attn: h -> 3h, attention c_proj: h -> h, MLP c_proj: 4h -> h; LoRA adds r x (in + out) each.
    assert spec.adapter_params == 4 * layers * ((h + 3 * h) + (h + h) + (4 * h + h))
    assert spec.quantized_params == 0


def test_qlora_on_the_cpu_becomes_lora_with_one_note(gpt2_tiny, cpu):
    notes: list[str] = []
    model = with_peft(gpt2_tiny, "qlora", cpu, notes)
    assert model.peft.quantize is None and model.peft.quantized_params == 0
    assert len(notes) == 1 and "quantize 4bit removed" in notes[0] and "CUDA" in notes[0]


def test_qlora_on_cuda_counts_every_linear_weight_but_the_head(gpt2_tiny):
    from autotune.spec.devices import DeviceSpec

    gpu = DeviceSpec(
        kind="cuda", index=0, name="FakeGPU", total_memory_bytes=16 * 1024**3, supported_dtypes=("fp32", "bf16")
    )
    llama = __import__("autotune.spec.models", fromlist=["resolve_model"]).resolve_model("smollm2-135m")
    spec = with_peft(llama, "qlora", gpu, []).peft
    assert spec.quantize == "4bit"
    h, f, layers = llama.hidden_size, llama.intermediate_size, llama.num_layers
    kv = llama.num_kv_heads * llama.head_dim
    assert spec.quantized_params == layers * (2 * h * h + 2 * h * kv + 3 * h * f)  # q, o, k, v, gate/up/down


def _lora(model, adapters: int, quantized: int = 0):
    return dataclasses.replace(
        model, peft=PeftSpec(adapter_config=ADAPTER, quantize=None, adapter_params=adapters, quantized_params=quantized)
    )


def test_the_estimator_counts_frozen_weights_without_gradients_or_states(gpt2_tiny):
    n, a = gpt2_tiny.num_params, 1000
    lora = _lora(gpt2_tiny, a)
    fp32, mixed = TrialConfig(dtype="fp32", optim="adamw_torch"), TrialConfig(dtype="bf16", optim="adamw_torch")
    assert model_state_bytes(lora, memory_traits(fp32, "cuda")) == (4 * n + 4 * a, 4 * a, 8 * a)
    weights, _, _ = model_state_bytes(lora, memory_traits(mixed, "cuda"))
    assert weights == 4 * n + 4 * a + 2 * (gpt2_tiny.num_non_embedding_params + a)  # autocast copies, frozen too
    bf16 = memory_traits(TrialConfig(dtype="bf16", weight_dtype="bf16", optim="adamw_torch"), "cuda")
    assert model_state_bytes(lora, bf16) == (2 * n + 4 * a, 4 * a, 8 * a)  # fp32 adapters over a bf16 base
    q = 5000
    weights, _, _ = model_state_bytes(_lora(gpt2_tiny, a, q), bf16)
    assert weights == 2 * (n - q) + int(QUANTIZED_4BIT_BYTES * q) + 4 * a


def test_lora_flops_count_the_frozen_forward_and_input_gradient(gpt2_tiny):
    n, a = gpt2_tiny.num_non_embedding_params, 1000
    lora = _lora(gpt2_tiny, a)
    attention = attention_flops_per_token(gpt2_tiny, 64)
    assert model_flops_per_token(gpt2_tiny, 64) == 6 * n + attention
    assert model_flops_per_token(lora, 64) == 4 * n + 6 * a + attention
    assert recompute_flops_per_token(lora, 64) == recompute_flops_per_token(gpt2_tiny, 64) + 2 * a


def test_a_study_of_other_adapters_is_refused():
    study = optuna.create_study()
    stored = {
        "model": "gpt2-tiny",
        "seq_len": 64,
        "device": "cpu",
        "peft": {"adapter_config": ADAPTER, "quantize": None},
    }
    study.set_user_attr(schema.STUDY_IDENTITY, stored)
    check_identity(study, stored)
    other = {**stored, "peft": {"adapter_config": {**ADAPTER, "r": 8}, "quantize": None}}
    with pytest.raises(AutotuneError, match="another setup.*peft"):
        check_identity(study, other)
    with pytest.raises(AutotuneError, match="another setup.*peft"):
        check_identity(study, {**stored, "peft": None})


def test_the_adapter_config_goes_beside_the_exported_arguments():
    assert adapter_config_path("best_args.json") == "best_args.adapter_config.json"
    assert adapter_config_path("out/args.txt") == "out/args.adapter_config.json"


class FakeParams4bit(torch.nn.Parameter):
    """Stands in for bitsandbytes.nn.Params4bit where there is no CUDA device (nothing is quantized)."""

    def __new__(cls, data, requires_grad=False, quant_type="fp4"):
        param = super().__new__(cls, data, requires_grad=requires_grad)
        param.quant_type = quant_type
        return param


class FakeLinear4bit(torch.nn.Linear):
    """Stands in for bitsandbytes.nn.Linear4bit where there is no CUDA device."""

    def __init__(self, in_features, out_features, bias=True, compute_dtype=None, quant_type="fp4"):
        super().__init__(in_features, out_features, bias=bias)
        self.compute_dtype, self.quant_type = compute_dtype, quant_type


class FakeBitsAndBytes:
    """The part of the ``bitsandbytes`` module :func:`quantize_4bit` uses."""

    class nn:
        Linear4bit = FakeLinear4bit
        Params4bit = FakeParams4bit


def test_the_4bit_path_replaces_every_linear_layer_but_the_head_through_a_fake_bitsandbytes():
    from autotune.spec.models import build_model, resolve_model

    spec = resolve_model("smollm2-135m")
    config = {
        **spec.hf_config,
        "num_hidden_layers": 1,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
    }
    model = build_model(config, spec.task, dtype="bfloat16")
    quantized = quantize_4bit(model, FakeBitsAndBytes, torch.bfloat16, "cpu")
    fours = [m for m in quantized.modules() if isinstance(m, FakeLinear4bit)]
    assert len(fours) == 7  # q, k, v, o, gate, up, down
    assert all(m.quant_type == "nf4" and m.compute_dtype == torch.bfloat16 for m in fours)
    assert all(
        isinstance(m.weight, FakeParams4bit) and m.weight.quant_type == "nf4" and not m.weight.requires_grad
        for m in fours
    )
    assert not isinstance(quantized.get_output_embeddings(), FakeLinear4bit)


def test_a_bad_peft_file_is_one_line_through_the_real_cli(tmp_path):
    path = _file(tmp_path, '{"r": 0}')
    done = run_cli_in_process(
        "search", "--model", "gpt2-tiny", "--device", "cpu", "--peft", path, "--trials", "1", cwd=tmp_path
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"autotune: error: --peft {path}: r must be a positive integer (the adapters' rank), not 0"
    )


def test_a_studys_adapters_are_described_in_a_few_words():
    from autotune.spec.models import PeftSpec

    qlora = PeftSpec(adapter_config={"r": 8}, quantize="4bit", adapter_params=41_943_040)
    assert qlora.describe() == "QLoRA r=8 (4-bit base, 41.9 M trained params)"
    assert PeftSpec(adapter_config={"r": 16}, quantize=None, adapter_params=1_000_000).describe() == (
        "LoRA r=16 (1.0 M trained params)"
    )


def test_estimate_plans_lora_with_the_search_s_wrapping_and_shows_each_weight_dtype(tmp_path):
    """`autotune estimate --peft lora` plans the adapters as the search trains them (frozen base: no
    gradients or optimizer states for it), qlora on a GPU you plan for keeps its 4-bit base, and the
    short table keeps weight dtypes apart, one row per setting even where a fixed global batch ties
    accumulation to the micro-batch (seen on an H200: rows per micro-batch, weights=bf16 unlabelled)."""
    import json

    space = tmp_path / "space.yaml"
    space.write_text(
        "global_batch: 8\nmicro_batch: [1, 2, 4, 8]\ndtype: [bf16]\nweight_dtype: [fp32, bf16]\noptim: [adamw_torch]\n"
    )
    plan = ("estimate", "--model", "qwen2.5-0.5b", "--seq-len", "2048", "--gpu-type", "rtx-4090", "--space", str(space))
    full, lora = (run_cli_in_process(*plan, "--json", *extra, cwd=tmp_path) for extra in ((), ("--peft", "lora")))
    assert full.returncode == 0 and lora.returncode == 0, full.stderr + lora.stderr
    full_rows, lora_rows = (
        {json.dumps(row["config"], sort_keys=True): row for row in json.loads(done.stdout)["rows"]}
        for done in (full, lora)
    )
    assert full_rows.keys() == lora_rows.keys()
    assert json.loads(full.stdout)["peft"] is None
    assert json.loads(lora.stdout)["peft"]["adapter_config"]["r"] == 16
    states = ("weights", "gradients", "optimizer states")
    for key, row in full_rows.items():  # adapters only: fewer gradient and optimizer-state bytes
        assert lora_rows[key]["parts_bytes"]["optimizer states"] < row["parts_bytes"]["optimizer states"] / 20, key
        lora_states = sum(lora_rows[key]["parts_bytes"][part] for part in states)
        assert lora_states < sum(row["parts_bytes"][part] for part in states), key
    table = run_cli_in_process(*plan, "--peft", "lora", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    # Every row trains the adapters: the title says which (the table's rows cannot).
    assert "qwen2.5-0.5b with LoRA r=16 (" in " ".join(table.stdout.split()), table.stdout
    rows = [line for line in table.stdout.splitlines() if line.startswith("│") and "│ bf16 " in line]
    assert len(rows) == 2, table.stdout  # one per weight dtype: accumulation does not split a setting
    assert sum("weights=" in line for line in rows) == 1, table.stdout  # "weights=bf16", cut short in a narrow console
