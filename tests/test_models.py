from __future__ import annotations

import json

import pytest

from autotune.errors import AutotuneError
from autotune.models import catalog_names, resolve_model

REQUIRED_CATALOG = [
    "bert-base-uncased", "bert-large-uncased", "roberta-base", "roberta-large", "distilbert-base-uncased",
    "gpt2", "gpt2-medium", "gpt2-large", "tinyllama-1.1b", "bert-tiny", "gpt2-tiny",
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


def test_tied_lm_head_counts_as_compute_not_embedding(gpt2_tiny):
    # GPT-2 ties lm_head to wte: the lookup-only embeddings are wpe alone... plus wte's lookup, which is the head.
    n_positions, hidden = 1024, 128
    assert gpt2_tiny.num_embedding_params == n_positions * hidden
    assert gpt2_tiny.num_block_params > 0


def test_local_directory_wins(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, intermediate_size=128).save_pretrained(tmp_path)
    spec = resolve_model(str(tmp_path))
    assert (spec.source, spec.num_layers, spec.hidden_size, spec.local_dir) == ("local", 3, 64, str(tmp_path.resolve()))


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
    config = {"model_type": "bert", "hidden_size": 96, "num_hidden_layers": 5, "num_attention_heads": 3,
              "intermediate_size": 192, "vocab_size": 1000}
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


def test_task_override_and_bad_task():
    assert resolve_model("bert-tiny", task="masked-lm").task == "masked-lm"
    assert resolve_model("gpt2-tiny", task="sequence-classification").task == "sequence-classification"
    with pytest.raises(AutotuneError, match="encoder"):
        resolve_model("bert-tiny", task="causal-lm")
    with pytest.raises(AutotuneError, match="unknown --task"):
        resolve_model("bert-tiny", task="translation")
