"""The samples a trial's optimizer steps train on, counted and by length, read from what its collator emits.

Model FLOPs count the attention term per sample: a sample of ``s`` tokens attends over ``s``
positions, whatever row it sits in (padded to its batch's longest, or flattened and packed beside
others), so a step's attention work is ``sum s_i^2`` over its samples (``autotune.spec.flops``). The
lengths are read from the batches the Trainer trains on, as the collator built them:

* an attention mask (padded rows): each row's ones are one sample;
* position ids without a mask (TRL's padding-free and packed rows, ``DataCollatorWithFlattening``):
  they restart at 0 for each sample, and ``sum over tokens of (2 p + 1)`` is ``sum s_i^2``, since
  ``1 + 3 + ... + (2s - 1) = s^2``; no device-to-host copy is needed to find the boundaries;
* neither (synthetic rows): every row is one sample of its full length.

The count of samples is what samples/s means under TRL's packing, where a row holds several
(``runner._trial``): so it ranks like tokens/s whatever the batching. Everything stays on the device
until it is read after a step or after training: the measured steps wait for nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def count(batch: dict[str, Any]) -> torch.Tensor:
    """``[samples, tokens, sum of squared sample lengths]`` of one micro-batch (int64, on its device)."""
    input_ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    if mask is not None and mask.dim() == 2:
        lengths = mask.sum(dim=-1, dtype=torch.int64)
        return torch.stack([(lengths > 0).sum(), lengths.sum(), (lengths * lengths).sum()])
    positions = batch.get("position_ids")
    if positions is not None:
        positions = positions.to(torch.int64)
        tokens = torch.tensor(positions.numel(), dtype=torch.int64, device=positions.device)
        return torch.stack([(positions == 0).sum(), tokens, (2 * positions + 1).sum()])
    rows, row_tokens = input_ids.shape
    return torch.tensor([rows, rows * row_tokens, rows * row_tokens**2], dtype=torch.int64, device=input_ids.device)


class SampleLengths:
    """Per optimizer step, the samples, real tokens and ``sum s_i^2`` of the micro-batches the Trainer trains on.

    It wraps the trainer's ``get_batch_samples`` (transformers/trainer.py, called once per optimizer
    step with that step's micro-batches, in the training process), records, and hands the batches on
    unchanged: the batches, the model and the step are the user's.
    """

    def __init__(self) -> None:
        self._per_step: list[torch.Tensor] = []  # one [samples, tokens, squares] per optimizer step, from global step 1

    def attach(self, trainer: Any) -> None:
        fetch = trainer.get_batch_samples

        def get_batch_samples(*args: Any, **kwargs: Any) -> Any:
            batch_samples, num_items_in_batch = fetch(*args, **kwargs)
            if batch_samples:
                self._per_step.append(torch.stack([count(batch) for batch in batch_samples]).sum(dim=0))
            return batch_samples, num_items_in_batch

        trainer.get_batch_samples = get_batch_samples

    def totals(self, steps: Sequence[int]) -> tuple[int, int, int]:
        """Samples, tokens and ``sum s_i^2`` over the global steps ``steps`` (those recorded)."""
        chosen = [self._per_step[step - 1] for step in steps if 0 < step <= len(self._per_step)]
        if not chosen:
            return 0, 0, 0
        samples, tokens, squares = torch.stack(chosen).sum(dim=0).tolist()
        return int(samples), int(tokens), int(squares)

    def context(self, steps: Sequence[int]) -> float | None:
        """``sum s_i^2 / sum s_i`` over the global steps ``steps``: the mean context a token attends
        over, weighted by tokens (``None``: none of those steps was recorded)."""
        _, tokens, squares = self.totals(steps)
        return squares / tokens if tokens else None
