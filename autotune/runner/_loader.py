"""The trial child's side of ``--dataset``: the prepared copy loaded as a dataset, and its batches.

The parent prepares the data once (``autotune.spec.dataset.prepare_dataset``); each trial child loads it here
and shapes its batches as the trial's ``padding`` lever says.
"""

from __future__ import annotations

from typing import Any

import torch

from autotune.spec.dataset import PreparedDataset
from autotune.spec.models import NO_MODEL_CODE, ModelSpec

# Model types whose position ids start after the padding index (DataCollatorWithFlattening's docstring).
_POSITIONS_AFTER_PADDING = ("roberta", "xlm-roberta", "camembert", "mpnet", "esm")


def load_training_dataset(
    prepared: PreparedDataset, model: ModelSpec, seq_len: int, padding: str = "max_length"
) -> torch.utils.data.Dataset:
    """The trial child's dataset: the prepared Arrow copy, memory-mapped, tokenized on access.

    With ``padding`` other than ``max_length`` samples keep their own length (truncated to
    ``seq_len``), and :func:`training_collator` shapes the batch.
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
        pad_to_length=padding == "max_length",
    )


def training_collator(padding: str, pad_token_id: int, model: ModelSpec) -> Any:
    """The Trainer's ``data_collator`` for a ``padding`` choice; ``None`` keeps the Trainer's default.

    * ``max_length``: every sample is already ``--seq-len`` long (``default_data_collator`` stacks them).
    * ``longest``: :class:`PadToLongest`, the batch padded to its longest sample.
    * ``padding_free``: transformers' ``DataCollatorWithFlattening`` (transformers/data/data_collator.py):
      the batch as one row, ``position_ids`` restarting at each sample, the first label of each
      sample -100, no padding and no attention mask. RoBERTa-like models number positions from
      ``pad_token_id + 1`` (that class's docstring), so their position ids start there.
    """
    if padding == "longest":
        return PadToLongest(pad_token_id)
    if padding == "padding_free":
        from transformers import DataCollatorWithFlattening

        start = pad_token_id + 1 if model.config.get("model_type") in _POSITIONS_AFTER_PADDING else 0
        return DataCollatorWithFlattening(return_position_ids=True, separator_id=-100, position_ids_start=start)
    return None


def worst_case_batch(
    dataset: UserSamples, micro_batch: int, padding: str, collator: Any
) -> tuple[dict[str, torch.Tensor], str]:
    """The fullest micro-batch the trial's data can produce, and its words for the result.

    With ``padding`` longest a batch is as long as its longest sample, and with padding_free as long
    as its samples together, so the worst batch holds the ``micro_batch`` longest samples (truncated
    to ``--seq-len``); the measured steps may never meet it (a random order, or
    ``group_by_length``), though a real run does. This is the shape
    ``autotune.estimate.micro_batch_shape`` predicts from. Built by the trial's own collator.
    """
    lengths = dataset.sample_lengths()
    longest = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))[:micro_batch]
    batch = collator([dataset[i] for i in longest])
    rows, tokens = batch["input_ids"].shape
    how = "flattened into one row" if padding == "padding_free" else "padded to the longest"
    return batch, f"worst-case batch: the {len(longest)} longest samples {how}, {rows} x {tokens} tokens"


class PadToLongest:
    """Pads a batch of samples of different lengths to its longest one (pads ignored by the loss and the attention).

    A class (not a closure) so dataloader workers can pickle it.
    """

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, features: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        from torch.nn.utils.rnn import pad_sequence

        def padded(key: str, value: int) -> torch.Tensor:
            return pad_sequence([f[key] for f in features], batch_first=True, padding_value=value)

        batch = {"input_ids": padded("input_ids", self.pad_token_id), "attention_mask": padded("attention_mask", 0)}
        labels = [f["labels"] for f in features]
        batch["labels"] = torch.stack(labels) if labels[0].dim() == 0 else padded("labels", -100)
        return batch


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
