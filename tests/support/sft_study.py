"""One real ``--trainer sft`` study for the LLM path's end-to-end tests (tests/e2e/test_sft_e2e.py) and the
SFT fidelity benchmark's test (tests/test_bench_sft_fidelity.py), built once per test run (the
``sft_study`` fixture in conftest.py, through ``tests.support.made_once``): the generated chat corpus,
the fidelity benchmark's own space (benchmarks/bench_sft_fidelity.py: packing, attention and weight
dtype among the levers), and ``autotune search --model llama-tiny --dataset chat.jsonl``, the command a user
runs (its entry point, in the test process: tests/support/cli.py's ``run_cli_in_process``), with TRL's default
SFTConfig as its first trial."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.bench_sft_fidelity import SPACE
from tests.support.cli import run_cli_in_process
from tests.support.llm_study import RowsStudy, search_rows

# Short on purpose (the suite's CI budget): 48 tokens, one warm-up and two measured steps a trial.
SEQ_LEN = 48
TRIALS = 3
STUDY_NAME = f"llama-tiny-cpu-s{SEQ_LEN}"  # autotune.study.default_study_name("llama-tiny", cpu, 48)
# The search's options as benchmarks/bench_sft_fidelity.py's study_workload reads them.
OPTIONS = argparse.Namespace(model="llama-tiny", seq_len=SEQ_LEN, warmup_steps=1, max_measure_steps=2)


def make_sft_study(root: Path) -> RowsStudy:
    corpus = run_cli_in_process(
        "chat-corpus", "--out", "chat.jsonl", "--samples", "160", "--length-scale", "0.03", cwd=root
    )
    assert corpus.returncode == 0, corpus.stderr
    (root / "space.yaml").write_text(SPACE)
    storage = f"sqlite:///{root / 'study.db'}"
    search = search_rows(root, "chat.jsonl", storage, TRIALS, SEQ_LEN, OPTIONS.warmup_steps, OPTIONS.max_measure_steps)
    return RowsStudy(root, storage, search)
