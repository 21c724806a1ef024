"""One rank's model states under FSDP (the ``fsdp`` lever, CUDA only).

FSDP2 (torch.distributed.fsdp ``fully_shard``) shards every parameter on dim 0 over the ranks, and
with it its gradient and the optimizer's states (Zhao et al. 2023, arXiv:2304.11277, section 3): the
plain run's weights, gradients and optimizer states each divided by ``N``. For compute it all-gathers
a block's parameters into unsharded tensors in the compute dtype (the mixed-precision ``param_dtype``
accelerate passes from ``bf16=True``), a copy even on one rank. ``reshard_after_forward=True``
(``full_shard``) frees them after the block's forward and gathers them again in backward: at most the
running block and the one prefetched are unsharded, two blocks' parameters. ``False``
(``shard_grad_op``) keeps every block gathered from forward to backward: the whole model once more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.levers import MemoryTraits
    from autotune.spec.models import ModelSpec

# Blocks gathered at once under full_shard: the one computing and the one prefetched (FSDP2 prefetches
# the next block's all-gather by default).
GATHERED_BLOCKS_FULL_SHARD = 2


def fsdp_state_bytes(
    model: ModelSpec, traits: MemoryTraits, ranks: int, plain: tuple[int, int, int]
) -> tuple[int, int, int]:
    """(weights, gradients, optimizer states) of one of ``ranks`` ranks, from the plain run's ``plain``."""
    weights, gradients, optimizer = plain
    compute_bytes = 2 if traits.half_autocast or traits.weight_bytes == 2 else 4
    if traits.fsdp_reshards:
        gathered = compute_bytes * GATHERED_BLOCKS_FULL_SHARD * model.num_block_params // max(model.num_layers, 1)
    else:  # shard_grad_op: gathered from forward to backward
        gathered = compute_bytes * model.num_params
    return weights // ranks + gathered, gradients // ranks, optimizer // ranks
