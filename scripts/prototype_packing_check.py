"""Do packed samples stay apart? Per-sample losses of a packed row against the same samples alone.

A prototype for issue 27 ("Samples must stay apart"), not a test yet: for each decoder and
attention implementation it computes the per-sample next-token loss of a few samples of different
lengths

* alone: each sample its own forward pass (batch 1, no padding): the reference;
* padded: the samples right-padded into one batch with an attention mask;
* packed: the samples packed into one row exactly as TRL does it: ``trl.pack_dataset`` with the
  ``bfd`` strategy (the ``seq_lengths`` column), then TRL's padding-free collator
  (``trl.trainer.sft_trainer.DataCollatorForLanguageModeling(padding_free=True)``), which emits
  ``position_ids`` restarting at 0 for each sample, no attention mask, and ``cu_seq_lens_q/k``;

and three broken packings that let samples attend across their boundary:

* ``positions_not_reset``: position ids run on across the row (0..T-1), as a packed row without
  position ids gets them (``modeling_llama.py``: ``position_ids = torch.arange(...)``). This is what
  TRL's ``wrapped`` packing trains on by design: its rows carry no ``seq_lengths``, so its collator
  emits an all-ones attention mask and no position ids (and it also cuts samples mid-way);
* ``with_attention_mask``: position ids reset, but an all-ones attention mask is passed too;
  transformers detects packing only when the 2D mask is None (``masking_utils.py``,
  ``_preprocess_mask_arguments``: ``if position_ids is not None and attention_mask is None and cache is None``);
* ``with_cache``: position ids reset, but ``use_cache=True`` (the configs' own default), so the model
  builds a ``DynamicCache`` and packing detection is skipped for the same reason. The Trainer sets
  ``model.config.use_cache = args.use_cache`` (False) at init (``trainer.py``, "11. Finalize") and
  TRL's ``compute_loss`` passes ``use_cache=False``, so this only bites a caller outside them.

Run: ``python scripts/prototype_packing_check.py [--dtype fp32|bf16]``. It prints one table row per
model x attention implementation x batch form, and exits 1 if a correct packing does not match or a
broken packing does.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import torch

# Sample lengths: distinct (to find each sample in the packed row, which bfd reorders longest first),
# none a multiple of another, the longest several times the shortest.
SAMPLE_LENGTHS = (37, 11, 64, 23)
# The random-init models are made more context-sensitive with a larger init scale. At the configs'
# 0.02 a leak across samples moves a per-sample loss by 0.05-0.08 nats (measured, fp32), close to a
# bf16 tolerance; at 0.2 by 0.8-1.5 nats, far outside it, while a correct packing stays within 1e-5
# (fp32) / 1e-2 (bf16).
INIT_RANGE = 0.2
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2}
IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")


@dataclasses.dataclass(frozen=True)
class Row:
    model: str
    attn: str
    form: str
    max_abs_diff: float  # largest |per-sample loss - alone| over the samples
    should_match: bool

    def ok(self, tolerance: float) -> bool:
        return (self.max_abs_diff <= tolerance) == self.should_match


def decoder_configs(init_range: float = INIT_RANGE) -> dict[str, Any]:
    """llama-tiny from the catalog, and a Qwen2 config scaled down the same way."""
    from transformers import AutoConfig

    from autotune.spec.model_catalog import catalog_config

    llama = catalog_config("llama-tiny")
    qwen_values = {k: v for k, v in _qwen_entry().items() if not k.startswith("_autotune")}
    qwen_values.update(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=4096,
        max_window_layers=4,
        bos_token_id=1,
        eos_token_id=2,
    )
    qwen = AutoConfig.for_model(**qwen_values)
    for config in (llama, qwen):
        config.initializer_range = init_range
        config.use_cache = False
    return {"llama-tiny": llama, "qwen2-tiny": qwen}


def _qwen_entry() -> dict[str, Any]:
    from autotune.spec.model_catalog import catalog_entry

    return catalog_entry("qwen2.5-0.5b")


def build(config: Any, attn: str, dtype: str) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    torch_dtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn, dtype=torch_dtype)
    return model.eval()


def make_samples(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randint(5, vocab_size, (n,), generator=generator).tolist() for n in SAMPLE_LENGTHS]


def token_nll(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position next-token NLL of one row ([T-1]); 0 where the label is -100."""
    shifted = labels[1:]
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), shifted.clamp(min=0), reduction="none")
    return nll.masked_fill(shifted == -100, 0.0)


def alone_losses(model: torch.nn.Module, samples: list[list[int]]) -> list[float]:
    losses = []
    for ids in samples:
        tensor = torch.tensor([ids])
        logits = model(input_ids=tensor, use_cache=False).logits[0]
        losses.append(float(token_nll(logits, tensor[0]).sum() / (len(ids) - 1)))
    return losses


def padded_losses(model: torch.nn.Module, samples: list[list[int]]) -> list[float]:
    longest = max(len(s) for s in samples)
    input_ids = torch.zeros(len(samples), longest, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    labels = torch.full_like(input_ids, -100)
    for row, ids in enumerate(samples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        mask[row, : len(ids)] = 1
        labels[row, : len(ids)] = torch.tensor(ids)
    logits = model(input_ids=input_ids, attention_mask=mask, use_cache=False).logits
    return [float(token_nll(logits[row], labels[row]).sum() / (len(ids) - 1)) for row, ids in enumerate(samples)]


def trl_packed_batch(samples: list[list[int]]) -> dict[str, Any]:
    """One row as TRL's bfd packing and padding-free collator build it (sft_trainer.py, data_utils.py)."""
    import datasets
    from datasets import Dataset
    from trl import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    datasets.disable_progress_bars()
    rows = Dataset.from_dict({"input_ids": samples, "labels": samples})
    packed = pack_dataset(rows, seq_length=sum(len(s) for s in samples), strategy="bfd")
    assert len(packed) == 1, "every sample fits one row"
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    return collator([packed[0]])


def packed_losses(
    model: torch.nn.Module, samples: list[list[int]], batch: dict[str, Any], **overrides: Any
) -> list[float]:
    """Per-sample losses of a packed row, in the order of ``samples``."""
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    inputs.update(overrides)
    inputs.setdefault("use_cache", False)
    logits = model(**inputs).logits[0]
    nll = token_nll(logits, batch["labels"][0])
    row = batch["input_ids"][0].tolist()
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [len(row)]
    by_content = {}
    for start, end in zip(starts[:-1], starts[1:]):
        # nll[t] scores token t+1: a sample's own tokens 1..n-1 are scored at start..end-2
        by_content[tuple(row[start:end])] = float(nll[start : end - 1].sum() / (end - start - 1))
    return [by_content[tuple(ids)] for ids in samples]


def check(model_name: str, config: Any, attn: str, dtype: str) -> list[Row]:
    model = build(config, attn, dtype)
    samples = make_samples(config.vocab_size)
    batch = trl_packed_batch(samples)
    total = batch["input_ids"].shape[1]
    forms: dict[str, tuple[Callable[[], list[float]], bool]] = {
        "padded": (lambda: padded_losses(model, samples), True),
        "packed (TRL bfd)": (lambda: packed_losses(model, samples, batch), True),
        "broken: positions_not_reset": (
            lambda: packed_losses(model, samples, batch, position_ids=torch.arange(total)[None]),
            False,
        ),
        "broken: with_attention_mask": (
            lambda: packed_losses(model, samples, batch, attention_mask=torch.ones(1, total, dtype=torch.long)),
            False,
        ),
        "broken: with_cache": (lambda: packed_losses(model, samples, batch, use_cache=True), False),
    }
    with torch.no_grad():
        reference = alone_losses(model, samples)
        rows = []
        for form, (losses_of, should_match) in forms.items():
            losses = losses_of()
            diff = max(abs(a - b) for a, b in zip(losses, reference))
            rows.append(Row(model_name, attn, form, diff, should_match))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="fp32")
    parser.add_argument("--attn", choices=IMPLEMENTATIONS, action="append")
    parser.add_argument("--init-range", type=float, default=INIT_RANGE, help="the weights' init std (configs: 0.02)")
    args = parser.parse_args()
    tolerance = TOLERANCE[args.dtype]
    print(
        f"sample lengths {SAMPLE_LENGTHS}, weights {args.dtype}, tolerance {tolerance:g} (nats, per-sample mean loss)"
    )
    print(f"{'model':<11} {'attn':<15} {'batch form':<29} {'max |d loss|':>13}  expected  result")
    failed = False
    for model_name, config in decoder_configs(args.init_range).items():
        for attn in args.attn or IMPLEMENTATIONS:
            for row in check(model_name, config, attn, args.dtype):
                ok = row.ok(tolerance)
                failed |= not ok
                expected = "match" if row.should_match else "differ"
                print(
                    f"{row.model:<11} {row.attn:<15} {row.form:<29} {row.max_abs_diff:>13.3e}  {expected:<8}  {'ok' if ok else 'UNEXPECTED'}"
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
