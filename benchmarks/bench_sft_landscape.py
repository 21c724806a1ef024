"""LLM fine-tuning on the CPU (issue 27 point 7): TRL's default SFTConfig against autotune's winner and
against each lever alone, in real (trained, not padding) tokens/s, on the generated chat corpus.

llama-tiny from the catalog (a Llama-architecture decoder: TinyLlama's config scaled down, 32k
vocabulary, GQA) with the synthetic tokenizer, on ``autotune chat-corpus`` rows at ``--length-scale``
(default 1/8) and ``--seq-len`` (default 128): the corpus's shape at an eighth of public chat data's
scale against an eighth of TRL's default ``max_length`` (1024), so about as many conversations are
truncated (a fifth) and padded as with TRL's defaults on real data. Then:

1. ``autotune search --trainer sft`` (by itself: the rows are chat) over a space shaped for this CPU
   (:data:`SEARCH_SPACE`: fp32 offered next to TRL's bf16, since a CPU without bf16 instructions only
   emulates bf16), ``--trials`` trials from TRL's default SFTConfig, and its ``best``;
2. re-measures, interleaved in rounds in this one run, each in a fresh trial child through the real
   runner (``autotune.runner.run_isolated``): TRL's default SFTConfig (``default_config("sft")``), the
   winner, and each lever alone on top of TRL's default;
3. prints the median real tokens/s of each over the rounds, its ratio to TRL's default, and the load
   average before and after; and, before the rounds, the throughput prior's prediction against each trial the
   search measured.

    python -m benchmarks.bench_sft_landscape --trials 8 --rounds 2
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, Workload, run_isolated
from autotune.spec.chat_corpus import write_jsonl
from autotune.spec.dataset import prepare_sft_rows
from autotune.spec.measure import MeasureSettings
from autotune.spec.models import resolve_model
from autotune.study._seeds import default_config
from autotune.trainers import get, with_model
from benchmarks._common import load_average
from benchmarks.bench_prior_on_search import prior_against_the_search

MODEL = "llama-tiny"
STUDY = "sft-landscape"
# search_spaces/llm.yaml less what a CPU cannot run (flash and flex attention, Liger, activation
# offloading, the 8-bit optimizers: CUDA), bf16 weights (emulated here), and compile (minutes of
# warm-up a trial on this CPU); fp32 autocast offered, TRL's bf16 kept.
SEARCH_SPACE = """\
micro_batch: [4, 8, 16, 32]
checkpointing: [true, false]
dtype: [bf16, fp32]
optim: [adamw_torch_fused, adamw_torch]
packing: ["off", padding_free, bfd]
attn_implementation: [sdpa]
"""


def search_winner(root: Path, data: Path, seq_len: int, trials: int, settings: MeasureSettings) -> TrialConfig:
    """``autotune search`` on the chat rows over :data:`SEARCH_SPACE`; the winner's knobs."""
    space = root / "space.yaml"
    space.write_text(SEARCH_SPACE)
    storage = f"sqlite:///{root / 'study.db'}"
    command = [
        *(sys.executable, "-m", "autotune", "search", "--model", MODEL, "--dataset", str(data), "--device", "cpu"),
        *("--seq-len", str(seq_len), "--space", str(space), "--trials", str(trials), "--storage", storage),
        *("--study-name", STUDY, "--work-dir", str(root / "search"), "--confirm-top", "0"),
        *("--warmup-steps", str(settings.warmup_steps), "--max-measure-steps", str(settings.max_steps)),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    print(done.stdout[-5000:])
    if done.returncode != 0:
        raise SystemExit(f"autotune search failed ({done.returncode}):\n{done.stderr[-3000:]}")
    from autotune.storage import load_study
    from autotune.views.export import winner

    return winner(load_study(storage, STUDY)).config


def lever_variants(trl_default: TrialConfig, best: TrialConfig) -> dict[str, TrialConfig]:
    """TRL's default, the winner, and each lever alone on TRL's default."""
    return {
        "TRL default SFTConfig": trl_default,
        f"autotune winner ({best.short()})": best,
        "packing bfd": dataclasses.replace(trl_default, packing="bfd"),
        "padding_free": dataclasses.replace(trl_default, packing="padding_free"),
        "checkpointing off": dataclasses.replace(trl_default, checkpointing=False),
        f"micro-batch {2 * trl_default.micro_batch}": dataclasses.replace(
            trl_default, micro_batch=2 * trl_default.micro_batch
        ),
        "optim adamw_torch": dataclasses.replace(trl_default, optim="adamw_torch"),
        "dtype fp32": dataclasses.replace(trl_default, dtype="fp32"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--length-scale", type=float, default=0.125)
    parser.add_argument("--samples", type=int, default=2000, help="Conversations in the generated corpus.")
    parser.add_argument("--trials", type=int, default=8, help="Trials of the search.")
    parser.add_argument("--rounds", type=int, default=2, help="Interleaved repetitions of every variant.")
    parser.add_argument("--steps", type=int, default=6, help="Measured optimizer steps at most, a trial.")
    options = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="bench-sft-landscape-"))
    data = root / "chat.jsonl"
    write_jsonl(str(data), options.samples, seed=0, fmt="messages", length_scale=options.length_scale)
    settings = MeasureSettings(warmup_steps=1, min_steps=3, max_steps=options.steps, max_seconds=40.0)
    print(
        f"{MODEL} under TRL's SFTTrainer on the CPU; {options.samples} generated conversations at length scale "
        f"{options.length_scale}, seq len {options.seq_len}"
    )
    print("before:", load_average())

    best = search_winner(root, data, options.seq_len, options.trials, settings)
    print(f"autotune's winner: {best.short()}  ({time.monotonic() - started:.0f} s so far)")
    trl_default = dataclasses.replace(default_config("sft"), pin_memory=False)
    variants = lever_variants(trl_default, dataclasses.replace(best, pin_memory=False))

    model = with_model(resolve_model(MODEL), get("sft"))
    largest = max(config.micro_batch * config.grad_accum for config in variants.values())
    dataset = prepare_sft_rows(
        str(data),
        model,
        "messages",
        "all",
        largest,
        settings.total_steps_cap,
        str(root / "datasets"),
        [],
        options.seq_len,
        get("sft"),
    )
    workload = Workload.for_model(
        model,
        seq_len=options.seq_len,
        ceiling_bytes=16 * 1024**3,
        measure=settings,
        dataset=dataset,
        trainer="sft",
        loss_on="all",
    )
    prior_against_the_search(f"sqlite:///{root / 'study.db'}", STUDY, workload)
    real: dict[str, list[float]] = {name: [] for name in variants}
    for round_number in range(options.rounds):
        for index, (name, config) in enumerate(variants.items()):
            job = TrialJob(workload=workload, config=config, work_dir=str(root / f"v{index}-{round_number}"))
            result = run_isolated(job, 900)
            if result.status != "ok":
                raise SystemExit(f"{name} failed: {result.status} {result.error}")
            real[name].append(result.real_tokens_per_s)
            print(
                f"  round {round_number} {name:<60} {result.real_tokens_per_s:8.0f} real tokens/s  "
                f"({result.samples_per_s:5.1f} samples/s; {load_average()})"
            )
    base = statistics.median(real["TRL default SFTConfig"])
    print(f"\nmedian over {options.rounds} rounds (interleaved, one run), {time.monotonic() - started:.0f} s in all:")
    print(f"  {'variant':<64} {'real tokens/s':>14} {'vs TRL default':>15}")
    for name, values in real.items():
        median = statistics.median(values)
        print(f"  {name:<64} {median:14.0f} {median / base:14.2f}x")
    print("after:", load_average())


if __name__ == "__main__":
    main()
