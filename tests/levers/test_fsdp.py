"""The ``fsdp`` lever: PyTorch FSDP through the Trainer, offered on CUDA only (on the CPU accelerate
trains plain DDP under FSDP's name: docs/scale-out.md). Its GPU side runs against ``FAKE_H100``, a
``DeviceSpec`` with no device behind it: no CUDA device exists here."""

from __future__ import annotations

import dataclasses

import pytest

from autotune.estimate import MemoryFit, estimate_peak
from autotune.levers import TrialConfig, lever_values_from_base_args
from autotune.levers.fsdp import fsdp_or_zero, fsdp_training_args
from autotune.space import load_space
from autotune.units import GiB
from tests.levers.test_levers import FAKE_H100


def test_each_value_is_what_transformers_reads_and_base_args_read_back(tmp_path):
    from transformers import TrainingArguments

    for value, reshard in (("full_shard", True), ("shard_grad_op", False)):
        written = fsdp_training_args(value)
        assert lever_values_from_base_args(written) == {"fsdp": value}
        # transformers' own parsing (training_args.py _process_fsdp_args) turns it into accelerate's FSDP2 plugin
        arguments = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, **written)
        assert arguments.fsdp_plugin_args["fsdp_version"] == 2
        assert arguments.fsdp_plugin_args["reshard_after_forward"] is reshard
    assert fsdp_training_args("off") == {}
    # The legacy string form a user's --base-args may hold.
    assert lever_values_from_base_args({"fsdp": "shard_grad_op auto_wrap"}) == {"fsdp": "shard_grad_op"}
    assert lever_values_from_base_args({"fsdp": "full_shard"}) == {"fsdp": "full_shard"}


def test_the_cpu_removes_it_with_one_note_and_a_cuda_device_keeps_it(tmp_path, cpu, gpt2_tiny):
    space = tmp_path / "space.yaml"
    space.write_text('micro_batch: [4]\nfsdp: ["off", "full_shard", "shard_grad_op"]\n')
    fit = MemoryFit.prior("cpu")
    on_cpu = load_space(str(space), cpu, model=gpt2_tiny, seq_len=32, ceiling_bytes=16 * GiB, memory_fit=fit)
    assert on_cpu.choices["fsdp"] == ["off"]
    assert any("FSDP runs on CUDA only" in note for note in on_cpu.notes), on_cpu.notes
    on_gpu = load_space(
        str(space), FAKE_H100, model=gpt2_tiny, seq_len=32, ceiling_bytes=16 * GiB, memory_fit=MemoryFit.prior("cuda")
    )
    assert on_gpu.choices["fsdp"] == ["off", "full_shard", "shard_grad_op"]
    assert not any("FSDP" in note for note in on_gpu.notes)


def test_a_trial_shards_with_zero_or_fsdp_never_both():
    notes: list[str] = []
    choices = fsdp_or_zero({"zero": ["off", "2"], "fsdp": ["off", "full_shard"]}, notes, "s.yaml")
    assert choices == {"zero": ["off"], "fsdp": ["off", "full_shard"]} and "ZeRO and FSDP" in notes[0]
    notes = []
    choices = fsdp_or_zero({"zero": ["3"], "fsdp": ["off", "full_shard"]}, notes, "s.yaml")
    assert choices == {"zero": ["3"], "fsdp": ["off"]} and "fsdp full_shard removed" in notes[0]
    assert fsdp_or_zero({"fsdp": ["full_shard"]}, notes := [], "s.yaml") == {"fsdp": ["full_shard"]} and not notes


@pytest.mark.parametrize("value", ["full_shard", "shard_grad_op"])
def test_on_cuda_the_states_shard_over_the_ranks_and_the_gathered_parameters_are_counted(value, gpt2_tiny):
    """FSDP2 shards weights, gradients and optimizer states by N, and all-gathers parameters in the
    compute dtype for compute: two blocks at a time (full_shard) or the whole model (shard_grad_op)."""
    config = TrialConfig(micro_batch=4, dtype="bf16")
    one, two = (dataclasses.replace(MemoryFit.prior("cuda"), ranks=ranks) for ranks in (1, 2))
    plain = estimate_peak(gpt2_tiny, config, 64, one)
    sharded = {
        ranks: estimate_peak(gpt2_tiny, dataclasses.replace(config, fsdp=value), 64, fit)
        for ranks, fit in ((1, one), (2, two))
    }
    block = gpt2_tiny.num_block_params // gpt2_tiny.num_layers
    gathered = 2 * (2 * block if value == "full_shard" else gpt2_tiny.num_params)
    assert sharded[1].weights_bytes == plain.weights_bytes + gathered
    assert sharded[2].weights_bytes == plain.weights_bytes // 2 + gathered
    assert sharded[2].gradients_bytes == plain.gradients_bytes // 2
    assert sharded[2].optimizer_bytes == plain.optimizer_bytes // 2
    assert sharded[2].activations_bytes == plain.activations_bytes
    # On the CPU the lever does not run: the estimate does not move.
    cpu = MemoryFit.prior("cpu")
    assert (
        estimate_peak(gpt2_tiny, dataclasses.replace(config, fsdp=value), 64, cpu).parts()
        == estimate_peak(gpt2_tiny, config, 64, cpu).parts()
    )
