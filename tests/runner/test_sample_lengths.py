"""The samples a step trains on, read from the batches as the collators emit them
(autotune/runner/_sample_lengths.py): count, tokens and sum s_i^2 for padded, flattened and packed rows."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from autotune.runner._sample_lengths import SampleLengths, count  # noqa: E402 - after the importorskip above

LENGTHS = (37, 11, 64, 23)


def rows() -> list[list[int]]:
    return [list(range(5, 5 + n)) for n in LENGTHS]


def trl_batch(padding_free: bool, packed: bool = False) -> dict:
    import datasets
    from trl import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    dataset = datasets.Dataset.from_dict({"input_ids": rows()})
    if packed:
        dataset = pack_dataset(dataset, seq_length=80, strategy="bfd")  # rows of several samples each
    collator = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=padding_free)
    return collator([dataset[i] for i in range(len(dataset))])


@pytest.mark.parametrize(
    "batch",
    [
        lambda: trl_batch(padding_free=False),  # padded to the longest: an attention mask
        lambda: trl_batch(padding_free=True),  # flattened: position ids restarting, no mask
        lambda: trl_batch(padding_free=True, packed=True),  # bfd rows of several samples, flattened
    ],
    ids=["padded", "padding_free", "bfd"],
)
def test_each_sample_counts_over_its_own_length_whatever_its_row(batch):
    made = batch()
    assert count(made).tolist() == [len(LENGTHS), sum(LENGTHS), sum(n * n for n in LENGTHS)]


def test_full_rows_without_mask_or_positions_are_one_sample_each():
    assert count({"input_ids": torch.zeros(3, 16, dtype=torch.long)}).tolist() == [3, 48, 3 * 256]


def test_the_steps_are_summed_and_a_context_read_for_the_measured_ones():
    class Batches:  # the Trainer's get_batch_samples contract: (micro-batches of one step, items)
        def __init__(self) -> None:
            self.steps = [[trl_batch(padding_free=True)], [trl_batch(False), trl_batch(False)]]

        def get_batch_samples(self, *args, **kwargs):
            return self.steps.pop(0), None

    trainer = Batches()
    lengths = SampleLengths()
    lengths.attach(trainer)
    assert trainer.get_batch_samples()[0][0]["input_ids"].shape == (1, sum(LENGTHS))  # handed on unchanged
    trainer.get_batch_samples()
    squares = sum(n * n for n in LENGTHS)
    assert lengths.totals([2]) == (8, 2 * sum(LENGTHS), 2 * squares)
    assert lengths.context([1, 2]) == pytest.approx(squares / sum(LENGTHS))
    assert lengths.context([3]) is None  # a step never recorded
