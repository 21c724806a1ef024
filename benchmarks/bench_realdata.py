"""Real data of realistic lengths: the HF default batching against autotune's winner with the padding levers.

Builds a local model directory (a GPT-2 decoder of bert-mini's size: 4 layers, h=256, 4 heads; an
8k byte-level BPE tokenizer trained here with the ``tokenizers`` library on the generated corpus: no
package ships a tokenizer file this machine can install, and nothing is downloaded) and a JSON
lines file of documents whose lengths follow a log-normal distribution (median about 60 words,
a long tail past --seq-len, as web and instruction text have). Then:

1. searches with ``autotune search --dataset`` over the padding levers only (``padding``,
   ``sampling``, ``attn_implementation``), everything else fixed at the HF defaults (micro-batch 8,
   fp32, adamw_torch), so the winner differs from the default in the levers alone;
2. re-measures, side by side and interleaved in this one run, each in a fresh trial child through
   the real runner: the HF default (every sample padded to --seq-len, random order, the model's
   default attention) and the winner, plus each padding lever alone;
3. prints samples/s and real (non-padding) tokens/s of each, the median over the rounds.

    python -m benchmarks.bench_realdata --seq-len 256 --trials 8 --rounds 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, Workload, run_isolated
from autotune.spec.dataset import prepare_dataset
from autotune.spec.measure import MeasureSettings
from autotune.spec.models import resolve_model
from benchmarks._common import load_average
from benchmarks.bench_dataset import generated_documents, train_tokenizer

LEVERS_SPACE = """\
micro_batch: [8]
dtype: [fp32]
optim: [adamw_torch]
pin_memory: [false]
attn_implementation: [sdpa, eager]
padding: [max_length, longest, padding_free]
sampling: [random, group_by_length]
"""


def lognormal_words(rng) -> int:
    """Words per document: log-normal, median e^4.1 = 60, sigma 0.9 (a tenth of documents past 190 words)."""
    return max(3, int(rng.lognormvariate(4.1, 0.9)))


def make_decoder_dir(root: Path, documents: list[str]) -> Path:
    """A GPT-2 config of bert-mini's size and the tokenizer trained on ``documents``."""
    from transformers import GPT2Config

    fast = train_tokenizer(documents)
    directory = root / "model"
    fast.save_pretrained(directory)
    config = GPT2Config(
        vocab_size=len(fast), n_embd=256, n_layer=4, n_head=4, n_positions=512, pad_token_id=fast.pad_token_id
    )
    config.architectures = ["GPT2LMHeadModel"]
    config.save_pretrained(directory)
    return directory


def search_winner(root: Path, model_dir: Path, data: Path, seq_len: int, trials: int) -> TrialConfig:
    """Run ``autotune search`` over the levers space and return the exported winner's knobs."""
    space = root / "levers.yaml"
    space.write_text(LEVERS_SPACE)
    storage = f"sqlite:///{root / 'levers.db'}"
    command = [
        sys.executable,
        "-m",
        "autotune",
        "search",
        "--model",
        str(model_dir),
        "--dataset",
        str(data),
        "--seq-len",
        str(seq_len),
        "--space",
        str(space),
        "--storage",
        storage,
        "--study-name",
        "levers",
        "--trials",
        str(trials),
        "--work-dir",
        str(root / "search"),
        "--device",
        "cpu",
    ]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    print(done.stdout[-4000:])
    if done.returncode != 0:
        raise SystemExit(f"autotune search failed ({done.returncode}):\n{done.stderr[-3000:]}")
    from autotune.storage import load_study
    from autotune.views.export import winner

    return winner(load_study(storage, "levers")).config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument("--trials", type=int, default=8, help="Trials of the levers search.")
    parser.add_argument("--rounds", type=int, default=2, help="Interleaved repetitions of every variant.")
    options = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-realdata-"))
    documents = generated_documents(options.documents, word_counts=lognormal_words)
    model_dir = make_decoder_dir(root, documents)
    data_path = root / "train.jsonl"
    data_path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    model = resolve_model(str(model_dir))
    settings = MeasureSettings(warmup_steps=3, min_steps=8, max_steps=20, max_seconds=20.0)
    data = prepare_dataset(str(data_path), model, options.seq_len, 8, settings.total_steps_cap, str(root / "cache"))
    lengths = token_lengths(model_dir, documents[:1000], options.seq_len)
    print(
        f"model {model.num_params / 1e6:.1f} M params (GPT-2, 4 layers, h=256; 8k BPE trained here), seq len {options.seq_len}; "
        f"{options.documents} documents, tokens per document (first 1000, truncated to {options.seq_len}): median "
        f"{statistics.median(lengths):.0f}, mean {statistics.fmean(lengths):.0f}, {sum(n >= options.seq_len for n in lengths) / len(lengths):.0%} "
        f"truncated; padding to {options.seq_len} wastes {1 - statistics.fmean(lengths) / options.seq_len:.0%} of the token slots"
    )
    print(load_average())

    best = search_winner(root, model_dir, data_path, options.seq_len, options.trials)
    print(f"autotune's winner: {best.short()}")
    default = TrialConfig(micro_batch=8, pin_memory=False)
    variants = {
        "HF default (pad to seq len)": default,
        f"autotune winner ({best.short()})": dataclasses.replace(best, pin_memory=False),
        "longest": dataclasses.replace(default, padding="longest"),
        "longest + group_by_length": dataclasses.replace(default, padding="longest", sampling="group_by_length"),
        "padding_free": dataclasses.replace(default, padding="padding_free"),
    }
    figures: dict[str, dict[str, list[float]]] = {name: {"samples": [], "real": []} for name in variants}
    for round_number in range(options.rounds):
        for index, (name, config) in enumerate(variants.items()):
            job = TrialJob(
                workload=Workload.for_model(
                    model, seq_len=options.seq_len, ceiling_bytes=16 * 1024**3, measure=settings, dataset=data
                ),
                config=config,
                work_dir=str(root / f"v{index}-{round_number}"),
            )
            result = run_isolated(job, 900)
            if result.status != "ok":
                raise SystemExit(f"{name} failed: {result.status} {result.error}")
            figures[name]["samples"].append(result.samples_per_s)
            figures[name]["real"].append(result.real_tokens_per_s)
            print(
                f"  round {round_number} {name:<48} {result.samples_per_s:7.1f} samples/s {result.real_tokens_per_s:8.0f} real tokens/s"
            )
    base = statistics.median(figures["HF default (pad to seq len)"]["real"])
    print(f"\nmedian over {options.rounds} rounds (interleaved, one run):")
    print(f"  {'variant':<56} {'samples/s':>10} {'real tokens/s':>14} {'vs default':>10}")
    for name, values in figures.items():
        real = statistics.median(values["real"])
        print(f"  {name:<56} {statistics.median(values['samples']):10.1f} {real:14.0f} {real / base:9.2f}x")
    print(load_average())


def token_lengths(model_dir: Path, documents: list[str], seq_len: int) -> list[int]:
    """Tokens per document with the model's tokenizer, truncated to ``seq_len``."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return [min(len(ids), seq_len) for ids in tokenizer(documents)["input_ids"]]


if __name__ == "__main__":
    main()
