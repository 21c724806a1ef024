"""The LLM fine-tuning path end to end (issue 27): ``autotune search --model llama-tiny --dataset chat.jsonl
--device cpu`` on the generated chat corpus trains every trial through TRL's SFTTrainer, seeds TRL's
default SFTConfig, and ranks by the model TFLOPs of the real tokens; ``autotune best`` says what they count."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import run_cli, run_cli_in_process

pytestmark = pytest.mark.slow
pytest.importorskip("trl")

SPACE = """\
micro_batch: [4, 8]
checkpointing: [true, false]
dtype: [bf16]
optim: [adamw_torch_fused]
packing: ["off", bfd]
"""


@pytest.fixture(scope="module")
def sft_search(tmp_path_factory):
    root = tmp_path_factory.mktemp("sft-e2e")
    # The corpus and the study's reader in this process; the search is the end-to-end run (`python -m autotune`).
    corpus = run_cli_in_process(
        "chat-corpus", "--out", "chat.jsonl", "--samples", "200", "--length-scale", "0.03", cwd=root
    )
    assert corpus.returncode == 0, corpus.stderr
    (root / "space.yaml").write_text(SPACE)
    storage = f"sqlite:///{root / 'study.db'}"
    search = run_cli(
        *("search", "--model", "llama-tiny", "--dataset", "chat.jsonl", "--device", "cpu", "--trials", "3"),
        # Short on purpose (the suite's CI budget): 32 tokens, one warm-up and two measured steps a trial.
        *("--seq-len", "32", "--space", "space.yaml", "--storage", storage, "--work-dir", "runs"),
        *("--warmup-steps", "1", "--max-measure-steps", "2", "--confirm-top", "0", "--prune-ratio", "0"),
        cwd=root,
        timeout=1500,
    )
    best = run_cli_in_process("best", "--storage", storage, cwd=root)
    return search, best, storage


def trials(storage: str) -> list:
    import optuna

    from autotune.storage import schema

    study = optuna.load_study(study_name="llama-tiny-cpu-s32", storage=storage)
    found = []
    for trial in study.get_trials():
        result = trial.user_attrs[schema.TRIAL_RESULT]
        found.append((trial, json.loads(result) if isinstance(result, str) else result))
    return found


def test_every_trial_trains_through_sfttrainer_from_trls_default(sft_search):
    search, _, storage = sft_search
    assert search.returncode == 0, search.stderr[-3000:]
    assert "trainer: TRL's SFTTrainer on your rows" in search.stdout
    measured = trials(storage)
    assert len(measured) == 3
    for _, result in measured:
        assert result["status"] == "ok", result.get("error")
        assert result["runtime"]["trainer"] == "SFTTrainer" and "trl" in result["versions"]
    first, _ = measured[0]
    assert first.user_attrs["seed"] == "hf-default"  # the baseline seed: TRL's default SFTConfig here
    trl_default = {"micro_batch": 8, "checkpointing": True, "dtype": "bf16", "optim": "adamw_torch_fused"}
    assert {name: first.params[name] for name in (*trl_default, "packing")} == {**trl_default, "packing": "off"}
    assert "speedup over TRL default" in search.stdout and "TRL's default SFTConfig (#0)" in search.stdout


def test_the_ranking_is_model_tflops_of_real_tokens_and_best_says_what_they_count(sft_search):
    _, best, storage = sft_search
    assert best.returncode == 0, best.stderr
    measured = trials(storage)
    for _, result in measured:
        assert result["real_tokens_per_s"] < result["samples_per_s"] * 32  # no padding counted
        assert 0 < result["attention_context"] < 32
    fastest, _ = max(measured, key=lambda pair: pair[1]["model_tflops"])
    assert f"winner: #{fastest.number} at" in best.stdout
    assert "model TFLOPs count every real (non-padding) token" in best.stdout.replace("\n", " ")
