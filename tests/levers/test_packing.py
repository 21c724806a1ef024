"""The levers of TRL's SFTTrainer: ``packing`` (off, padding_free, bfd; wrapped refused) and
``activation_offloading``; and the mapping of every lever under ``SFTConfig``, whose defaults differ."""

from __future__ import annotations

import dataclasses
import tempfile
import warnings

import pytest

from autotune.levers import (
    LEVERS,
    TrialConfig,
    lever_values_from_base_args,
    training_arguments_kwargs,
    with_levers_off_explicit,
)
from autotune.spec.devices import cpu_device

trl = pytest.importorskip("trl")


def sft_config(**kwargs):
    with tempfile.TemporaryDirectory() as scratch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trl.SFTConfig(output_dir=scratch, **kwargs)


@pytest.mark.parametrize(
    ("value", "written"),
    [
        ("off", {}),
        ("bfd", {"packing": True, "packing_strategy": "bfd"}),
        ("padding_free", {"padding_free": True, "max_length": None}),
    ],
)
def test_each_packing_is_one_sftconfig_and_reads_back(value, written):
    assert LEVERS["packing"].to_training_args(value) == written
    if written:
        assert lever_values_from_base_args(written) == {"packing": value}
        config = sft_config(use_cpu=True, **written)
        assert (config.packing, config.padding_free) == (value == "bfd", value == "padding_free")


def test_the_sft_levers_are_offered_under_sftTrainer_only():
    packing, offloading, padding = LEVERS["packing"], LEVERS["activation_offloading"], LEVERS["padding"]
    assert "--trainer sft" in packing.unavailable_with_trainer("bfd", "trainer")
    assert packing.unavailable_with_trainer("bfd", "sft") == ""
    assert "--trainer sft" in offloading.unavailable_with_trainer(True, "trainer")
    assert "TRL's collator batches the samples" in padding.unavailable_with_trainer("longest", "sft")
    # Activation offloading fails at SFTTrainer's start without an accelerator (ran on the CPU).
    assert "it needs CUDA" in offloading.unavailable_on(True, cpu_device())


@pytest.mark.parametrize(
    "config",
    [
        TrialConfig(),  # fp32, no checkpointing: SFTConfig would turn bf16 and checkpointing on
        TrialConfig(dtype="fp16", checkpointing=True),
        TrialConfig(dtype="bf16", packing="bfd"),
    ],
    ids=["fp32", "fp16+ckpt", "bf16+bfd"],
)
def test_a_config_means_the_same_run_under_sftconfig_as_under_trainingarguments(config):
    """The levers at their defaults write nothing (TrainingArguments' own values); under SFTConfig,
    which resolves bf16 and checkpointing on, those fields are written, so fp32 stays fp32."""
    from transformers import TrainingArguments

    kwargs = training_arguments_kwargs(config, "cpu")
    explicit = with_levers_off_explicit(kwargs, trl.SFTConfig)
    assert with_levers_off_explicit(kwargs, TrainingArguments) == kwargs
    sft = sft_config(**{k: v for k, v in explicit.items() if k != "max_length"})
    assert sft.bf16 == (config.dtype == "bf16") and sft.fp16 == (config.dtype == "fp16")
    assert sft.gradient_checkpointing == config.checkpointing == sft.activation_checkpointing
    if config == TrialConfig():
        assert explicit == {**kwargs, "bf16": False}  # the one field whose off value had to be written


def test_the_first_seed_under_sft_is_trls_default_sftconfig():
    from autotune.study._seeds import default_config

    expected = dataclasses.replace(
        TrialConfig(), checkpointing=True, dtype="bf16", optim="adamw_torch_fused", packing="off"
    )
    assert default_config("sft") == expected
    assert default_config("trainer") == dataclasses.replace(TrialConfig(), optim="adamw_torch_fused")
