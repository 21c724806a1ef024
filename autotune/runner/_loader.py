"""The trial child's dataset: synthetic tokens, or ``--dataset``'s prepared copy loaded, and its fullest batch.

The parent prepares the data once (``autotune.spec.dataset.prepare_dataset``); each trial child loads it here,
and the trial's batching (``autotune.levers.Batching``, chosen by its levers) shapes its batches.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.levers import Batching
from autotune.spec.dataset import PreparedDataset
from autotune.spec.models import NO_MODEL_CODE, ModelSpec


class SyntheticTokens(torch.utils.data.Dataset):
    """Random token ids at a fixed length, as the HF single-GPU performance guide measures.

    A small pool of sequences is drawn once and cycled, so data generation costs nothing that a
    real tokenized dataset would not.
    """

    def __init__(self, vocab_size: int, seq_len: int, task: str, length: int, pool: int = 64) -> None:
        generator = torch.Generator().manual_seed(0)
        self._ids = torch.randint(0, vocab_size, (pool, seq_len), generator=generator)
        self._task = task
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids = self._ids[index % len(self._ids)]
        sample = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if self._task == "sequence-classification":
            sample["labels"] = torch.tensor(index % 2)
        else:
            sample["labels"] = ids  # causal LM shifts inside the model; MLM predicts every token
        return sample


def load_training_dataset(
    prepared: PreparedDataset, model: ModelSpec, seq_len: int, pad_to_length: bool = True
) -> torch.utils.data.Dataset:
    """The trial child's dataset: the prepared Arrow copy, memory-mapped, tokenized on access.

    Without ``pad_to_length`` (``Batching.pads_samples``) samples keep their own length (truncated to
    ``seq_len``), and the batching's collator shapes the batch.
    """
    import datasets

    rows = datasets.load_from_disk(prepared.prepared_dir)
    tokenizer = None
    if prepared.tokenizer_dir:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(prepared.tokenizer_dir, local_files_only=True, **NO_MODEL_CODE)
    return UserSamples(
        rows=rows,
        column=prepared.column,
        tokenizer=tokenizer,
        seq_len=seq_len,
        task=model.task,
        pad_token_id=prepared.pad_token_id,
        length=prepared.length,
        pad_to_length=pad_to_length,
    )


def worst_case_batch(
    dataset: UserSamples, samples: int, batching: Batching, collator: Any
) -> tuple[dict[str, torch.Tensor], str]:
    """The fullest micro-batch of ``samples`` samples the trial's data can produce, and its words for the result.

    Where batches vary (padded to their longest sample, or flattened), a batch is as long as its
    longest sample or as its samples together, so the worst batch holds the ``samples`` longest
    samples (truncated to ``--seq-len``); the measured steps may never meet it (a random order, or
    ``group_by_length``), though a real run does. This is the shape the estimate predicts from
    (``Batching.fullest``). Built by the trial's own collator.
    """
    lengths = dataset.sample_lengths()
    longest = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:samples]
    batch = collator([dataset[i] for i in longest])
    rows, tokens = batch["input_ids"].shape
    return batch, f"worst-case batch: the {len(longest)} longest samples {batching.words}, {rows} x {tokens} tokens"


class UserSamples(torch.utils.data.Dataset):
    """Samples of the user's data, each exactly ``seq_len`` tokens, cycled to ``length``.

    A plain torch Dataset (not a ``datasets.Dataset``), so the Trainer does not drop the text column
    before it is tokenized.
    """

    def __init__(
        self,
        rows: Any,
        column: str,
        tokenizer: Any,
        seq_len: int,
        task: str,
        pad_token_id: int,
        length: int,
        pad_to_length: bool = True,
    ) -> None:
        self._rows = rows
        self._pad_to_length = pad_to_length
        self._column = column
        self._tokenizer = tokenizer
        self._seq_len = seq_len
        self._task = task
        self._pad_token_id = pad_token_id
        self._length = length

    def __len__(self) -> int:
        return self._length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self._length:
            # The end of the sequence protocol: LengthGroupedSampler (transformers/trainer_pt_utils.py)
            # iterates ``for feature in dataset`` to measure every sample.
            raise IndexError(index)
        value = self._rows[index % self._rows.num_rows][self._column]
        if self._tokenizer is not None:
            ids = self._tokenizer(value, truncation=True, max_length=self._seq_len)["input_ids"]
        else:
            ids = value[: self._seq_len]
        real = len(ids)
        if not self._pad_to_length:
            return self._unpadded(torch.tensor(ids, dtype=torch.long), index)
        input_ids = torch.full((self._seq_len,), self._pad_token_id, dtype=torch.long)
        input_ids[:real] = torch.tensor(ids, dtype=torch.long)
        attention_mask = torch.zeros(self._seq_len, dtype=torch.long)
        attention_mask[:real] = 1
        sample = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self._task == "sequence-classification":
            sample["labels"] = torch.tensor(index % 2)
        else:
            labels = input_ids.clone()
            labels[real:] = -100  # the loss ignores padding
            sample["labels"] = labels
        return sample

    def sample_lengths(self) -> list[int]:
        """The token length of each distinct sample (as :meth:`__getitem__` truncates it), index order."""
        count = min(self._rows.num_rows, self._length)
        values = list(self._rows.select(range(count))[self._column])  # datasets 4 returns a lazy Column
        if self._tokenizer is None:
            return [min(len(ids), self._seq_len) for ids in values]
        encoded = self._tokenizer(values, truncation=True, max_length=self._seq_len)["input_ids"]
        return [len(ids) for ids in encoded]

    def _unpadded(self, input_ids: torch.Tensor, index: int) -> dict[str, torch.Tensor]:
        """A sample at its own length, for a collator that pads or flattens the batch."""
        labels = torch.tensor(index % 2) if self._task == "sequence-classification" else input_ids.clone()
        return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
