"""The trial body: what the child runs around ``Trainer.train()``."""

from __future__ import annotations

import gc


def test_the_start_collection_skips_the_heap_and_every_step_runs_thawed(bert_tiny, tmp_path):
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from autotune.models import build_model
    from autotune.runner._trial import SyntheticTokens, train_skipping_the_start_collection

    trainer = Trainer(
        model=build_model(bert_tiny.config, bert_tiny.task),
        args=TrainingArguments(
            output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, report_to="none",
            save_strategy="no", disable_tqdm=True, use_cpu=True,
        ),
        train_dataset=SyntheticTokens(bert_tiny.vocab_size, 16, bert_tiny.task, length=16),
    )
    frozen_objects: dict[str, int] = {}
    free_memory = trainer.accelerator.free_memory

    def free_memory_watched(*objects):  # noqa: ANN002, ANN202 - accelerate's signature
        frozen_objects["at_the_start_collection"] = gc.get_freeze_count()
        return free_memory(*objects)

    class AtEveryStep(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):  # noqa: ANN001
            frozen_objects[f"at_step_{state.global_step}"] = gc.get_freeze_count()

    trainer.accelerator.free_memory = free_memory_watched
    trainer.add_callback(AtEveryStep())
    train_skipping_the_start_collection(trainer)

    # The heap torch and transformers built (far more than the model's few dozen tensors) was hidden
    # from accelerate's gc.collect, and back in the collector's hands before the first step.
    assert frozen_objects["at_the_start_collection"] > 50_000
    assert frozen_objects["at_step_0"] == 0 and frozen_objects["at_step_1"] == 0
    assert gc.get_freeze_count() == 0


def test_a_failure_before_training_begins_leaves_nothing_frozen(bert_tiny, tmp_path):
    import pytest
    from transformers import Trainer, TrainingArguments

    from autotune.models import build_model
    from autotune.runner._trial import train_skipping_the_start_collection

    trainer = Trainer(
        model=build_model(bert_tiny.config, bert_tiny.task),
        args=TrainingArguments(output_dir=str(tmp_path), max_steps=2, report_to="none", use_cpu=True),
        train_dataset=None,  # Trainer.train refuses to start without one
    )
    with pytest.raises(ValueError):
        train_skipping_the_start_collection(trainer)
    assert gc.get_freeze_count() == 0
