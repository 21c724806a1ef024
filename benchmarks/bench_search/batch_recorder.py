"""The side by side's callback, in a module of its own: trial children import it by name
(``bench_search.batch_recorder:TrainBatchSizeRecorder``), so it imports nothing the child does not
load already; the child's address space is what ``auto_find_batch_size`` is measured against."""

from __future__ import annotations

from pathlib import Path

from transformers import TrainerCallback

BATCH_FILE = "train_batch_size"


class TrainBatchSizeRecorder(TrainerCallback):
    """Writes the Trainer's actual per-device batch size (``auto_find_batch_size`` shrinks it) to the
    trial's output dir."""

    def on_step_end(self, args, state, control, **kwargs):
        Path(args.output_dir, BATCH_FILE).write_text(str(state.train_batch_size))
