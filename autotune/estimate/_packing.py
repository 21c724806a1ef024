"""What TRL's bfd packing makes of the user's rows: how full a packed row is, and how many samples it holds.

``SFTConfig(packing=True, packing_strategy="bfd")`` packs the tokenized rows with ``datasets.map(batched=True)``
and no batch size of its own, so datasets' default of 1,000 rows a batch: within each batch every row is
truncated to ``max_length`` and placed, longest first, into the open row with the least room that holds it,
or a new one (best fit decreasing: trl/data_utils.py ``pack_dataset`` and ``_pack_bfd``, TRL 1.16). A row is
full only where short samples fill it: samples of 1,200 tokens at ``max_length`` 2,048 pack one to a row, and a
dataset of 8 samples of 100 tokens makes one row of 800, which the trial's batches repeat.
"""

from __future__ import annotations

import bisect
import functools

# datasets.Dataset.map's default ``batch_size`` (TRL's pack_dataset passes none): bins never span two batches.
MAP_BATCH_ROWS = 1000


@functools.lru_cache(maxsize=16)
def bfd_rows(lengths: tuple[int, ...], seq_len: int) -> tuple[float, float]:
    """The mean tokens of a packed row and the mean samples in it, of rows ``lengths`` tokens long (in the
    dataset's order) packed best fit decreasing into rows of at most ``seq_len`` tokens."""
    fills: list[int] = []
    counts: list[int] = []
    for start in range(0, len(lengths), MAP_BATCH_ROWS):
        batch = sorted((min(n, seq_len) for n in lengths[start : start + MAP_BATCH_ROWS] if n > 0), reverse=True)
        room: list[tuple[int, int]] = []  # (free tokens, row index) of the rows with room left, ascending
        for n in batch:
            at = bisect.bisect_left(room, (n, -1))
            if at < len(room):
                _, row = room.pop(at)
            else:
                row = len(fills)
                fills.append(0)
                counts.append(0)
            fills[row] += n
            counts[row] += 1
            if fills[row] < seq_len:
                bisect.insort(room, (seq_len - fills[row], row))
    if not fills:
        return float(seq_len), 1.0
    return sum(fills) / len(fills), sum(counts) / len(counts)
