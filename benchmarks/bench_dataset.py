"""Your own data (--dataset): what the data pipeline costs a trial, and what dataloader workers buy back.

Builds a local model directory (a bert-mini-shaped config and a byte-level BPE tokenizer trained here
on a generated corpus: no download) and a JSONL file of documents longer than --seq-len, then
measures, side by side and interleaved in one run, each in a fresh trial child through the real
runner (autotune.runner.run_isolated), steady-state samples/s of:

  synthetic     random token ids (the default; loads nothing)
  text w0       --dataset, tokenized on the fly in the DataLoader, dataloader_workers 0
  text w2       the same, dataloader_workers 2
  packed w0     --dataset --packing: tokenized once in the parent, trials read blocks

and, with synthetic data, gradient accumulation 1 vs 4 at one micro-batch (what the optimizer step
costs per sample). It also times what a trial child spends loading the prepared dataset.

    python -m benchmarks.bench_dataset --seq-len 128 --micro-batch 32 --rounds 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from autotune.levers import TrialConfig
from autotune.runner import TrialJob, Workload, run_isolated
from autotune.runner._loader import load_training_dataset
from autotune.spec.dataset import PreparedDataset, prepare_dataset
from autotune.spec.measure import MeasureSettings
from autotune.spec.models import resolve_model
from benchmarks._common import load_average


def make_model_dir(root: Path, documents: list[str]) -> Path:
    """A bert-mini-shaped config (4 layers, h=256) and an 8k byte-level BPE tokenizer trained on ``documents``."""
    from transformers import BertConfig

    fast = train_tokenizer(documents)
    directory = root / "model"
    fast.save_pretrained(directory)
    BertConfig(
        vocab_size=len(fast),
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
        pad_token_id=fast.pad_token_id,
    ).save_pretrained(directory)
    return directory


def train_tokenizer(documents: list[str]):
    """An 8k byte-level BPE tokenizer trained on ``documents`` with the ``tokenizers`` library (no download)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    tokenizer.train_from_iterator(documents, trainers.BpeTrainer(vocab_size=8000, special_tokens=specials))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")), ("[SEP]", tokenizer.token_to_id("[SEP]"))],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    )


def generated_documents(count: int, seed: int = 0, word_counts=None) -> list[str]:
    """Documents drawn from a Zipf-like vocabulary of made-up words; ``word_counts(rng)`` draws each
    document's length (default: uniform 150-600 words)."""
    rng = random.Random(seed)
    syllables = ["ka", "to", "ri", "mon", "el", "sa", "dun", "pre", "ix", "lo", "ver", "ab", "qu", "ne", "st"]
    vocabulary = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(5000)]
    weights = [1 / (rank + 1) for rank in range(len(vocabulary))]
    documents = []
    for _ in range(count):
        length = word_counts(rng) if word_counts is not None else rng.randint(150, 600)
        words = rng.choices(vocabulary, weights, k=length)
        documents.append(" ".join(words).capitalize() + ".")
    return documents


def data_side_batches_per_s(dataset, batch_size: int, workers: int, batches: int = 40) -> float:
    """Batches per second the DataLoader alone delivers (tokenization, padding, collation)."""
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
    iterator = iter(loader)
    next(iterator)  # worker start-up is not the steady state
    started = time.perf_counter()
    for _ in range(batches):
        next(iterator)
    return batches / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--documents", type=int, default=3000)
    parser.add_argument(
        "--rounds", type=int, default=2, help="Interleaved repetitions of every trial variant (0: data side only)."
    )
    options = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-dataset-"))
    documents = generated_documents(options.documents)
    model_dir = make_model_dir(root, documents)
    data_path = root / "train.jsonl"
    data_path.write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    model = resolve_model(str(model_dir))
    settings = MeasureSettings(warmup_steps=3, min_steps=8, max_steps=20, max_seconds=20.0)
    steps = settings.total_steps_cap

    started = time.perf_counter()
    text = prepare_dataset(str(data_path), model, options.seq_len, options.micro_batch * 4, steps, str(root / "cache"))
    text_prepare_s = time.perf_counter() - started
    started = time.perf_counter()
    packed = prepare_dataset(
        str(data_path), model, options.seq_len, options.micro_batch * 4, steps, str(root / "cache"), packing=True
    )
    packed_prepare_s = time.perf_counter() - started
    started = time.perf_counter()
    dataset = load_training_dataset(text, model, options.seq_len)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    for index in range(512):
        dataset[index]
    per_sample_ms = (time.perf_counter() - started) / 512 * 1000
    batches_per_s = {workers: data_side_batches_per_s(dataset, options.micro_batch, workers) for workers in (0, 2)}

    base = TrialJob(
        workload=Workload.for_model(model, seq_len=options.seq_len, ceiling_bytes=16 * 1024**3, measure=settings),
        config=TrialConfig(micro_batch=options.micro_batch),
        work_dir=str(root / "trial"),
    )

    def trained_on(data: PreparedDataset, **config_changes: int) -> TrialJob:
        """``base`` on ``data`` (the dataset is the workload's, shared by every trial of a search)."""
        workload = dataclasses.replace(base.workload, dataset=data)
        return dataclasses.replace(base, workload=workload, config=dataclasses.replace(base.config, **config_changes))

    variants = {
        "synthetic": base,
        "text w0": trained_on(text),
        "text w2": trained_on(text, dataloader_workers=2),
        "packed w0": trained_on(packed),
        f"synthetic mb{options.micro_batch // 4} ga1": dataclasses.replace(
            base, config=TrialConfig(micro_batch=options.micro_batch // 4)
        ),
        f"synthetic mb{options.micro_batch // 4} ga4": dataclasses.replace(
            base, config=TrialConfig(micro_batch=options.micro_batch // 4, grad_accum=4)
        ),
    }
    print(
        f"model {model.num_params / 1e6:.1f} M params (bert-mini shape, 8k BPE), seq len {options.seq_len}, micro-batch {options.micro_batch}"
    )
    print(
        f"parent: prepare (text, read + copy) {text_prepare_s:.2f} s; prepare (packing, tokenized until a trial has enough blocks) {packed_prepare_s:.2f} s "
        f"for {options.documents} documents; {packed.num_samples} packed blocks"
    )
    print(
        f"child: load the prepared dataset {load_s * 1000:.0f} ms; tokenize one sample on the fly {per_sample_ms:.2f} ms"
    )
    print(
        f"data side alone (DataLoader, no model): {batches_per_s[0]:.1f} batches/s with 0 workers, {batches_per_s[2]:.1f} "
        f"with 2 workers ({batches_per_s[2] / batches_per_s[0]:.2f}x); a step slower than 1/{batches_per_s[0]:.1f} s "
        "hides tokenization behind workers"
    )
    print(load_average())
    if options.rounds == 0:
        return
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for round_number in range(options.rounds):
        for name, job in variants.items():
            result = run_isolated(
                dataclasses.replace(job, work_dir=str(root / f"{name.replace(' ', '-')}-{round_number}")), 900
            )
            if result.status != "ok":
                raise SystemExit(f"{name} failed: {result.status} {result.error}")
            samples[name].append(result.samples_per_s)
            print(
                f"  round {round_number} {name:<22} {result.samples_per_s:8.1f} samples/s (step CV {result.step_time_cv:.1%})"
            )
    median = {name: statistics.median(values) for name, values in samples.items()}
    print("\nmedian samples/s over the rounds, and ratios measured in this run:")
    for name, value in median.items():
        print(f"  {name:<22} {value:8.1f}")
    print(
        f"  text w0 / synthetic      {median['text w0'] / median['synthetic']:.2f}x  (what on-the-fly tokenization costs)"
    )
    print(
        f"  text w2 / text w0        {median['text w2'] / median['text w0']:.2f}x  (what 2 dataloader workers buy back)"
    )
    print(f"  packed w0 / text w0      {median['packed w0'] / median['text w0']:.2f}x")
    small = options.micro_batch // 4
    print(
        f"  mb{small} ga4 / mb{small} ga1        {median[f'synthetic mb{small} ga4'] / median[f'synthetic mb{small} ga1']:.2f}x  (the optimizer step amortised)"
    )
    print(load_average())


if __name__ == "__main__":
    main()
