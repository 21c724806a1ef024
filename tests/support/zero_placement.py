"""Where DeepSpeed put each ZeRO state, read inside a trial (a ``--callback`` class, one file per rank).

Used by tests/e2e/test_zero_e2e.py and by benchmarks/bench_zero.py (its 2-rank placement figures). On
the CPU device and host are the same RAM, so what is checked is what DeepSpeed itself says: its ZeRO
optimizer class, its offload flags, the optimizer that steps the partitions (its CPU Adam under
offload) and the bytes of each partition this rank holds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from transformers import TrainerCallback


def placement_file(work_dir: str, rank: int = 0) -> Path:
    """The record rank ``rank`` of a trial writes (the ranks share the trial's output directory)."""
    return Path(work_dir, f"zero_placement.rank{rank}.json")


def _numel_bytes(tensors) -> tuple[int, int]:
    tensors = list(tensors)
    return sum(t.numel() for t in tensors), sum(t.numel() * t.element_size() for t in tensors)


class RecordZeroPlacement(TrainerCallback):
    """Writes what DeepSpeed built and where it says each state lives, once training ends."""

    def on_train_end(self, args, state, control, optimizer=None, **kwargs):
        zero = optimizer.optimizer  # accelerate's DeepSpeedOptimizerWrapper -> DeepSpeed's ZeRO optimizer
        basic = zero.optimizer  # the optimizer that steps the fp32 partitions
        states = [
            t for per_param in basic.state.values() for t in per_param.values() if hasattr(t, "numel") and t.dim() > 0
        ]
        record = {
            "zero_optimizer": type(zero).__name__,
            "basic_optimizer": type(basic).__name__,
            "world_size": int(os.environ["WORLD_SIZE"]),
            "state_bytes": _numel_bytes(states)[1],
        }
        if hasattr(zero, "fp32_partitioned_groups_flat"):  # stage 3
            record.update(
                offload_optimizer=zero.offload_optimizer,
                offload_param=zero.offload_param,
                master_bytes=_numel_bytes(zero.fp32_partitioned_groups_flat)[1],
                param_partition_bytes=_numel_bytes(zero.fp16_partitioned_groups_flat)[1],
            )
        else:  # stages 1 and 2
            numel, master = _numel_bytes(zero.single_partition_of_fp32_groups)
            record.update(
                offload_optimizer=zero.cpu_offload, offload_param=False, master_bytes=master, master_numel=numel
            )
        placement_file(args.output_dir, int(os.environ["RANK"])).write_text(json.dumps(record))


def offloaded_bytes(placed: dict) -> int:
    """The bytes a rank's record says DeepSpeed keeps in host memory under offload: the fp32 master
    partition, the optimizer's states, the fp32 gradient partition (the master's size) and at stage 3
    the 16-bit parameter partition; 0 without offload."""
    if not placed["offload_optimizer"]:
        return 0
    return (
        placed["master_bytes"] * 2
        + placed["state_bytes"]
        + placed.get("param_partition_bytes", 0) * placed["offload_param"]
    )
