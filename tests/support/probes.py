"""Probes, not faults: TrainerCallbacks a test hands a trial child (``Workload.callbacks``, by
``module:Class``) that write down what the child trained with, for the test to read back.

They live here, not in the test files that use them, so that collecting those files imports no
transformers (the child imports this module; the test only names it).
"""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

from transformers import TrainerCallback

LEVERS_FILE = "levers.json"
TRAINING_ARGUMENTS_FILE = "training_arguments.json"
CHILD_SETUP_FILE = "child_setup.json"
ADAPTERS_FILE = "adapters.json"
# The TrainingArguments RecordTrainingArguments writes (besides lr_scheduler_type).
RECORDED_ARGUMENTS = (
    "learning_rate",
    "warmup_steps",
    "weight_decay",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
)


class RecordLevers(TrainerCallback):
    """Writes ``<output_dir>/levers.json`` at the first step: the attention implementation the model
    was built with and the collator and sampler the Trainer batches with."""

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        collate = train_dataloader.collate_fn
        collate = getattr(collate, "data_collator", collate)  # inside transformers' RemoveColumnsCollator
        record = {
            "attn_implementation": model.config._attn_implementation,
            "collator": type(collate).__name__,
            # accelerate's prepared loader keeps the Trainer's sampler inside its batch sampler.
            # (accelerate swaps RandomSampler for its SeedableRandomSampler subclass: the classes it is).
            "sampler": [c.__name__ for c in type(getattr(train_dataloader.batch_sampler, "sampler", None)).__mro__],
        }
        (Path(args.output_dir) / LEVERS_FILE).write_text(json.dumps(record))
        return control


class RecordTrainingArguments(TrainerCallback):
    """Writes the arguments the real Trainer trains with (``RECORDED_ARGUMENTS``)."""

    def on_train_begin(self, args, state, control, **kwargs):
        recorded = {name: getattr(args, name) for name in RECORDED_ARGUMENTS}
        recorded["lr_scheduler_type"] = str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type))
        Path(args.output_dir, TRAINING_ARGUMENTS_FILE).write_text(json.dumps(recorded))
        return control


class RecordChildSetup(TrainerCallback):
    """Writes what the child's process looks like once training starts, and prints a line."""

    def on_train_begin(self, args, state, control, **kwargs):
        record = {
            "pid": os.getpid(),
            "sid": os.getsid(0),
            "pgid": os.getpgid(0),
            "start_method": multiprocessing.get_start_method(),
            "env": {
                name: os.environ.get(name)
                for name in ("CUDA_VISIBLE_DEVICES", "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
            },
        }
        Path(args.output_dir, CHILD_SETUP_FILE).write_text(json.dumps(record))
        print("printed by the trial child")


class RecordAdapters(TrainerCallback):
    """Writes ``<output_dir>/adapters.json`` when training starts: whether the model that trains is a
    ``PeftModel``, its adapters by name, and its trainable and total parameters."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from peft import PeftModel

        record = {
            "peft_model": isinstance(model, PeftModel),
            "adapters": sorted(getattr(model, "peft_config", {})),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in model.parameters()),
        }
        Path(args.output_dir, ADAPTERS_FILE).write_text(json.dumps(record))
        return control
