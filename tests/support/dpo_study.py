"""One real ``--trainer dpo`` study for the DPO end-to-end tests (tests/e2e/test_dpo_e2e.py), built once per
test run (the ``dpo_study`` fixture in conftest.py, through ``tests.support.made_once``): generated
preference pairs (``autotune chat-corpus --format preference``) and ``autotune search --model ./decoder
--dataset prefs.jsonl --device cpu``, the command a user runs (its entry point, in the test process), on a
local 2-layer decoder (its ``config.json`` alone: llama-tiny's at 2 layers and a 4,096-word vocabulary, the
synthetic tokenizer's), with no ``--trainer`` (the rows choose DPOTrainer), TRL's default DPOConfig as its first
trial."""

from __future__ import annotations

from pathlib import Path

from tests.support.cli import run_cli_in_process
from tests.support.llm_study import RowsStudy, search_rows

# Short on purpose (the suite's CI budget): 64 tokens, one warm-up and two measured steps a trial.
SEQ_LEN = 64
# The local decoder (a directory with its config.json, as a user's model is): llama-tiny's config at 2 layers and
# a 4,096-id vocabulary (a CPU DPO step is mostly the LM head's: docs/benchmarks.md, "DPO on the CPU").
MODEL_DIR = "decoder"
DECODER = {"num_hidden_layers": 2, "vocab_size": 4096}
STUDY_NAME = f"{MODEL_DIR}-cpu-s{SEQ_LEN}"  # autotune.study.default_study_name("./decoder", cpu, 64)
# TRL's default DPOConfig (trl 1.16: micro-batch 8, activation checkpointing, bf16, fused AdamW), each lever
# at that one value, and precompute_ref_log_probs searched: two configs, so the two trials are the default
# (the seed, exactly, nothing snapped) and the same with the reference precomputed, whatever the sampler draws.
TRL_DEFAULT = {"micro_batch": 8, "checkpointing": True, "dtype": "bf16", "optim": "adamw_torch_fused"}
SPACE = "".join(f"{lever}: [{str(value).lower()}]\n" for lever, value in TRL_DEFAULT.items())
SPACE += "precompute_ref_log_probs: [false, true]\n"
TRIALS = 2


def make_dpo_study(root: Path) -> RowsStudy:
    # 48 pairs a twentieth of public chat data's length: prompt + answer rows of some 20 tokens, the
    # longest past 64 (truncated), a few prompts alone filling 64 (dropped by TRL, said in a note).
    pairs = ("--format", "preference", "--samples", "48", "--length-scale", "0.05")
    corpus = run_cli_in_process("chat-corpus", *pairs, "--out", "prefs.jsonl", cwd=root)
    assert corpus.returncode == 0, corpus.stderr
    (root / "space.yaml").write_text(SPACE)
    write_decoder(root / MODEL_DIR)
    storage = f"sqlite:///{root / 'study.db'}"
    search = search_rows(
        root, "prefs.jsonl", storage, TRIALS, SEQ_LEN, warmup_steps=1, max_measure_steps=2, model=f"./{MODEL_DIR}"
    )
    return RowsStudy(root, storage, search)


def write_decoder(directory: Path) -> None:
    """The local decoder's ``config.json``: llama-tiny's from the catalog, at :data:`DECODER`."""
    import json

    from autotune.spec.model_catalog import catalog_entry

    config = {key: value for key, value in catalog_entry("llama-tiny").items() if not key.startswith("_")}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({**config, **DECODER}))
