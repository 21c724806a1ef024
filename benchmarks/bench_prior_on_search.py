"""The throughput prior against a real search's trials (docs/benchmarks.md, "The throughput prior"): issue 40's
check of its level and order under TRL's trainers, where no grid was measured.

Generates rows (``autotune chat-corpus``: chat conversations, or preference pairs with ``--format preference``),
runs ``autotune search --model llama-tiny --dataset <rows> --device cpu`` (the rows choose SFTTrainer or
DPOTrainer; the default space), then plans the same options as the search did (``autotune.plan.plan``) and prints,
for each trial it measured, the uncalibrated prior's real tokens/s (``Workload.speed_model()``: nominal CPU figures
unless ``autotune devices --calibrate`` stored this CPU's) against the measured, their Spearman correlation and the
median level.

    python -m benchmarks.bench_prior_on_search --format preference --trials 6 --seq-len 256

``--model`` gives another model than llama-tiny (a local directory is resolved to its absolute path first).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.runner import Workload
from benchmarks._common import load_average

MODEL = "llama-tiny"


def prior_against_the_search(storage: str, study_name: str, workload: Workload) -> list[tuple[str, float, float]]:
    """The uncalibrated prior's real tokens/s against each measured trial of the study: (config, predicted,
    measured) rows, printed with their Spearman correlation and the median level."""
    from autotune.storage import load_study
    from autotune.views.ranking import study_ranking
    from benchmarks.bench_speed_prior import spearman

    speed = workload.speed_model()
    rows = []
    for ranked in study_ranking(load_study(storage, study_name)):
        estimate = speed.estimate(workload.model, ranked.config, workload.seq_len)
        if estimate is not None and ranked.result.real_tokens_per_s:
            rows.append((ranked.config.short(), estimate.tokens_per_s, ranked.result.real_tokens_per_s))
    print("the throughput prior against the search's trials (real tokens/s, predicted / measured):")
    for name, predicted, measured in rows:
        print(f"  {name:<72} {predicted:8.0f} {measured:8.0f} {predicted / measured:6.2f}x")
    if len(rows) >= 2:
        levels = [predicted / measured for _, predicted, measured in rows]
        correlation = spearman([r[1] for r in rows], [r[2] for r in rows])
        print(
            f"  Spearman {correlation:.2f} over {len(rows)} trials; level median {statistics.median(levels):.2f}x "
            f"({min(levels):.2f}-{max(levels):.2f}x)"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", default="messages", help="chat-corpus --format: messages or preference")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--length-scale", type=float, default=0.125)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--model", default=MODEL, help="a catalog name or a local model directory")
    options = parser.parse_args()
    model = str(Path(options.model).resolve()) if Path(options.model).is_dir() else options.model
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path(tempfile.mkdtemp(prefix="bench-prior-on-search-"))
    corpus = ("chat-corpus", "--format", options.format, "--samples", str(options.samples))
    subprocess.run(
        [sys.executable, "-m", "autotune", *corpus, "--length-scale", str(options.length_scale), "--out", "rows.jsonl"],
        cwd=root,
        check=True,
    )
    shared = ("--model", model, "--dataset", "rows.jsonl", "--device", "cpu", "--seq-len", str(options.seq_len))
    storage, study_name = "sqlite:///study.db", "prior-on-search"
    print("before:", load_average())
    search = subprocess.run(
        [sys.executable, "-m", "autotune", "search", *shared, "--global-batch", str(options.global_batch)]
        + ["--trials", str(options.trials), "--confirm-top", "0", "--storage", storage, "--study-name", study_name],
        cwd=root,
        capture_output=True,
        text=True,
    )
    print(search.stdout[-3000:])
    if search.returncode != 0:
        raise SystemExit(f"autotune search failed ({search.returncode}):\n{search.stderr[-3000:]}")
    print("after:", load_average())
    os.chdir(root)  # the plan reads the rows where the search did
    from autotune.plan import SearchOptions, plan

    planned = plan(
        SearchOptions(
            model=model,
            dataset="rows.jsonl",
            device="cpu",
            seq_len=options.seq_len,
            global_batch=options.global_batch,
        )
    )
    prior_against_the_search(storage, study_name, planned.workload)


if __name__ == "__main__":
    main()
