from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from autotune.errors import AutotuneError
from autotune.spec.model_catalog import catalog_entry, catalog_hub_id, catalog_name_of, catalog_names
from autotune.spec.models import build_model, resolve_model

# Today's decoders (issue 21): short name -> the Hub id whose published config.json the entry holds
# (docs/catalog.md says where each was read and cross-checked).
DECODERS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M",
    "smollm2-360m": "HuggingFaceTB/SmolLM2-360M",
    "smollm2-1.7b": "HuggingFaceTB/SmolLM2-1.7B",
    "llama-3.2-1b": "meta-llama/Llama-3.2-1B",
    "llama-3.2-3b": "meta-llama/Llama-3.2-3B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
    "qwen2.5-0.5b": "Qwen/Qwen2.5-0.5B",
    "qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B",
    "qwen2.5-7b": "Qwen/Qwen2.5-7B",
    "mistral-7b-v0.3": "mistralai/Mistral-7B-v0.3",
    "gemma-2-2b": "google/gemma-2-2b",
    "phi-3.5-mini": "microsoft/Phi-3.5-mini-instruct",
    "tinyllama-1.1b": "TinyLlama/TinyLlama_v1.1",
    "gemma-3-1b": "google/gemma-3-1b-pt",
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "qwen3-4b": "Qwen/Qwen3-4B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B",
}

REQUIRED_CATALOG = [
    "bert-base-uncased",
    "bert-large-uncased",
    "roberta-base",
    "roberta-large",
    "distilbert-base-uncased",
    "gpt2",
    "gpt2-medium",
    "gpt2-large",
    "bert-tiny",
    "gpt2-tiny",
    *DECODERS,
]


def test_catalog_has_the_promised_architectures():
    assert set(REQUIRED_CATALOG) <= set(catalog_names())


@pytest.mark.parametrize(
    "name, family, task, layers, hidden, params_millions",
    [
        # Published sizes: BERT-base 110M, BERT-large 340M (with the classification head: + pooler/classifier),
        # GPT-2 124M, TinyLlama 1.1B.
        ("bert-base-uncased", "encoder", "sequence-classification", 12, 768, 109.5),
        ("bert-large-uncased", "encoder", "sequence-classification", 24, 1024, 335.1),
        ("gpt2", "decoder", "causal-lm", 12, 768, 124.4),
        ("tinyllama-1.1b", "decoder", "causal-lm", 22, 2048, 1100.0),
    ],
)
def test_catalog_models_have_their_published_shape(name, family, task, layers, hidden, params_millions):
    spec = resolve_model(name)
    assert spec.source == "catalog"
    assert (spec.family, spec.task, spec.num_layers, spec.hidden_size) == (family, task, layers, hidden)
    assert spec.num_params / 1e6 == pytest.approx(params_millions, rel=0.01)


def test_hub_ids_resolve_to_the_catalog_offline():
    assert resolve_model("google-bert/bert-large-uncased").num_layers == 24


@pytest.mark.parametrize("short_name, hub_id", DECODERS.items())
def test_each_decoder_resolves_offline_by_hub_id_and_short_name_and_has_its_published_size(short_name, hub_id):
    import torch

    entry = catalog_entry(short_name)
    assert entry["_autotune_hub_id"] == hub_id
    by_hub_id = resolve_model(hub_id)
    assert (by_hub_id.source, by_hub_id.family, by_hub_id.task) == ("catalog", "decoder", "causal-lm")
    assert (
        by_hub_id.model_type
        == entry["model_type"]
        in {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3", "mixtral", "qwen3_moe"}
    )
    # Within 1 % of the size the model's Hub page / card publishes (the counts differ only by rounding).
    assert by_hub_id.num_params == pytest.approx(entry["_autotune_published_params"], rel=0.01)
    # A mixture of experts: the size one token passes through, as its publisher gives it, to 0.1B (Qwen3-30B-A3B's
    # card says 3.3B of the 3.353B counted: within 2 %; counting every expert would be 9x it).
    active = by_hub_id.active_non_embedding_params + by_hub_id.num_embedding_params
    if "_autotune_published_active_params" in entry:
        assert active == pytest.approx(entry["_autotune_published_active_params"], rel=0.02)
    else:
        assert by_hub_id.experts is None and active == by_hub_id.num_params
    for spelling in (short_name, short_name.upper(), hub_id.lower()):
        assert resolve_model(spelling).hf_config == by_hub_id.hf_config, spelling
    # The trial child builds from the spec's config dict, not from the catalog file: the round trip
    # must give the same model.
    with torch.device("meta"):
        model = build_model(by_hub_id.hf_config, by_hub_id.task)
    assert sum(p.numel() for p in model.parameters()) == by_hub_id.num_params


def test_every_catalog_entry_names_its_hub_id_and_answers_to_it():
    """Every entry says where a tool loads its checkpoint from (the export names it): a Hub id, or
    ``null`` for the made-up test models, which have none."""
    for name in catalog_names():
        hub_id = catalog_entry(name)["_autotune_hub_id"]
        assert catalog_hub_id(name) == hub_id and catalog_name_of(name.upper()) == name
        if hub_id is None:
            assert name in ("gpt2-tiny", "llama-tiny")  # the made-up test models
            continue
        assert catalog_name_of(hub_id.lower()) == name
        assert resolve_model(hub_id).hf_config == resolve_model(name).hf_config


def test_a_directory_is_no_catalog_name(tmp_path, monkeypatch):
    """A directory named as a catalog entry resolves to the directory first (resolve_model's order)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gpt2").mkdir()
    assert catalog_name_of("gpt2") is None and catalog_name_of("./gpt2") is None
    assert catalog_name_of("openai-community/gpt2") == "gpt2" and catalog_name_of("no-such-model") is None


def test_estimate_plans_a_catalog_decoder_by_its_hub_id(tmp_path):
    import json

    from tests.support.cli import run_cli_in_process

    args = ("estimate", "--model", "meta-llama/Llama-3.2-1B", "--seq-len", "2048", "--gpu-type", "h100-sxm")
    table = run_cli_in_process(*args, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert [line for line in table.stdout.splitlines() if line.startswith("│")]
    document = json.loads(run_cli_in_process(*args, "--json", cwd=tmp_path).stdout)
    assert document["rows"]
    # fp32 weights (llm.yaml, a decoder's default space, trains them in bf16 autocast or bf16 weights).
    fp32 = next(row for row in document["rows"] if row["config"].get("weight_dtype", "fp32") == "fp32")
    # The catalog's model: 4 bytes a parameter, plus autocast's half copy where the row trains in bf16/fp16.
    per_param = 4 + (2 if fp32["config"]["dtype"] in ("bf16", "fp16") else 0)
    assert fp32["parts_bytes"]["weights"] == per_param * resolve_model("llama-3.2-1b").num_params


def test_tied_lm_head_counts_as_compute_not_embedding(gpt2_tiny):
    # GPT-2 ties lm_head to wte: the lookup-only embeddings are wpe alone... plus wte's lookup, which is the head.
    n_positions, hidden = 1024, 128
    assert gpt2_tiny.num_embedding_params == n_positions * hidden
    assert gpt2_tiny.num_block_params > 0


def test_local_directory_wins(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, intermediate_size=128).save_pretrained(
        tmp_path
    )
    spec = resolve_model(str(tmp_path))
    assert (spec.source, spec.num_layers, spec.hidden_size, spec.local_dir) == ("local", 3, 64, str(tmp_path.resolve()))


def test_a_local_config_edited_after_it_was_described_is_described_again(tmp_path, monkeypatch):
    """The description a search start reads back (autotune.spec.derived_cache) is keyed by the file's content:
    an edited config.json is never answered from the old one, and the same content reads back equal."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    config = {"model_type": "bert", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
              "intermediate_size": 128, "vocab_size": 500, "max_position_embeddings": 128}  # fmt: skip
    (model_dir / "config.json").write_text(json.dumps(config))
    two = resolve_model(str(model_dir))
    assert resolve_model(str(model_dir)) == two and two.num_layers == 2 and two.local_dir == str(model_dir.resolve())
    (model_dir / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 4}))
    four = resolve_model(str(model_dir))
    assert four.num_layers == 4 and four.num_block_params == 2 * two.num_block_params
    assert len(list((tmp_path / "cache" / "autotune" / "derived").glob("model-spec-*.json"))) == 2


def test_directory_without_config_is_explained(tmp_path):
    with pytest.raises(AutotuneError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_hf_cache_is_read_offline(tmp_path, monkeypatch):
    # The real cache layout: hub/models--org--name/{refs/main, snapshots/<rev>/config.json}.
    repo = tmp_path / "hub" / "models--acme--tiny-encoder"
    snapshot = repo / "snapshots" / "0123456789abcdef"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    config = {
        "model_type": "bert",
        "hidden_size": 96,
        "num_hidden_layers": 5,
        "num_attention_heads": 3,
        "intermediate_size": 192,
        "vocab_size": 1000,
    }
    (snapshot / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    spec = resolve_model("acme/tiny-encoder")
    assert (spec.source, spec.num_layers, spec.hidden_size, spec.vocab_size) == ("hf-cache", 5, 96, 1000)


def test_unknown_name_says_how_to_fix_it():
    with pytest.raises(AutotuneError) as info:
        resolve_model("no-such-model-anywhere")
    message = str(info.value)
    assert "local directory" in message and "cache" in message and "bert-tiny" in message


@pytest.mark.slow
def test_a_name_found_nowhere_offline_is_answered_before_transformers_or_torch_is_imported(tmp_path):
    """A typo's one line needs neither (their imports are 5-8 s of CPU): the same answer, from a fresh interpreter
    whose modules are read after it; a model the Hugging Face cache holds still resolves (the test above)."""
    names = ["no-such-model-anywhere", "acme/not-cached", "./no such directory"]
    script = (
        "import sys\n"
        "from autotune.errors import AutotuneError\n"
        "from autotune.spec.models import resolve_model\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        resolve_model(name)\n"
        "    except AutotuneError as error:\n"
        "        print(str(error).split(':')[0])\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    completed = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, env=env)
    assert completed.stdout.splitlines() == [*(f"unknown model {n!r}" for n in names), "[]"], completed.stderr[-2000:]


def test_task_override_and_bad_task():
    assert resolve_model("bert-tiny", task="masked-lm").task == "masked-lm"
    assert resolve_model("gpt2-tiny", task="sequence-classification").task == "sequence-classification"
    with pytest.raises(AutotuneError, match="encoder"):
        resolve_model("bert-tiny", task="causal-lm")
    with pytest.raises(AutotuneError, match="unknown --task"):
        resolve_model("bert-tiny", task="translation")


def test_every_transformers_load_in_autotune_refuses_a_models_own_code():
    """Every ``from_pretrained`` / ``from_config`` call in the package (config, tokenizer, model; parent
    and trial child) passes ``**NO_MODEL_CODE`` (``trust_remote_code=False``): told nothing,
    transformers asks on a terminal and runs a model directory's code on "y"."""
    import ast
    from pathlib import Path

    import autotune

    loads, offences = 0, []
    for path in sorted(Path(autotune.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("from_pretrained", "from_config")
            ):
                loads += 1
                told = any(
                    (k.arg is None and isinstance(k.value, ast.Name) and k.value.id == "NO_MODEL_CODE")
                    or (k.arg == "trust_remote_code" and isinstance(k.value, ast.Constant) and k.value.value is False)
                    for k in node.keywords
                )
                # build_model gathers its keyword arguments first: the dict it passes must hold them.
                gathered = any(
                    k.arg is None and isinstance(k.value, ast.Name) and k.value.id == "kwargs" for k in node.keywords
                )
                if not told and not (gathered and "kwargs.update(NO_MODEL_CODE)" in path.read_text()):
                    offences.append(f"{path.name}:{node.lineno}")
    assert loads >= 6  # the config (3 sources), two tokenizer loads, the model's three heads
    assert not offences, offences


def test_a_known_model_type_that_also_ships_code_is_built_from_transformers_own_classes(tmp_path):
    """bert with an ``auto_map``: transformers' own BertConfig and model, the shipped file never imported."""
    marker = tmp_path / "ran.txt"
    values = {k: v for k, v in catalog_entry("bert-tiny").items() if not k.startswith("_autotune")}
    model_dir = tmp_path / "bert-with-code"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        json.dumps(
            {
                **values,
                "auto_map": {"AutoConfig": "shipped.Config", "AutoModelForSequenceClassification": "shipped.Model"},
            }
        )
    )
    (model_dir / "shipped.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")
    spec = resolve_model(str(model_dir))
    model = build_model(spec.hf_config, spec.task)
    assert type(model).__module__.startswith("transformers.models.bert.")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("name", "attention_inputs", "mlp_inputs", "gated", "rms"),
    [
        ("llama-3.2-1b", 3, 2, True, True),  # q/k/v_proj, gate_proj + up_proj, LlamaRMSNorm
        ("qwen2.5-0.5b", 3, 2, True, True),
        ("phi-3.5-mini", 1, 1, True, True),  # fused qkv_proj and gate_up_proj
        ("gpt2", 1, 1, False, False),  # c_attn, c_fc, LayerNorm
        ("bert-tiny", 3, 1, False, False),  # query/key/value, intermediate.dense
        ("distilbert-base-uncased", 3, 1, False, False),  # q_lin/k_lin/v_lin
    ],
)
def test_the_block_layout_is_read_from_the_block_built_on_the_meta_device(
    name, attention_inputs, mlp_inputs, gated, rms
):
    layout = resolve_model(name).block_layout
    assert (layout.attention_input_projections, layout.mlp_input_projections) == (attention_inputs, mlp_inputs)
    assert (layout.gated_mlp, layout.rms_norm) == (gated, rms)
    assert layout.activation_extra_tensors == (3.0 if name == "gpt2" else 0.0)  # gelu_new in Python; the others torch's
    # Kept in the derived cache and read back the same (a second resolve reads it without transformers).
    assert resolve_model(name).block_layout == layout


def _config_dir(tmp_path, model_type: str, **values):
    from transformers import AutoConfig

    directory = tmp_path / model_type
    AutoConfig.for_model(model_type, **values).save_pretrained(directory)
    return str(directory)


SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


@pytest.mark.parametrize(
    "model_type, family, task",
    [
        # Decoders no list of autotune's names (apertus, olmo3): transformers' own mappings say so.
        ("apertus", "decoder", "causal-lm"),
        ("olmo3", "decoder", "causal-lm"),
        # BERT has a causal-LM head too (BertLMHeadModel), and a masked-LM one: an encoder.
        ("bert", "encoder", "sequence-classification"),
    ],
)
def test_a_config_without_architectures_is_read_by_its_model_type(tmp_path, model_type, family, task):
    spec = resolve_model(_config_dir(tmp_path, model_type, vocab_size=32064, **SMALL))
    assert "architectures" not in spec.hf_config or not spec.hf_config["architectures"]
    assert (spec.family, spec.task) == (family, task)


@pytest.mark.parametrize(
    "model_type, values, bounded",
    [
        ("gpt2", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}, True),  # wpe
        (
            "opt",
            {
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "ffn_dim": 128,
                "word_embed_proj_dim": 64,
                "max_position_embeddings": 256,
            },
            True,
        ),  # embed_positions, offset 2
        ("phi3", {**SMALL, "max_position_embeddings": 256}, False),  # rotary
        ("bloom", {"hidden_size": 64, "n_layer": 2, "n_head": 4}, False),  # ALiBi
    ],
)
def test_only_a_learned_position_table_bounds_the_sequence(tmp_path, model_type, values, bounded):
    spec = resolve_model(_config_dir(tmp_path, model_type, vocab_size=32064, **values))
    declared = spec.hf_config.get("max_position_embeddings") or spec.hf_config.get("n_positions") or 0
    assert spec.max_positions == (declared if bounded else 0)


def test_a_size_given_once_a_layer_is_read_at_its_mean(tmp_path):
    """Gemma 3n's ``intermediate_size`` is a list, one width a layer (configuration_gemma3n.py)."""
    values = {**SMALL, "intermediate_size": [128, 256], "layer_types": ["sliding_attention", "full_attention"]}
    values["num_kv_shared_layers"] = 0
    directory = _config_dir(tmp_path, "gemma3n_text", vocab_size=512, vocab_size_per_layer_input=512, **values)
    spec = resolve_model(directory)
    assert spec.intermediate_size == 192
    assert spec.num_layers == 2
