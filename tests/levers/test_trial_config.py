"""The one mapping from knobs to TrainingArguments, checked against the real TrainingArguments."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from autotune.levers import TrialConfig, training_arguments_kwargs
from autotune.levers.memory_savers import checkpointing_field

if TYPE_CHECKING:
    from transformers import TrainingArguments


def build(config: TrialConfig, device_kind: str = "cpu", base=None) -> TrainingArguments:
    from transformers import TrainingArguments

    return TrainingArguments(output_dir="unused", **training_arguments_kwargs(config, device_kind, base))


def test_every_knob_lands_in_training_arguments():
    config = TrialConfig(
        micro_batch=24,
        grad_accum=3,
        checkpointing=True,
        dtype="bf16",
        optim="adafactor",
        dataloader_workers=2,
        pin_memory=False,
    )
    args = build(config)
    assert args.per_device_train_batch_size == 24
    assert args.gradient_accumulation_steps == 3
    assert getattr(args, checkpointing_field()) is True
    assert args.bf16 is True and args.fp16 is False
    assert args.optim == "adafactor"
    assert args.dataloader_num_workers == 2 and args.dataloader_pin_memory is False
    assert args.use_cpu is True


@pytest.mark.parametrize("dtype, field", [("bf16", "bf16"), ("fp16", "fp16"), ("tf32", "tf32")])
def test_dtype_sets_exactly_its_flag(dtype, field):
    kwargs = training_arguments_kwargs(TrialConfig(dtype=dtype), "cuda")
    flags = {k for k in ("bf16", "fp16", "tf32") if kwargs.get(k)}
    assert flags == {field}
    assert "use_cpu" not in kwargs


def test_fp32_sets_no_precision_flag():
    kwargs = training_arguments_kwargs(TrialConfig(dtype="fp32"), "cuda")
    assert not any(kwargs.get(k) for k in ("bf16", "fp16", "tf32"))


def test_compile_backend():
    args = build(TrialConfig(compile="inductor"))
    assert args.torch_compile is True and args.torch_compile_backend == "inductor"
    assert "torch_compile" not in training_arguments_kwargs(TrialConfig(compile="off"), "cpu")


def test_base_args_are_kept_and_knobs_apply_on_top():
    kwargs = training_arguments_kwargs(TrialConfig(micro_batch=16), "cpu", {"learning_rate": 3e-4, "warmup_steps": 7})
    args = build(TrialConfig(micro_batch=16), base={"learning_rate": 3e-4, "warmup_steps": 7})
    assert kwargs["learning_rate"] == 3e-4
    assert (args.learning_rate, args.warmup_steps, args.per_device_train_batch_size) == (3e-4, 7, 16)


def test_params_round_trip():
    config = TrialConfig(micro_batch=48, grad_accum=2, dtype="bf16", compile="inductor")
    assert TrialConfig.from_params(config.to_params()) == config
    # Knobs a space does not search keep their defaults; unknown params are ignored.
    assert TrialConfig.from_params({"micro_batch": 8, "not_a_knob": 1}) == TrialConfig(micro_batch=8)


def test_the_mapping_writes_the_derived_pair():
    config = TrialConfig.from_params({"micro_batch": 16, "global_batch": 64, "dtype": "bf16"})
    assert (config.micro_batch, config.grad_accum, config.global_batch) == (16, 4, 64)
    kwargs = training_arguments_kwargs(config, "cpu")
    assert kwargs["per_device_train_batch_size"] * kwargs["gradient_accumulation_steps"] == 64


def test_the_levers_that_change_a_steps_time_say_so_through_their_speed_traits():
    """Accumulation, the optimizer's step and compile's fusion reach the throughput prior through each
    lever's own ``speed`` hook (autotune/levers/_hooks.py: SpeedTraits); a config at its defaults has none."""
    from autotune.levers import SpeedTraits, speed_traits
    from autotune.levers.optimizer import STEP_BYTES_PER_PARAM

    assert speed_traits(TrialConfig()) == SpeedTraits(optimizer_step_bytes=STEP_BYTES_PER_PARAM["adamw_torch"])
    traits = speed_traits(TrialConfig(grad_accum=4, optim="adafactor", compile="inductor:reduce-overhead"))
    assert traits.micro_batches == 4 and traits.fuses_elementwise and traits.graphs
    assert traits.optimizer_step_bytes == STEP_BYTES_PER_PARAM["adafactor"] and traits.optimizer_kernels_per_tensor > 0
    assert not traits.optimizer_states_in_param_dtype  # Adafactor keeps fp32 states whatever the weights
    assert not speed_traits(TrialConfig(compile="aot_eager")).fuses_elementwise  # the eager ops, traced
